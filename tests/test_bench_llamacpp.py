"""The llama.cpp bench engine: bytes per token from a GGUF's tensor types, llama.cpp's padded KV
reads checked against its own graph, the engine on GGUFs exported from the tiny fixtures (and on
artifacts exported on the fly into the cache), its self-check, bad files, a missing llama_cpp,
and `quantkit run` with two engines. Tests that run llama.cpp skip without llama-cpp-python."""

import ctypes
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from fixtures import RECIPES

from quantkit.bench import accounting
from quantkit.bench.engines.llamacpp_engine import import_llama_cpp
from quantkit.bench.gguf_file import TensorInfo, type_bytes, weight_read_bytes
from quantkit.errors import QuantkitError

FAST = ["--prompt-len", "12", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "0"]

needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (./scripts/_install.sh builds it)",
)


# ---------------------------------------------------------------- pure accounting


@pytest.mark.parametrize(
    "qtype,n,expected",
    [
        ("Q4_0", 64, 2 * 18),
        ("Q4_1", 64, 2 * 20),
        ("Q8_0", 96, 3 * 34),
        ("F16", 10, 20),
        ("BF16", 10, 20),
        ("F32", 10, 40),
    ],
)
def test_type_bytes_are_ggmls_block_sizes(qtype, n, expected):
    assert type_bytes(qtype, n) == expected


def test_partial_block_is_refused():
    with pytest.raises(QuantkitError, match="whole Q4_0 blocks"):
        type_bytes("Q4_0", 48)


def _tensors(tied: bool, linear: str) -> list[TensorInfo]:
    ts = [
        TensorInfo("token_embd.weight", "F16", (100, 64)),
        TensorInfo("output_norm.weight", "F32", (64,)),
        TensorInfo("blk.0.attn_q.weight", linear, (64, 64)),
        TensorInfo("blk.0.ffn_down.weight", linear, (64, 128)),
    ]
    return ts if tied else [*ts, TensorInfo("output.weight", "Q8_0", (100, 64))]


@pytest.mark.parametrize("linear,per32", [("Q4_0", 18), ("Q4_1", 20), ("Q8_0", 34)])
def test_weight_bytes_tied_reads_the_embedding_in_full_plus_a_row(linear, per32):
    emb, norm, lin = 100 * 64 * 2, 64 * 4, (64 * 64 + 64 * 128) // 32 * per32
    w = weight_read_bytes(_tensors(True, linear))
    assert w["tied_lm_head"] and w["stored_weight_bytes"] == emb + norm + lin
    assert w["weight_bytes_per_token"] == emb + norm + lin + 64 * 2  # the output matmul + one get_rows row
    assert w["weight_bytes_by_type"] == {"F16": emb, "F32": norm, linear: lin}


def test_weight_bytes_untied_reads_one_embedding_row_and_the_output_in_full():
    _, norm, lin, out = 100 * 64 * 2, 64 * 4, (64 * 64 + 64 * 128) // 32 * 18, 100 * 64 // 32 * 34
    w = weight_read_bytes(_tensors(False, "Q4_0"))
    assert not w["tied_lm_head"] and w["weight_bytes_per_token"] == 64 * 2 + norm + lin + out


@pytest.mark.parametrize(
    "cached,kv_size,cells",
    [
        (0, 512, 256),
        (254, 512, 256),
        (255, 512, 256),
        (256, 512, 512),
        (300, 512, 512),
        (511, 768, 512),
        (512, 768, 768),
        (10, 256, 256),
        (700, 768, 768),
    ],
)
def test_llamacpp_reads_used_cells_padded_to_256(cached, kv_size, cells):
    assert accounting.llamacpp_cells(cached, kv_size) == cells
    assert accounting.kv_llamacpp(10.0, cached, kv_size) == 10.0 * (cells + 1)


# ---------------------------------------------------------------- the recipe's engines


