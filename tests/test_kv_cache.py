"""The KV cache's element types (core/kv_cache.py): llama.cpp's cache types with ggml's ids and
block sizes, the K/V spec `--kv-cache` takes, the flash-attention rule for a quantized V cache, the
KV bytes per token at each type's bytes, and the recipe key `kv_cache:` checked where it is read;
the settings of bench and eval that carry them, refused in one line where no engine runs them."""

import pytest

from quantkit.bench.bench_records import options_json
from quantkit.bench.bench_settings import BenchSettings, check_settings
from quantkit.core.kv_cache import LLAMACPP_TYPES, KvCacheConfig, LlamaCache, parse_llama_cache, parse_llama_caches
from quantkit.core.roofline import Shape, kv_bytes, kv_bytes_per_token
from quantkit.errors import QuantkitError, RecipeError
from quantkit.evals.eval_settings import EvalSettings
from quantkit.recipe.files import recipe_from_dict

# SmolLM2-135M, the demo: 30 layers, 9 query / 3 KV heads of 64
DEMO = Shape(vocab=49152, hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64, tied=True)


def test_cache_types_are_ggmls_ids_and_block_sizes():
    import gguf

    for name, t in LLAMACPP_TYPES.items():
        qtype = gguf.GGMLQuantizationType[name.upper()]
        assert t.ggml_id == int(qtype), name
        assert (t.block, t.block_bytes) == gguf.GGML_QUANT_SIZES[qtype], name
    assert LLAMACPP_TYPES["q8_0"].bytes_per_value == 34 / 32 and LLAMACPP_TYPES["q4_0"].bytes_per_value == 18 / 32
    assert not LLAMACPP_TYPES["f16"].quantized and LLAMACPP_TYPES["iq4_nl"].quantized


