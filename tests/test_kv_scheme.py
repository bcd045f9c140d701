"""A KV-quantized artifact end to end on the tiny fixtures (models/kv_scheme.py and its users): the
built-in recipes convert and pass the reload check with the FP8 rounding on both sides; transformers'
load rounds the cached K (after RoPE) and V to FP8 with the checkpoint's scales, exactly as a cache
that does it by hand; eval scores with that rounding (--kv-cache f16 switches it off) and llama.cpp
scores the exact GGUF with its own cache types; llama.cpp itself refuses a quantized V cache without
flash attention; bench counts each cache type's bytes, and the torch engines say they keep 16 bits."""

import json
from pathlib import Path

import pytest
import torch
from installed import needs_llama_cpp

SMALL = ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64"]
FAST = ["--prompt-len", "12", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "0"]
EVAL = ["--seq-len", "64", "--max-tokens", "256", "--position-buckets", "16,32", "--json"]
E4M3_MAX = 448.0


@pytest.fixture(scope="module")
def kv_arts(tiny_llama, tiny_text, tmp_path_factory):
    """name -> (artifact, convert's JSON): the two built-in KV recipes, and the INT4 one with per-head scales."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    root, out = tmp_path_factory.mktemp("kv"), {}
    runs = {
        "int4-kv": ("int4-w4a16-gptq-g64-kv-fp8", []),
        "int4-kv-head": ("int4-w4a16-gptq-g64-kv-fp8", ["--set", "steps[0].quantize.kv_cache.fp8=head"]),
        "gqa-int4-kv": ("gqa-int4-kv-fp8", ["--set", "steps[0].gqa.recover=null"]),
    }
    for name, (recipe, sets) in runs.items():
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QUANTKIT_HOME", str(root / "home"))
            res = CliRunner().invoke(
                group,
                ["convert", recipe, "--model", str(tiny_llama), "--out", str(root / name)]
                + ["--calib", f"file:{tiny_text}", *SMALL, *sets, "--json"],
                catch_exceptions=False,
            )
        assert res.exit_code == 0, res.stderr
        out[name] = (root / name, json.loads(res.stdout))
    return out


def _tensors(art: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(art.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize(
    "name, strategy, kv_heads",
    [("int4-kv", "tensor", 2), ("int4-kv-head", "attn_head", 2), ("gqa-int4-kv", "tensor", 1)],
)
def test_the_built_in_kv_recipes_convert_and_pass_the_reload_check(kv_arts, name, strategy, kv_heads):
    art, meta = kv_arts[name]
    assert meta["verification"]["status"] == "passed" and meta["verification"]["mean_kl"] == 0.0
    cfg = json.loads((art / "config.json").read_text())
    kv = cfg["quantization_config"]["kv_cache_scheme"]
    assert (kv["type"], kv["num_bits"], kv["strategy"], kv["symmetric"], kv["dynamic"]) == (
        "float",
        8,
        strategy,
        True,
        False,
    )
    assert cfg["num_key_value_heads"] == kv_heads
    assert meta["quantization"]["kv_cache"] == {
        "format": "fp8_e4m3",
        "strategy": strategy,
        "symmetric": True,
        "bits": 8,
    }
    t = _tensors(art)
    for layer in range(cfg["num_hidden_layers"]):
        for kind in ("k", "v"):
            scale = t[f"model.layers.{layer}.self_attn.{kind}_scale"]
            assert scale.numel() == (kv_heads if strategy == "attn_head" else 1) and bool((scale > 0).all())
    meta_file = json.loads((art / "quantkit.json").read_text())
    assert meta_file["recipe"]["steps"][-1]["quantize"]["kv_cache"]["llamacpp"] == "q8_0"


class _RoundedCache:
    """By hand: a DynamicCache that rounds what it stores as an FP8 E4M3 cache with per-layer scales
    does (x / s, clamped to ±448, rounded to E4M3, times s), K after RoPE."""

    def __new__(cls, scales: dict):
        from transformers import DynamicCache

        class Rounded(DynamicCache):
            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                k, v = scales[layer_idx]
                return super().update(_fp8(key_states, k), _fp8(value_states, v), layer_idx, *args, **kwargs)

        return Rounded()


def _fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    s = scale.to(x.dtype).reshape(1, -1, 1, 1) if scale.numel() > 1 else scale.to(x.dtype)
    return (x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype) * s


@pytest.mark.parametrize("name", ["int4-kv", "int4-kv-head"])
def test_transformers_rounds_the_cached_k_and_v_as_the_scheme_says(kv_arts, name):
    from quantkit.models import kv_scheme
    from quantkit.models.checkpoint import load_model

    art, _ = kv_arts[name]
    model = load_model(art, dtype="float32", device=torch.device("cpu"))
    layers = model.config.num_hidden_layers
    assert len(kv_scheme.rounding_modules(model)) == layers
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        rounded = model(ids, use_cache=False).logits
        assert kv_scheme.set_rounding(model, False) == layers
        plain = model(ids, use_cache=False).logits
        attn = [model.model.layers[i].self_attn for i in range(layers)]
        by_hand = model(
            ids, past_key_values=_RoundedCache({i: (a.k_scale, a.v_scale) for i, a in enumerate(attn)})
        ).logits
    assert (
        rounded - plain
    ).abs().max() > 1e-4  # the rounding is on by default: the reload check compared rounded models
    torch.testing.assert_close(rounded, by_hand, rtol=0, atol=1e-5)


def test_eval_scores_the_artifact_with_its_cache_rounded_and_f16_switches_it_off(cli, kv_arts, tiny_llama, tiny_text):
    art, _ = kv_arts["int4-kv"]
    base = ["eval", str(art), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", *EVAL]
    code, _, err, on = cli(*base)
    assert code == 0, err
    code, _, err, off = cli(*base, "--kv-cache", "f16")
    assert code == 0, err
    assert (
        on["scorer"]["kv_cache_type"] == "fp8_e4m3 K/V, per-tensor scales"
        and off["scorer"]["kv_cache_type"] == "16-bit"
    )
    assert on["kld"]["mean"] != off["kld"]["mean"] and [b["lo"] for b in on["positions"]] == [0, 16, 32]
    for args, needle in (
        (["--kv-cache", "q8_0"], "--engine transformers scores with its own KV cache (it takes f16)"),
        (["--flash-attn", "on"], "--engine transformers has no flash-attention setting"),
    ):
        code, _, err, _ = cli(*base, *args)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


@needs_llama_cpp
def test_llama_cpp_scores_the_exact_gguf_with_its_own_cache_types(cli, kv_arts, tiny_llama, tiny_text):
    art, _ = kv_arts["int4-kv"]
    base = ["eval", str(art), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--engine", "llamacpp"]
    got = {}
    for cache in ("f16", "q8_0", "q4_0"):
        code, _, err, got[cache] = cli(*base, *EVAL, "--kv-cache", cache, "--flash-attn", "on")
        assert code == 0, err
        assert got[cache]["scorer"]["kv_cache_type"] == cache and got[cache]["scorer"]["flash_attn"] is True
    code, _, err, default = cli(*base, *EVAL)
    assert code == 0 and default["scorer"]["kv_cache_type"] == "f16" and default["scorer"]["flash_attn"] is False
    assert got["q4_0"]["kld"]["mean"] != got["f16"]["kld"]["mean"] and got["q8_0"]["kld"]["mean"] < 1
    code, _, err, _ = cli(*base, *EVAL, "--kv-cache", "q8_0", "--flash-attn", "off")
    assert code == 2 and "a q8_0 V cache runs in llama.cpp only with flash attention" in err, err


@needs_llama_cpp
def test_llama_cpp_itself_refuses_a_quantized_v_cache_without_flash_attention(cli, kv_arts, tmp_path):
    """What the one-line refusal stands for: llama.cpp will not make the context (a K cache alone may be quantized)."""
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp
    from quantkit.core.kv_cache import LLAMACPP_TYPES

    art, _ = kv_arts["int4-kv"]
    code, _, err, rec = cli("export", str(art), "--format", "gguf", "--out", str(tmp_path / "m.gguf"), "--json")
    assert code == 0, err
    assert any("FP8 K/V scales (kv_cache_scheme) are not in the GGUF" in n for n in rec["notes"]) and rec["lossless"]
    llama_cpp, q8 = import_llama_cpp(), LLAMACPP_TYPES["q8_0"].ggml_id

    def context(type_k, type_v, flash_attn):
        llm = llama_cpp.Llama(
            model_path=str(tmp_path / "m.gguf"),
            n_ctx=256,
            type_k=type_k,
            type_v=type_v,
            flash_attn=flash_attn,
            verbose=False,
        )
        llm.close()

    context(q8, 1, False)
    context(q8, q8, True)
    with pytest.raises(ValueError, match="Failed to create llama_context"):
        context(1, q8, False)


@needs_llama_cpp
def test_bench_counts_each_cache_types_bytes_and_names_it(cli, kv_arts):
    art, _ = kv_arts["int4-kv"]
    code, _, err, res = cli(
        "bench", str(art), "--engine", "llamacpp", *FAST, "--kv-cache", "f16,q8_0/f16,q4_0", "--json"
    )
    assert code == 0, err
    cells = 2 * 2 * 32  # layers x KV heads x head dim: values per token of K, and of V
    want = {"f16": cells * 4, "q8_0/f16": cells * (34 / 32 + 2), "q4_0": cells * 2 * 18 / 32}
    got = {r["kv_cache"]: (r["kv_bytes_per_token"], r["flash_attn"]) for r in res["rows"]}
    assert got == {"f16": (want["f16"], False), "q8_0/f16": (want["q8_0/f16"], False), "q4_0": (want["q4_0"], True)}
    assert all(r["self_check"]["passed"] for r in res["rows"])


def test_a_torch_engine_times_its_own_16_bit_cache_and_says_so(cli, kv_arts):
    art, _ = kv_arts["int4-kv"]
    code, _, err, res = cli("bench", str(art), "--engine", "eager", "--dtype", "bfloat16", *FAST, "--json")
    assert code == 0, err
    (row,) = res["rows"]
    assert row["kv_cache"] == "bfloat16" and row["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 2
    assert any("FP8 K/V scales (kv_cache_scheme) are not applied" in n for n in row["notes"])
    # its self-check compares the weights' arithmetic: the reference's rounding is off, as the engine's cache
    assert row["self_check"]["reference_kv_cache"] == "FP8 K/V rounding off" and row["self_check"]["passed"]


def _with_scales(tiny_llama: Path, out: Path, strategy: str = "tensor", edit=None) -> Path:
    """The tiny Llama declaring an FP8 KV cache scheme, with a k_scale and v_scale per layer (as
    llm-compressor saves them); `edit(tensors)` damages them."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_llama, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {},
        "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": strategy, "symmetric": True, "dynamic": False},
    }
    (out / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(out / "model.safetensors"))
    per = cfg["num_key_value_heads"] if strategy == "attn_head" else 1
    for layer in range(cfg["num_hidden_layers"]):
        for kind in ("k", "v"):
            t[f"model.layers.{layer}.self_attn.{kind}_scale"] = torch.full((per,), 0.02, dtype=torch.float32)
    if edit:
        edit(t)
    save_file(t, str(out / "model.safetensors"))
    return out