def test_bench_engines_in_recipes():
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import recipe_from_dict
    from quantkit.recipe.schema import Recipe

    steps = [{"quantize": {"method": "rtn"}}]
    assert recipe_from_dict({"steps": steps}).bench.engines == ("compiled",)
    r = recipe_from_dict({"steps": steps, "bench": {"engine": "eager"}})
    assert (r.bench.engine, r.bench.engines) == ("eager", ("eager",))
    r = recipe_from_dict({"steps": steps, "bench": {"engines": ["compiled", "llamacpp"]}})
    assert (r.bench.engine, r.bench.engines) == ("compiled", ("compiled", "llamacpp"))
    assert Recipe.model_validate(r.to_dict()).bench == r.bench  # a dumped recipe (both keys) loads again
    for bench, needle in [
        ({"engines": ["compiled", "llama"]}, "unknown engine 'llama'; valid: eager, compiled, vllm, llamacpp"),
        ({"engines": ["eager", "eager"]}, "each engine at most once"),
        ({"engines": []}, "at least one"),
        ({"engine": "eager", "engines": ["compiled"]}, "not the first of engines"),
    ]:
        with pytest.raises(RecipeError, match=needle):
            recipe_from_dict({"steps": steps, "bench": bench})
    from quantkit.recipe.files import load_recipe

    assert load_recipe("demo").bench.engines == ("llamacpp",)  # the quickstart benches the fastest CPU engine
    full = load_recipe("demo-full")
    assert full.bench.engines == ("compiled", "llamacpp") and full.export.formats == ("gguf",)


# ---------------------------------------------------------------- GGUFs of the tiny fixtures


@pytest.fixture(scope="module")
def ggufs(tiny_dir, tmp_path_factory):
    """Exports of the tiny fixtures: dense (F16) and RTN g32 INT4 (Q4_0), with their export records."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("llamacpp-ggufs")
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}

    def run(*args):
        res = CliRunner().invoke(group, list(args), catch_exceptions=False, env=env)
        assert res.exit_code == 0, res.stderr
        return res

    out = {}
    for arch in ("llama-gqa", "qwen2", "mistral"):
        art = root / f"{arch}-int4"
        run(
            "convert",
            str(RECIPES / "int4-w4a16-rtn.yaml"),
            "--model",
            str(tiny_dir / arch),
            "--out",
            str(art),
            "--set",
            "steps[0].quantize.group_size=32",
        )
        run("export", str(art), "--format", "gguf", "--out", str(root / f"{arch}-int4.gguf"))
        out[f"{arch}-int4"] = (art, root / f"{arch}-int4.gguf")
    run("export", str(tiny_dir / "llama-gqa"), "--format", "gguf", "--out", str(root / "llama-gqa-f16.gguf"))
    out["llama-gqa-f16"] = (tiny_dir / "llama-gqa", root / "llama-gqa-f16.gguf")
    return out


def test_bytes_per_token_of_an_exported_gguf(ggufs):
    """Hand-computed from the fixture's shapes: Q4_0 linears, F16 tied embedding, F32 norms."""
    from quantkit.bench.gguf_file import gguf_config, tensor_infos
    from quantkit.gguf.read import open_reader

    art, path = ggufs["llama-gqa-int4"]
    cfg = gguf_config(path)
    h, inter, layers, q, kv, vocab = 128, 256, 2, 4 * 32, 2 * 32, cfg["vocab_size"]
    assert (cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["tie_word_embeddings"]) == (
        h,
        2,
        32,
        True,
    )
    assert vocab == json.loads((art / "config.json").read_text())["vocab_size"]
    linear = layers * (q * h + 2 * kv * h + h * q + 3 * inter * h) // 32 * 18
    emb, norms = vocab * h * 2, (2 * layers + 1) * h * 4
    w = weight_read_bytes(tensor_infos(open_reader(path)))
    assert w["weight_bytes_by_type"] == {"Q4_0": linear, "F16": emb, "F32": norms}
    assert w["weight_bytes_per_token"] == linear + emb + norms + h * 2


# ---------------------------------------------------------------- through llama.cpp


def _bench(cli, *args):
    return cli("bench", "--engine", "llamacpp", *args, *FAST, "--json")