def test_a_spec_is_one_type_for_k_and_v_or_k_slash_v():
    assert parse_llama_cache("q8_0") == LlamaCache("q8_0", "q8_0")
    assert parse_llama_cache("Q4_0/F16") == LlamaCache("q4_0", "f16") and LlamaCache("q4_0", "f16").label == "q4_0/f16"
    assert parse_llama_caches("f16,q8_0,q4_0") == (LlamaCache(), LlamaCache("q8_0", "q8_0"), LlamaCache("q4_0", "q4_0"))
    for bad, needle in (("q9_0", "not a llama.cpp cache type; valid: f32, f16"), ("q8_0/f16/f16", "K/V")):
        with pytest.raises(QuantkitError, match=needle) as info:
            parse_llama_cache(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(QuantkitError, match="each cache once"):
        parse_llama_caches("q8_0,q8_0/q8_0")


def test_a_quantized_v_cache_runs_only_with_flash_attention():
    k_only, v_too = LlamaCache("q8_0", "f16"), LlamaCache("q4_0", "q4_0")
    assert not k_only.needs_flash_attn and v_too.needs_flash_attn
    assert v_too.flash_attn(None) is True and k_only.flash_attn(None) is None and v_too.flash_attn(True) is True
    k_only.check_flash_attn(False, "here")  # llama.cpp runs a quantized K alone without it
    with pytest.raises(QuantkitError, match="a q4_0 V cache runs in llama.cpp only with flash attention") as info:
        v_too.check_flash_attn(False, "--kv-cache q4_0 --flash-attn off")
    assert str(info.value).startswith("--kv-cache q4_0 --flash-attn off: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("head", [20, 24, 40, 48, 80, 96])
@pytest.mark.parametrize("name", [n for n, t in LLAMACPP_TYPES.items() if t.quantized])
@pytest.mark.parametrize("flash_attn", [None, False, True])
def test_a_quantized_cache_holds_whole_blocks_of_each_head(head, name, flash_attn):
    """llama-context.cpp refuses a K (V) type whose block does not divide the head with flash
    attention; without it ggml aborts on the K cache's view of each head (GGML_ASSERT view_src)."""
    block = LLAMACPP_TYPES[name].block
    for cache, part in ((LlamaCache(name, "f16"), "K"), (LlamaCache("f16", name), "V")):
        if part == "V" and flash_attn is False:
            with pytest.raises(QuantkitError, match="only with flash attention"):
                cache.check_heads(head, head, flash_attn, "here")
            continue
        if head % block == 0:
            cache.check_heads(head, head, flash_attn, "here")
            continue
        with pytest.raises(QuantkitError) as info:
            cache.check_heads(head, head, flash_attn, "m.gguf: --kv-cache x")
        line = str(info.value)
        assert line.startswith("m.gguf: --kv-cache x: ") and "\n" not in line
        assert f"a {name} {part} cache holds whole blocks of {block} values" in line and f"heads hold {head}" in line
    for name16 in ("f16", "bf16", "f32"):
        LlamaCache(name16, name16).check_heads(head, head, flash_attn, "here")  # no blocks: any head


def test_k_and_v_heads_are_checked_apart():
    LlamaCache("q8_0", "f16").check_heads(64, 24, True, "here")  # a V head of 24 in f16: fine
    with pytest.raises(QuantkitError, match="q8_0 V cache"):
        LlamaCache("f16", "q8_0").check_heads(64, 24, True, "here")


def test_kv_bytes_per_token_at_each_cache_types_bytes():
    assert kv_bytes_per_token(DEMO) == 23_040  # 2 x 30 x 3 x 64 x 2 bytes: the demo's f16 cache
    q8, q4 = LLAMACPP_TYPES["q8_0"].bytes_per_value, LLAMACPP_TYPES["q4_0"].bytes_per_value
    assert kv_bytes(30, 3, 64, q8) == 12_240 and kv_bytes(30, 3, 64, q4) == 6_480
    assert kv_bytes(30, 3, 64, 1) == 11_520  # FP8 E4M3: its scales are per tensor or head, not per token
    assert kv_bytes(30, 3, 64, q8, 2) == (12_240 + 23_040) / 2  # K in q8_0, V in f16
    assert kv_bytes(30, 1, 64, q8) == 4_080  # GQA to one KV head, then q8_0
    assert kv_bytes_per_token(DEMO) * 8192 / 1e6 == pytest.approx(188.7, abs=0.1)  # the cache at 8k: 189 MB


def _recipe(kv: dict, method: str = "gptq", **extra):
    return recipe_from_dict({"steps": [{"quantize": {"method": method, "kv_cache": kv, **extra}}]}, "r.yaml")


def test_the_recipe_key_reads_and_dumps():
    step = _recipe({"fp8": "head", "llamacpp": "Q8_0"}).steps[0].quantize
    assert step.kv_cache == KvCacheConfig(fp8="head", llamacpp="q8_0") and step.kv_cache.strategy == "attn_head"
    assert step.kv_cache.llama_cache == LlamaCache("q8_0", "q8_0")
    assert step.model_dump(mode="json")["kv_cache"] == {"fp8": "head", "llamacpp": "q8_0"}
    assert _recipe({"llamacpp": "q4_0/f16"}, "rtn").steps[0].quantize.kv_cache.fp8 is None  # no calibration needed


@pytest.mark.parametrize(
    "kv, method, needle",
    [
        ({"fp8": "tensor"}, "rtn", "kv_cache.fp8: the K/V scales are calibrated on the calibration windows"),
        ({}, "gptq", "give fp8: tensor | head"),
        ({"llamacpp": "q3_k"}, "gptq", "'q3_k' is not a llama.cpp cache type"),
        ({"fp8": "channel"}, "gptq", "kv_cache.fp8"),
        ({"fp8": "tensor"}, "bnb-nf4", "kv_cache: unknown key"),
    ],
)
def test_the_recipe_key_is_checked_where_it_is_read(kv, method, needle):
    with pytest.raises(RecipeError, match=needle) as info:
        _recipe(kv, method)
    assert "\n" not in str(info.value)


def test_built_in_kv_recipes_name_their_caches():
    from quantkit.recipe.files import load_recipe
    from quantkit.resources import recipes_dir

    for name, kinds in (("int4-w4a16-gptq-g64-kv-fp8", ["quantize"]), ("gqa-int4-kv-fp8", ["gqa", "quantize"])):
        r = load_recipe(recipes_dir() / f"{name}.yaml")
        (v,) = r.all_variants()
        assert [s.kind for s in v.steps] == kinds and v.kv_cache == KvCacheConfig(fp8="tensor", llamacpp="q8_0")


def test_bench_takes_cache_types_where_the_engine_has_them():
    s = BenchSettings(device="cpu", engine="llamacpp", kv_caches=("F16", "q8_0", "q4_0/f16"))
    assert s.kv_caches == ("f16", "q8_0", "q4_0/f16") and s.kv_cache_runs[1] == LlamaCache("q8_0", "q8_0")
    assert BenchSettings(device="cpu", engine="llamacpp").kv_cache_runs == (None,)
    assert options_json(s)["kv_caches"] == ["f16", "q8_0", "q4_0/f16"]
    refused = [
        (dict(engine="compiled", kv_caches=("q8_0",)), "the compiled engine holds its KV cache at its own type"),
        (dict(engine="llamacpp", kv_caches=("q8_0",), flash_attn="off"), "a q8_0 V cache runs in llama.cpp only"),
        (dict(engine="llamacpp", kv_caches=("f16", "q4_0"), flash_attn="both"), "--flash-attn both"),
    ]
    for kw, needle in refused:
        settings = BenchSettings(device="cpu", **kw)
        with pytest.raises(QuantkitError, match=needle):
            check_settings(settings)
    with pytest.raises(QuantkitError, match="'q7' is not a llama.cpp cache type"):
        BenchSettings(device="cpu", engine="llamacpp", kv_caches=("q7",))


def test_bench_recipe_settings_carry_depths_and_flash_attention_to_the_engine_that_has_it():
    r = recipe_from_dict(
        {"steps": [{"quantize": {"method": "rtn"}}], "bench": {"depths": [0, 4096], "flash_attn": True}}, "r.yaml"
    )
    assert r.bench.flash_attn == "on"  # YAML reads a bare `on` as true
    llama = BenchSettings.from_recipe(r.bench, "llamacpp")
    torch_engine = BenchSettings.from_recipe(r.bench, "compiled")
    assert llama.depths == torch_engine.depths == (0, 4096)
    assert (llama.flash_attn, torch_engine.flash_attn) == ("on", "default")
    for bench, needle in (({"depths": [0, 0]}, "each depth at most once"), ({"depths": [-1]}, "depths")):
        with pytest.raises(RecipeError, match=needle):
            recipe_from_dict({"steps": [{"quantize": {"method": "rtn"}}], "bench": bench}, "r.yaml")


def test_eval_settings_hold_the_cache_as_its_spec():
    assert EvalSettings(kv_cache="Q8_0/F16").kv_cache == "q8_0/f16" and EvalSettings().kv_cache is None
    from quantkit.cli._options import settings_from_cli

    assert settings_from_cli(EvalSettings, {"kv_cache": "q4_0", "flash_attn": "on"}).flash_attn is True
    with pytest.raises(QuantkitError, match="not a llama.cpp cache type"):
        EvalSettings(kv_cache="fp8")


def test_the_roofline_predicts_at_a_cache_types_bytes(cli):
    rows = {}
    for kv in ("f16", "fp8", "q4_0"):
        code, _, err, out = cli(
            "roofline", "--shape", "smollm2-135m", "--device", "h200", "--bits", "4", "--context", "8192",
            "--kv-cache", kv, "--json",
        )  # fmt: skip
        assert code == 0, err
        rows[kv] = out["rows"][0]
    assert rows["f16"]["kv_bytes_per_token"] == 23_040 and rows["fp8"]["kv_bytes_per_token"] == 11_520
    assert rows["q4_0"]["kv_bytes_per_token"] == 6_480
    saved = rows["f16"]["bytes_per_token"] - rows["fp8"]["bytes_per_token"]
    assert saved == pytest.approx(11_520 * 8193)  # the cache of 8,192 tokens and the new one, at half the bytes
    code, _, err, _ = cli("roofline", "--shape", "smollm2-135m", "--kv-cache", "fp9")
    assert code == 2 and "'fp9' is not a llama.cpp cache type" in err and err.strip().endswith("or fp8")
