"""Each bench row's TPOT attributed on the engine that ran it: the model's twin (GGUF and torch),
ggml's kernels timed on a GGUF's own weights, the terms in the JSON, disturbed rows, and results
of the schema before attribution. Timings are never asserted, only what the JSON says about them."""

import importlib.util
import json
from pathlib import Path

import gguf
import pytest

from quantkit.bench.rows import disturbance, sweep_disturbed
from quantkit.core.attribution import TWIN_WIDTH
from quantkit.errors import QuantkitError
from quantkit.gguf.gguf_twin import twin_shapes, write_twin

FAST = ["--prompt-len", "12", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "0"]
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="no llama-cpp-python")


@pytest.fixture(scope="module")
def ggufs(tiny_dir, tmp_path_factory):
    """The tiny Llama (GQA) and Qwen2 (q/k/v biases) as F16 GGUFs, and the Llama as Q4_0."""
    from click.testing import CliRunner
    from fixtures import RECIPES

    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("attr-ggufs")
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}

    def run(*args):
        res = CliRunner().invoke(group, list(args), catch_exceptions=False, env=env)
        assert res.exit_code == 0, res.stderr

    out = {}
    for arch in ("llama-gqa", "qwen2"):
        out[arch] = root / f"{arch}.gguf"
        run("export", str(tiny_dir / arch), "--format", "gguf", "--out", str(out[arch]))
    art = root / "int4"
    run("convert", str(RECIPES / "int4-w4a16-rtn.yaml"), "--model", str(tiny_dir / "llama-gqa"), "--out", str(art),
        "--set", "steps[0].quantize.group_size=32")  # fmt: skip
    out["q4"] = root / "q4.gguf"
    run("export", str(art), "--format", "gguf", "--out", str(out["q4"]))
    return out


def _tensors(path):
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape.tolist())) for t in r.tensors}, r


@pytest.mark.parametrize("arch", ["llama-gqa", "qwen2"])
def test_twin_keeps_the_attention_and_cuts_the_widths(ggufs, arch, tmp_path):
    src = ggufs[arch]
    twin = write_twin(src, tmp_path)
    (orig, r0), (tw, r1) = _tensors(src), _tensors(twin)
    assert set(orig) == set(tw)
    hidden = int(r0.fields["%s.embedding_length" % arch.split("-")[0]].contents())
    for name, (_, shape) in orig.items():
        new = tw[name][1]
        assert len(new) == len(shape)
        if name.endswith(("attn_k.weight", "attn_v.weight", "attn_q.weight")):
            assert new == (TWIN_WIDTH, shape[1])  # the heads' width kept, the hidden width cut
        if name.endswith(("attn_q.bias", "attn_k.bias")):
            assert new == shape
        assert hidden not in new or hidden == shape[-1] and "token_embd" not in name or name.endswith("bias")
    a = arch.split("-")[0]
    assert r1.fields[f"{a}.embedding_length"].contents() == TWIN_WIDTH
    assert (
        r1.fields[f"{a}.attention.key_length"].contents() == hidden // r0.fields[f"{a}.attention.head_count"].contents()
    )
    assert r1.fields["tokenizer.ggml.tokens"].contents() == r0.fields["tokenizer.ggml.tokens"].contents()
    assert write_twin(src, tmp_path) == twin  # made once per source


def test_a_tensor_of_unknown_role_has_no_twin():
    with pytest.raises(QuantkitError, match="no role"):
        twin_shapes([("blk.0.ffn_gate_exps.weight", (64, 128, 8))])
    with pytest.raises(QuantkitError, match="no role"):
        twin_shapes([("blk.0.attn_q.weight", (64,))])  # a role's tensor of the wrong rank


@needs_llama_cpp
@pytest.mark.parametrize("name", ["llama-gqa", "q4"])
def test_ggml_times_every_weight_once(ggufs, name):
    """The probe's bytes are the step's weight bytes without the 1-D norms, each type apart."""
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp
    from quantkit.bench.ggml_probe import time_gguf_weights
    from quantkit.bench.gguf_file import tensor_infos, weight_read_bytes
    from quantkit.device import resolve_device
    from quantkit.gguf.read import open_reader

    path = ggufs[name]
    kt = time_gguf_weights(path, resolve_device("cpu"), 2, import_llama_cpp().llama_cpp._lib)
    infos = tensor_infos(open_reader(path))
    one_d = sum(int(t.shape[0]) * 4 for t in infos if len(t.shape) == 1)
    w = weight_read_bytes(infos)
    assert sum(k.bytes for k in kt) == w["weight_bytes_per_token"] - one_d
    assert all(k.seconds > 0 and k.flops > 0 for k in kt)
    assert {k.format.split(" ")[0] for k in kt} == {t.qtype for t in infos if len(t.shape) == 2}


def _attr_ok(row):
    a = row["attribution"]
    assert a is not None, row["attribution_missing"]
    for k in ("weights_ms", "compute_ms", "kv_ms", "overhead_ms", "kv_read_ms"):
        assert a[k] >= 0, k
    assert a["bound"] in ("bandwidth", "compute", "overhead")
    assert a["explained"] == pytest.approx(
        (a["weights_ms"] + a["compute_ms"] + a["kv_ms"] + a["overhead_ms"]) / row["tpot_ms"]
    )
    return a