@needs_llama_cpp
@pytest.mark.parametrize("name", ["llama-gqa-int4", "qwen2-int4", "mistral-int4", "llama-gqa-f16"])
def test_engine_benches_exported_ggufs_and_self_checks_them(cli, ggufs, name):
    art, path = ggufs[name]
    code, _, err, res = _bench(cli, str(path))
    assert code == 0, err
    row = res["rows"][0]
    check = row["self_check"]
    assert check["status"] == "passed" and check["reference_checkpoint"] == str(art.resolve())
    assert check["mean_kl"] < 1e-3 and check["top1_agreement"] > 0.8, check  # llama.cpp's Q8_0/fp16 activation rounding
    assert row["engine"] == "llamacpp" and row["kind"] == "gguf" and row["name"] == name
    assert row["threads"] == len(os.sched_getaffinity(0)) == res["settings"]["threads"]
    assert row["ttft_ms"] > 0 and row["tpot_ms"] > 0 and len(row["stats"]["step_times_ms"][0]) == 3
    # KV: f16 K and V of every layer's KV heads, over 256 padded cells (12 + 4 tokens in a 256-cell cache),
    # plus the write
    kv = 2 * 2 * 2 * 32 * 2
    assert row["kv_bytes_per_token"] == kv and row["engine_info"]["n_ctx"] == 256
    assert row["bytes_per_token"] == row["weight_bytes_per_token"] + kv * 257


@needs_llama_cpp
def test_an_artifact_is_exported_once_into_the_cache(cli, ggufs, quantkit_home):
    art, path = ggufs["llama-gqa-int4"]
    code, _, err, res = _bench(cli, str(art))
    assert code == 0, err
    row = res["rows"][0]
    export = row["engine_info"]["gguf_export"]
    assert not export["cached"] and export["lossless"] and Path(export["gguf"]).parent == quantkit_home / "gguf"
    assert Path(export["gguf"]).read_bytes() == path.read_bytes()  # the same exact export as `quantkit export`
    assert (
        row["self_check"]["status"] == "passed"
        and row["name"] == json.loads((art / "quantkit.json").read_text())["name"]
    )
    code, _, err, res = _bench(cli, str(art))
    assert code == 0 and res["rows"][0]["engine_info"]["gguf_export"]["cached"]
    Path(export["gguf"]).write_bytes(path.read_bytes()[:-1] + b"\0")  # a damaged cached file is exported again
    code, _, err, res = _bench(cli, str(art))
    assert code == 0 and not res["rows"][0]["engine_info"]["gguf_export"]["cached"]


@needs_llama_cpp
def test_bare_gguf_says_why_there_is_no_self_check(cli, ggufs, tmp_path):
    bare = tmp_path / "bare.gguf"
    shutil.copy(ggufs["qwen2-int4"][1], bare)
    code, _, err, res = _bench(cli, str(bare))
    assert code == 0, err
    check = res["rows"][0]["self_check"]
    assert check["status"] == "skipped" and check["reason"].startswith(
        "not possible: a GGUF without quantkit's export record"
    )


@needs_llama_cpp
def test_kv_cells_read_match_llama_cpps_graph(ggufs):
    """The kq tensor llama.cpp builds per decode step spans exactly accounting.llamacpp_cells cells."""
    llama_cpp = import_llama_cpp()
    lib_dir = os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib"  # the libggml it loaded
    lib = ctypes.CDLL(str(Path(lib_dir) / "libggml-base.so"))
    lib.ggml_get_name.restype, lib.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    seen = []

    @llama_cpp.ggml_backend_sched_eval_callback
    def observe(t, ask, _):
        if lib.ggml_get_name(t) != b"kq-0":
            return not ask
        if not ask:  # ggml_tensor: int type, a buffer pointer, then int64 ne[4]
            seen.append(tuple((ctypes.c_int64 * 4).from_address(t + 16)))
        return True

    model = llama_cpp.llama_model_load_from_file(
        str(ggufs["llama-gqa-f16"][1]).encode(), llama_cpp.llama_model_default_params()
    )
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.cb_eval = 300, 300, 1, observe
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # llama-cpp-python's default, as the engine runs
    ctx = llama_cpp.llama_init_from_model(model, params)
    try:
        kv_size = llama_cpp.llama_n_ctx(ctx)
        assert kv_size == 512  # n_ctx rounded up to 256

        def decode(toks):
            arr = (llama_cpp.llama_token * len(toks))(*toks)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(toks))) == 0

        decode([5] * 250)
        for cached in range(250, 262):
            seen.clear()
            decode([7])
            assert seen and seen[-1][0] == accounting.llamacpp_cells(cached, kv_size), (cached, seen)
            assert seen[-1][1:3] == (1, 4)  # one query row, four query heads
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


