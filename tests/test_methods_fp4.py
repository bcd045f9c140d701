"""FP4 through llm-compressor (methods/llmc.py fp4: compressed-tensors' NVFP4A16 and MXFP4A16
presets): the two built-in recipes convert the tiny fixture without calibration, the artifact
reloads in transformers as exactly the model that was converted (models/fp4_load_fix.py) and means
what the format says (codes times block scales, decoded here without compressed-tensors), its
sizes read the format's bits per weight, eval runs on it, and a layer whose columns the block does
not divide is refused before loading."""

import json
from pathlib import Path

import pytest
import torch

from quantkit.models import scheme_facts
from quantkit.models.sizes import checkpoint_sizes

FORMATS = {"nvfp4": "nvfp4-w4a16", "mxfp4": "mxfp4-w4a16"}
BLOCK = {"nvfp4": 16, "mxfp4": 32}
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # OCP MX spec, FP4 E2M1's magnitudes by code


@pytest.fixture(scope="module")
def fp4_arts(tiny_llama, tmp_path_factory):
    """format -> the tiny Llama (float16) converted with that built-in FP4 recipe, and its quantkit.json."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    root, arts = tmp_path_factory.mktemp("fp4"), {}
    for fmt, recipe in FORMATS.items():
        out = root / fmt
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QUANTKIT_HOME", str(root / "home"))
            res = CliRunner().invoke(
                group,
                ["convert", recipe, "--model", str(tiny_llama), "--out", str(out), "--json"],
                catch_exceptions=False,
            )
        assert res.exit_code == 0, res.stderr
        arts[fmt] = (out, json.loads(res.stdout))
    return arts


def _tensors(art: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(art.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _decode(saved: dict, module: str, fmt: str) -> torch.Tensor:
    """The weight an FP4 module stores, float32, decoded from its bytes as the format defines it:
    two codes per byte (low nibble first), sign bit 3, E2M1 magnitude in bits 0-2, times the block's
    scale (NVFP4: E4M3 over the tensor's global scale; MXFP4: 2 ** (e - 127))."""
    packed = saved[module + ".weight_packed"]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    values = E2M1[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    scale = saved[module + ".weight_scale"]
    if fmt == "nvfp4":
        per_block = scale.float() / saved[module + ".weight_global_scale"].float()
    else:
        per_block = torch.exp2(scale.to(torch.int32).float() - 127)
    return values * per_block.repeat_interleave(BLOCK[fmt], dim=1)


# ---- the recipe ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_recipe_format_reads_and_dumps_under_its_key(fmt):
    from quantkit.recipe.files import recipe_from_dict

    cfg = recipe_from_dict({"steps": [{"quantize": {"method": "fp4", "format": fmt}}]}).steps[0].quantize
    assert (cfg.scheme, cfg.weight_bits, cfg.storage_group, cfg.preset) == (
        f"{fmt.upper()}-W4A16",
        4,
        BLOCK[fmt],
        f"{fmt.upper()}A16",
    )
    assert cfg.model_dump(mode="json") == {"method": "fp4", "format": fmt, "ignore": ["lm_head"]}
    assert cfg.facts == ({"nvfp4": scheme_facts.NVFP4, "mxfp4": scheme_facts.MXFP4}[fmt],)


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"format": "nf4"}, r"quantize\.format: must be one of 'nvfp4' or 'mxfp4'"),
        ({"format": "mxfp4", "group_size": 16}, r"quantize\.group_size: unknown key"),
    ],
)
def test_recipe_refuses_what_fp4_does_not_take(bad, message):
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import recipe_from_dict

    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"steps": [{"quantize": {"method": "fp4", **bad}}]})