def _set(name, value):
    return lambda t: t.__setitem__(name, value)


K0 = "model.layers.0.self_attn.k_scale"
SCALE_DAMAGES = {
    "a zero scale": (_set(K0, torch.tensor([0.0])), "a scale of 0"),
    "a negative scale": (_set(K0, torch.tensor([-1.0])), "a scale of -1"),
    "a scale of 60,000": (_set(K0, torch.tensor([60000.0])), "a scale of 60000"),
    "a NaN scale": (_set(K0, torch.tensor([float("nan")])), "a scale of nan"),
    "an infinite scale": (_set(K0, torch.tensor([float("inf")])), "a scale of inf"),
    "a vanishing scale": (_set(K0, torch.tensor([1e-30])), "a scale of 1e-30"),
    "two values per tensor": (_set(K0, torch.tensor([0.02, 0.02])), "shape [2], 2 values; a per-tensor scale holds 1"),
    "an integer scale": (_set(K0, torch.tensor([1], dtype=torch.int32)), "a scale of dtype I32"),
    "a missing v_scale": (lambda t: t.pop("model.layers.1.self_attn.v_scale"), "1 v_scale tensors for 2 layers"),
}


@pytest.mark.parametrize("damage", SCALE_DAMAGES, ids=list(SCALE_DAMAGES))
def test_kv_scales_are_checked_where_the_artifact_is_read(cli, tiny_llama, tiny_text, tmp_path, damage):
    """A scale of the wrong shape, dtype or value is one line where the checkpoint is read (exit 2),
    never a RuntimeError at eval nor a KL computed with a scale of 0 or 60,000."""
    edit, says = SCALE_DAMAGES[damage]
    art = _with_scales(tiny_llama, tmp_path / "art", edit=edit)
    code, _, err, _ = cli(
        "eval", str(art), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--seq-len", "32",
        "--max-tokens", "64", "--baseline-mismatch-ok",
    )  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0] and "k_scale" in err + "v_scale", err


def test_per_head_scales_hold_one_value_per_kv_head(tiny_llama, tmp_path):
    from quantkit.errors import ModelError
    from quantkit.models.checkpoint import check_checkpoint

    check_checkpoint(_with_scales(tiny_llama, tmp_path / "good", "attn_head"))
    check_checkpoint(_with_scales(tiny_llama, tmp_path / "tensor", "tensor"))
    one = _with_scales(tiny_llama, tmp_path / "one", "attn_head", _set(K0, torch.tensor([0.02])))
    with pytest.raises(ModelError, match="a per-head scale holds one per KV head, 2"):
        check_checkpoint(one)