@needs_llama_cpp
def test_window_logprobs_equal_the_step_by_step_ones(ggufs):
    from quantkit.bench.engines.engine import EngineSettings
    from quantkit.bench.engines.llamacpp_engine import Engine

    engine = Engine.load(ggufs["llama-gqa-f16"][1], EngineSettings(device=torch.device("cpu"), max_tokens=64))
    try:
        ids = [int(i) for i in torch.randint(0, engine.n_vocab, (40,), generator=torch.Generator().manual_seed(0))]
        window = engine.window_logprobs(ids)
        steps = engine.logprobs(ids, 1, 64)  # after ids[:1], then after each later token
        assert window.shape == (40, engine.n_vocab) and steps.shape == (40, engine.n_vocab)
        kl = (window.exp() * (window - steps)).sum(-1)
        assert float(kl.max()) < 1e-4 and bool((window.argmax(-1) == steps.argmax(-1)).all())
        with pytest.raises(QuantkitError, match="does not fit"):
            engine.window_logprobs(ids * 8)
    finally:
        engine.close()


@needs_llama_cpp
def test_the_engine_decodes_on_one_persistent_threadpool_as_llama_cpps_tools(ggufs):
    """bench/ggml_threadpool.py: a pool of n threads is made once and attached; the logits are those
    of llama-cpp-python's per-graph pool; close detaches and frees it, once."""
    from quantkit.bench.engines.engine import EngineSettings
    from quantkit.bench.engines.llamacpp_engine import Engine, _open

    gguf = ggufs["llama-gqa-int4"][1]
    settings = EngineSettings(device=torch.device("cpu"), max_tokens=64, threads=2)
    ids = [int(i) for i in torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(0))]
    plain = _open(gguf, settings, 2)  # no pool attached: ggml makes one per graph
    try:
        plain.eval(ids[:8])
        for t in ids[8:]:
            plain.eval([t])
        import numpy as np

        llama_cpp = import_llama_cpp()
        want = np.ctypeslib.as_array(llama_cpp.llama_get_logits(plain.ctx), shape=(plain.n_vocab(),)).copy()
    finally:
        plain.close()
    engine = Engine.load(gguf, settings)
    try:
        assert engine.pool is not None and engine.pool.threads == 2
        assert engine.describe()["threadpool"].startswith("persistent, 2 threads, poll 50")
        engine.reset(64)
        engine.prefill(ids[:8])
        for pos, t in enumerate(ids[8:], 8):
            engine.decode(t, pos)
        got = engine._last_logits().copy()
        assert abs(got - want).max() < 1e-4 * max(1.0, abs(want).max())
    finally:
        engine.close()
    assert engine.pool is None
    engine.close()  # twice: nothing left to free


def test_a_llama_cpp_without_the_threadpool_calls_keeps_its_own():
    """Another libllama lacking a symbol: no pool, no error (the description says which ran)."""
    from types import SimpleNamespace

    from quantkit.bench import ggml_threadpool

    fake = SimpleNamespace(llama_cpp=SimpleNamespace(_lib=SimpleNamespace()))
    assert ggml_threadpool.attach(fake, None, 2) is None


# ---------------------------------------------------------------- bad input