# ---- convert: the artifact and its reload --------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_convert_reloads_exactly_and_records_the_facts(fp4_arts, fmt):
    """The reload check finds mean KL exactly 0 (not merely under the threshold): the reloaded model
    is the converted one. quantkit.json records the facts config.json declares, which are the config's."""
    from quantkit.recipe.files import load_recipe

    art, meta = fp4_arts[fmt]
    v = meta["verification"]
    assert v["status"] == "passed" and v["mean_kl"] == 0.0 and v["loader"] == "transformers + compressed-tensors"
    q = meta["quantization"]
    assert (q["method"], q["scheme"], q["weight_bits"], q["group_size"], q["weight_type"]) == (
        "fp4",
        f"{fmt.upper()}-W4A16",
        4,
        BLOCK[fmt],
        "float4_e2m1",
    )
    cfg = load_recipe(FORMATS[fmt]).steps[0].quantize
    assert [scheme_facts.SchemeFacts.from_dict(d) for d in q["weights"]] == list(cfg.facts)
    assert scheme_facts.of_checkpoint(art) == list(cfg.facts)
    qcfg = json.loads((art / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == f"{fmt}-pack-quantized" and qcfg["ignore"] == ["lm_head"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_stored_tensors_are_the_format(fp4_arts, tiny_llama, fmt):
    """Packed codes (two per byte), one scale per block (E4M3 or E8M0 bytes), NVFP4's float32 global
    scale; embeddings and norms untouched; the decoded weight is within a block step of the source."""
    art, _ = fp4_arts[fmt]
    saved, source = _tensors(art), _tensors(tiny_llama)
    modules = sorted(k[: -len(".weight_packed")] for k in saved if k.endswith(".weight_packed"))
    assert len(modules) == 14  # 7 linears x 2 layers; lm_head ignored
    for m in modules:
        w = source[m + ".weight"].float()
        rows, cols = w.shape
        assert saved[m + ".weight_packed"].dtype == torch.uint8 and saved[m + ".weight_packed"].shape == (
            rows,
            cols // 2,
        )
        scale = saved[m + ".weight_scale"]
        assert scale.shape == (rows, cols // BLOCK[fmt])
        assert scale.dtype == (torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8)
        assert (m + ".weight_global_scale" in saved) == (fmt == "nvfp4")
        if fmt == "nvfp4":
            g = saved[m + ".weight_global_scale"]
            assert g.dtype == torch.float32 and g.shape == (1,)  # kept at float32 through the cast to float16
        decoded = _decode(saved, m, fmt)
        step = decoded.abs().reshape(rows, -1, BLOCK[fmt]).amax(-1).repeat_interleave(BLOCK[fmt], dim=1)
        assert bool(((decoded - w).abs() <= step / 3 + 1e-3).all()), m  # E2M1's widest gap is 2 of the max 6
    for k in source:
        if ".layers." not in k or not k.endswith("proj.weight"):
            assert torch.equal(saved[k], source[k]), k


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_transformers_reload_holds_the_decoded_weights_at_the_load_dtype(fp4_arts, fmt, dtype):
    """compressed-tensors 0.19 alone decompresses FP4 to bfloat16 whatever the load dtype (the forward
    then fails); with quantkit's fix every linear holds the decoded weight in the load dtype."""
    from quantkit.artifacts.containers import CONTAINERS as EXPORT

    art, _ = fp4_arts[fmt]
    model = EXPORT["compressed-tensors"].load(art, str(dtype).removeprefix("torch."), torch.device("cpu"))
    with torch.no_grad():
        logits = model(torch.arange(16).reshape(1, -1)).logits
    assert logits.dtype == dtype and bool(torch.isfinite(logits).all())
    saved = _tensors(art)
    for name, mod in model.named_modules():
        if name + ".weight_packed" in saved:
            assert mod.weight.dtype == dtype, name
            assert torch.equal(mod.weight, _decode(saved, name, fmt).to(dtype)), name


# ---- sizes, eval, shapes ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sizes_count_the_formats_bits_per_weight(fp4_arts, tiny_llama, fmt):
    """From the headers: NVFP4 4 + 8/16 bits per weight plus 32 per tensor; MXFP4 4 + 8/32 = 4.25."""
    art, _ = fp4_arts[fmt]
    source = _tensors(tiny_llama)
    shapes = [v.shape for k, v in source.items() if ".layers." in k and k.endswith("proj.weight")]
    weights = sum(r * c for r, c in shapes)
    bits = 4 * weights + 8 * weights // BLOCK[fmt] + (32 * len(shapes) if fmt == "nvfp4" else 0)
    assert checkpoint_sizes(art).bits_per_weight == pytest.approx(bits / weights, rel=1e-12)
    assert bits / weights == pytest.approx(4.25 if fmt == "mxfp4" else 4.5, abs=2e-3)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_eval_scores_the_artifact_against_its_source(cli, fp4_arts, tiny_llama, tiny_text, fmt):
    art, _ = fp4_arts[fmt]
    code, _, err, out = cli(
        "eval", str(art), "--baseline", str(tiny_llama), "--text", f"file:{tiny_text}", "--seq-len", "64", "--json"
    )
    assert code == 0, err
    (t,) = out["texts"]
    assert 0 < t["kld"]["mean"] < 1 and t["ppl"] > 0, t


@pytest.mark.parametrize("recipe, block, width", [("mxfp4-w4a16", 32, 80), ("nvfp4-w4a16", 16, 88)])
def test_a_layer_the_block_does_not_divide_is_refused_before_loading(cli, tiny_dir, tmp_path, recipe, block, width):
    """FP4's blocks (MXFP4: 32, NVFP4: 16) that do not divide a down_proj's input columns: refused
    with the layer named, before any weight is read, and the advice is one the recipe takes (the
    format fixes its block: no group_size to suggest, which the FP4 recipe would call an unknown key)."""
    from fixtures import build_checkpoint

    src = tmp_path / "odd"
    build_checkpoint(src, "llama-gqa", tiny_dir / "tokenizer", intermediate_size=width)
    code, _, err, _ = cli("convert", recipe, "--model", str(src), "--out", str(tmp_path / "out"))
    assert (
        code == 2
        and f"{block}-value blocks" in err
        and f"the {width} input columns of model.layers.0.mlp.down_proj" in err
    )
    assert "group_size" not in err and "-1" not in err and "add those layers to ignore" in err
    assert not (tmp_path / "out").exists()
    other = "nvfp4-w4a16" if recipe == "mxfp4-w4a16" else None
    if other and width % 16 == 0:
        code, _, err, _ = cli("convert", other, "--model", str(src), "--out", str(tmp_path / "nv"), "--plan")
        assert code == 0, err