@needs_llama_cpp
def test_llamacpp_rows_carry_their_attribution(cli, ggufs):
    code, out, err, res = cli("bench", "--engine", "llamacpp", str(ggufs["q4"]), *FAST, "--depth", "0,64", "--json")
    assert code == 0, err
    for row in res["rows"]:
        a = _attr_ok(row)
        assert a["fixed"]["cells"][0] < a["fixed"]["cells"][-1]
        assert "twin GGUF" in a["fixed"]["twin"] and a["kernels"]
    assert res["fit"]["overhead_ms"] is None or res["fit"]["overhead_ms"] >= 0
    code, out, err, _ = cli("bench", "--engine", "llamacpp", str(ggufs["q4"]), *FAST)
    assert code == 0, err
    assert "where TPOT goes" in out and "TPOT goes to" in out


def test_torch_rows_carry_their_attribution(cli, tiny_llama):
    code, _, err, res = cli("bench", "--engine", "eager", str(tiny_llama), *FAST, "--json")
    assert code == 0, err
    a = _attr_ok(res["rows"][0])
    assert "twin:" in a["fixed"]["twin"] and any("F.linear" in k["format"] for k in a["kernels"])


def _dist(median=10.0, p90=10.4, low=10.0, n=5):
    from quantkit.bench.row_parts import Distribution

    return Distribution(median=median, mean=median, p90=p90, p99=p90, std=0.0, min=low, n=n)


def _anchor(ratio_tpot: float):
    """llama-bench beside a row, its TPOT `ratio_tpot` times the row's."""
    from quantkit.bench.llama_bench import compare

    figures = {"tpot_ms": 10.0, "tg_tokens_per_s": 100.0, "tg_tokens": 16, "tg_depth": 32, "flash_attn": False}
    figures |= {"kv_cache": "f16/f16", "repeats": 3, "build_commit": None, "build_number": None, "cpu_info": None}
    return compare(None, 10.0 * ratio_tpot, {**figures, "backends": "CPU", "threads": 1, "command": "llama-bench"})


def _row(tpot_stats=None, steps=None, anchor=None):
    from types import SimpleNamespace

    return SimpleNamespace(
        stats=SimpleNamespace(tpot_ms=tpot_stats or _dist(), step_ms=steps or _dist(median=10, p90=11)),
        anchor=anchor,
    )


def test_disturbance_names_each_witness():
    assert disturbance(_row(), None) == ()
    assert "spread" in disturbance(_row(_dist(p90=13.0)), None)[0]
    assert "P90" in disturbance(_row(steps=_dist(median=25.6, p90=169.0)), None)[0]
    drift = {"flagged": True, "worst": "read_gbps", "change": {"read_gbps": -0.3}, "limit": 0.15}
    assert "read bandwidth moved" in disturbance(_row(), drift)[0]
    matmul = {"flagged": True, "worst": "bf16_matmul_tflops", "change": {"read_gbps": 0.05, "bf16_matmul_tflops": 1.3}}
    assert disturbance(_row(), {**matmul, "limit": 0.15}) == ()  # a matmul's drift is the prefill's, not decode's
    assert "llama-bench" in disturbance(_row(anchor=_anchor(1.7)), None)[0]
    assert disturbance(_row(anchor=_anchor(1.05)), None) == ()


def test_a_schema_4_result_is_refitted_without_a_negative_overhead():
    """A file written before attribution: its one-term fit with a negative intercept is replaced by
    the non-negative fit over its rows' bytes."""
    from quantkit.bench.bench_records import SCHEMA_VERSION, BenchResult, migrate_v2, migrate_v3

    data = migrate_v3(migrate_v2(json.loads((Path(__file__).parent / "bench_v2.json").read_text())))
    assert data["schema_version"] == 4
    data["fit"] = {**data["fit"], "overhead_ms": -9.4}
    out = BenchResult.from_json(data)
    assert out.schema_version == SCHEMA_VERSION
    assert all(v >= 0 for v in out.fit.coef.values())
    assert all(r.attribution is None and r.attribution_missing for r in out.rows)


def test_a_sweep_length_is_disturbed_as_a_row_is():
    from types import SimpleNamespace

    def point(lo, p90, n=5):
        return SimpleNamespace(prompt_len=512, ttft_ms=_dist(median=lo, p90=p90, low=lo, n=n))

    assert not sweep_disturbed(point(462.6, 520.0))
    assert sweep_disturbed(point(1678.3, 2619.0))  # another process took the cores in some prefills
    assert not sweep_disturbed(point(1678.3, 2619.0, n=1))  # one prefill has no spread to judge


def test_the_twin_decodes_at_each_depth_the_rows_read():
    from quantkit.bench.engines import engine_class
    from quantkit.bench.twin_timing import TWIN_DEEP, twin_depths

    eng = engine_class("llamacpp")
    assert twin_depths(eng, [0, 2048, 8000], 8192, 32) == (eng.min_depth, 2048, 8000)
    assert twin_depths(eng, [0], 8192, 32) == (eng.min_depth, TWIN_DEEP)
    assert twin_depths(eng, [0, 2048, 8000], 4096, 32) == (eng.min_depth, 2048, 4064)  # within the context
    assert twin_depths(eng, [0], 16, 32) is None