@needs_llama_cpp
def test_not_a_gguf_or_truncated_is_one_line_exit_2(cli, ggufs, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    short = tmp_path / "short.gguf"
    short.write_bytes(ggufs["llama-gqa-int4"][1].read_bytes()[:20000])
    header = tmp_path / "header.gguf"
    header.write_bytes(ggufs["llama-gqa-int4"][1].read_bytes()[:40])
    for path, needle in [(junk, "not a GGUF file"), (short, "truncated"), (header, "GGUF")]:
        code, out, err, _ = _bench(cli, str(path))
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    code, _, err, _ = cli("bench", "--engine", "eager", str(ggufs["llama-gqa-int4"][1]), *FAST)
    assert code == 2 and "--engine llamacpp" in err


def test_missing_llama_cpp_is_one_line_exit_2(cli, tiny_llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    code, out, err, _ = cli("bench", "--engine", "llamacpp", str(tiny_llama), *FAST)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (
        "llama-cpp-python is not installed" in err
        and "./scripts/_install.sh" in err
        and "pip install llama-cpp-python" in err
    )


def test_a_gpu_needs_a_llama_cpp_built_for_one(monkeypatch):
    import quantkit.bench.engines.llamacpp_engine as lc
    from quantkit.bench.bench_settings import BenchSettings

    fake = type(sys)("llama_cpp")
    fake.llama_supports_gpu_offload = lambda: False
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    with pytest.raises(QuantkitError, match="this llama-cpp-python build is CPU-only"):
        lc.check_available(torch.device("cuda"))
    lc.check_available(torch.device("cpu"))
    s = BenchSettings(device="auto", engine="llamacpp")  # auto: the CPU for a CPU-only build, even beside a GPU
    assert s.device.type == "cpu" and s.threads == len(os.sched_getaffinity(0))


def test_a_synthetic_shape_is_refused_with_the_way_to_bench_one(cli, monkeypatch):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    code, _, err, _ = cli("bench", "--engine", "llamacpp", "--shape", "smollm2-135m", *FAST)
    assert code == 2 and "benchmarks/shaped_checkpoint.py" in err


# ---------------------------------------------------------------- quantkit run with two engines


def _suite(tmp_path: Path, engines: str, export: bool = True) -> Path:
    p = tmp_path / "two-engines.yaml"
    p.write_text(
        "variants:\n  - name: int4\n    steps:\n      - quantize: {method: rtn, group_size: 32}\n"
        f"bench: {{engines: {engines}, prompt_len: 12, gen_len: 4, repeats: 1, min_seconds: 0}}\n"
        + ("export: {formats: [gguf]}\n" if export else "")
    )
    return p


@needs_llama_cpp
def test_run_with_two_engines_has_a_row_and_a_fit_per_engine(cli, tiny_llama, tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        str(_suite(tmp_path, "[eager, llamacpp]")),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--skip-eval",
        "--json",
    ]
    code, _, err, rep = cli(*args)
    assert code == 0, err
    assert [(r["name"], r["engine"]) for r in rep["rows"]] == [
        ("baseline", "eager"),
        ("baseline", "llamacpp"),
        ("int4", "eager"),
        ("int4", "llamacpp"),
    ]
    assert all(r["status"] == "ok" and r["tpot_ms"] > 0 for r in rep["rows"])
    assert set(rep["engines"]) == {"eager", "llamacpp"}
    for engine, e in rep["engines"].items():  # a disturbed row is kept out of its engine's fit
        kept = sum(not r.get("disturbed") for r in rep["rows"] if r["engine"] == engine)
        assert e["fit"]["points"] == kept and e["device"]["bandwidth_gbps"] > 0
    for name in ("baseline", "int4"):  # llama.cpp benched the run's own GGUF, self-checked against the artifact
        lc = rep["variants"][name]["benches"]["llamacpp"]
        assert Path(lc["model"]) == (out / "gguf" / f"{name}.gguf").resolve() and lc["self_check"]["status"] == "passed"
        assert rep["fastest"][name]["tpot"] in ("eager", "llamacpp")
    assert rep["variants"]["int4"]["exports"]["gguf"]["lossless"] and (out / "gguf" / "int4.quantkit.json").is_file()
    md = (out / "report.md").read_text()
    assert (
        "| variant | engine | size MB |" in md and "Rule check per engine" in md and "Fastest engine per variant" in md
    )
    assert "- **llamacpp** (" in md and "- **eager** (" in md and (out / "plots" / "rule_check.png").is_file()
    code, _, err, rep2 = cli(*args)  # a second run reuses the GGUFs and both benches
    assert (
        code == 0
        and "export gguf: reusing" in err
        and "bench (llamacpp): reusing" in err
        and "bench (eager): reusing" in err
    )
    assert rep2["rows"][1]["tpot_ms"] == rep["rows"][1]["tpot_ms"]


def test_run_without_llama_cpp_reports_it_and_keeps_the_other_engine(cli, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    out = tmp_path / "run"
    code, _, err, rep = cli(
        "run",
        str(_suite(tmp_path, "[eager, llamacpp]", export=False)),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--skip-eval",
        "--json",
    )
    assert code == 0, err
    assert [(r["name"], r["engine"]) for r in rep["rows"]] == [("baseline", "eager"), ("int4", "eager")]
    assert "llama-cpp-python is not installed" in rep["engines"]["llamacpp"]["error"]
    assert (
        "- **llamacpp**: not benchmarked: --engine llamacpp: llama-cpp-python is not installed"
        in (out / "report.md").read_text()
    )
    # a run whose only engine cannot run fails its variants, as before
    code, _, err, _ = cli(
        "run",
        str(_suite(tmp_path, "[llamacpp]", export=False)),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "run2"),
        "--skip-eval",
    )
    assert code == 1 and "llama-cpp-python is not installed" in err
