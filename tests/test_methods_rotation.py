"""methods/rotation.py: SpinQuant's offline rotations before quantization, and what is refused."""

import json
import shutil
from pathlib import Path

import pytest
from fixtures import build_checkpoint

REPO = Path(__file__).resolve().parents[1]


def recipe(tmp_path, transform: str, quantize: str) -> Path:
    p = tmp_path / "rot.yaml"
    p.write_text(
        f"steps:\n  - transform: {transform}\n  - quantize: {quantize}\ncalibration: {{samples: 8, seq_len: 64}}\n"
    )
    return p


def convert(cli, path, model, out, text):
    return cli("convert", str(path), "--model", str(model), "--out", str(out), "--calib", f"file:{text}", "--json")


@pytest.mark.parametrize("arch", ["llama-gqa", "mistral", "qwen2"])
def test_spinquant_r1_r2_then_gptq_verifies_on_each_supported_architecture(cli, tiny_dir, tiny_text, tmp_path, arch):
    out = tmp_path / "art"
    path = recipe(tmp_path, "{method: spinquant}", "{method: gptq, bits: 4, group_size: 64}")
    code, _, err, data = convert(cli, path, tiny_dir / arch, out, tiny_text)
    assert code == 0, err
    assert data["verification"]["status"] == "passed" and data["verification"]["mean_kl"] <= 1e-3
    cfg = json.loads((out / "config.json").read_text())
    groups = cfg["quantization_config"]["transform_config"]["config_groups"]
    assert set(groups) == {"R1", "R2"}
    assert all(
        a["location"].startswith("weight_") for g in groups.values() for a in g["apply"]
    )  # fused: nothing at run time
    assert json.loads((out / "quantkit.json").read_text())["recipe"]["steps"][0]["transform"]["rotations"] == [
        "R1",
        "R2",
    ]


@pytest.mark.parametrize(
    "quantize",
    [
        "{method: awq, bits: 4, group_size: 64, rounding: gptq}",
        "{method: autoround, bits: 4, group_size: 64, iters: 5}",
        "{method: rtn, bits: 4, group_size: 64}",
    ],
)
def test_spinquant_composes_with_awq_autoround_and_rtn(cli, tiny_llama, tiny_text, tmp_path, quantize):
    path = recipe(tmp_path, "{method: spinquant, transform_type: random-hadamard}", quantize)
    code, _, err, data = convert(cli, path, tiny_llama, tmp_path / "art", tiny_text)
    assert code == 0, err
    assert data["verification"]["status"] == "passed"


@pytest.mark.parametrize(
    "transform,message",
    [
        ("{method: quip}", "quip v: online rotations"),
        ("{method: spinquant, rotations: [R1, R2, R4]}", "spinquant R4: online rotations"),
        ("{method: spinquant, rotations: [R3]}", "spinquant R3: online rotations"),
        ("{method: spinquant, rotations: [R5]}", "spinquant has no rotation 'R5'"),
        ("{method: spinquant, rotations: []}", "give at least one of R1, R2, R3, R4"),
        ("{method: hadamard}", "steps[0].transform.method: must be one of"),
    ],
)
def test_refused_rotations_are_one_line_before_loading(cli, tiny_llama, tiny_text, tmp_path, transform, message):
    path = recipe(tmp_path, transform, "{method: gptq, bits: 4, group_size: 64}")
    code, _, err, _ = convert(cli, path, tiny_llama, tmp_path / "art", tiny_text)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize(
    "steps,message",
    [
        ("  - transform: {method: spinquant}\n", "a transform step must be followed by its quantize step"),
        (
            "  - quantize: {method: gptq}\n  - transform: {method: spinquant}\n",
            "a transform step must be followed by its quantize step",
        ),
        (
            "  - transform: {method: spinquant}\n  - quantize: {method: bnb-nf4}\n",
            "composes with rtn, gptq, awq, autoround or w8a8",
        ),
    ],
)
def test_transform_step_order(tmp_path, steps, message):
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import load_recipe

    p = tmp_path / "r.yaml"
    p.write_text("steps:\n" + steps)
    with pytest.raises(RecipeError, match=message):
        load_recipe(p)


def test_unsupported_architecture_is_refused_at_preflight(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    """A Gemma-type model (its norms scale by 1 + w, so SpinQuant's norm fusing
    would be wrong): exit 2, nothing loaded."""
    import quantkit.quantize.convert

    model = tmp_path / "gemma"
    shutil.copytree(tiny_llama, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(model_type="gemma", architectures=["GemmaForCausalLM"])
    (model / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(quantkit.quantize.convert, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    path = recipe(tmp_path, "{method: spinquant}", "{method: gptq, bits: 4, group_size: 64}")
    code, _, err, _ = convert(cli, path, model, tmp_path / "art", tiny_text)
    assert code == 2 and "spinquant supports the llama, mistral, qwen2 architectures" in err and "'gemma'" in err


def test_rotation_sizes_are_checked_at_preflight(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    import quantkit.quantize.convert

    monkeypatch.setattr(quantkit.quantize.convert, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    path = recipe(tmp_path, "{method: spinquant, block_size: 96}", "{method: gptq, bits: 4, group_size: 64}")
    code, _, err, _ = convert(cli, path, tiny_llama, tmp_path / "a", tiny_text)
    assert code == 2 and "block_size: 96 does not divide the hidden size 128" in err
    model = build_checkpoint(  # a hidden size that is no power of two, as the demo's 576
        tmp_path / "wide96", "llama-gqa", tiny_llama, hidden_size=96, head_dim=24
    )
    path = recipe(tmp_path, "{method: spinquant}", "{method: gptq, bits: 4, group_size: 32}")
    code, _, err, _ = convert(cli, path, model, tmp_path / "b", tiny_text)
    assert code == 2 and "R1 needs a hadamard rotation of order 96" in err
    assert "block_size: 32 or transform_type: random-hadamard" in err


def test_which_orders_compressed_tensors_can_build():
    from quantkit.methods.rotation import _constructible

    assert _constructible("hadamard", 64) and not _constructible("hadamard", 576)  # Sylvester: powers of two
    assert _constructible("random-hadamard", 576)  # 36 x 16: a known order-36 Hadamard matrix (the demo's width)
    assert not _constructible("random-hadamard", 18) and _constructible(
        "random-matrix", 18
    )  # no Hadamard of order 18 or 9


@pytest.mark.parametrize("arch", ["llama-gqa", "mistral", "qwen2"])
def test_fused_rotations_keep_the_models_function(tiny_dir, arch):
    """R1/R2 are orthogonal and fused around RMSNorm: the rotated, unquantized model computes what the
    source did. Embeddings with a non-zero row mean catch llm-compressor's embedding centering
    (exact under LayerNorm only; methods/patches.py llmcompressor_spinquant_keep_embeddings)."""
    import torch
    from llmcompressor import oneshot

    from quantkit.methods import rotation
    from quantkit.models.checkpoint import load_model
    from quantkit.recipe.schema import TransformStepConfig

    model = load_model(tiny_dir / arch, dtype="float32", device="cpu").eval()
    with torch.no_grad():
        model.get_input_embeddings().weight += 0.5  # every row's mean moves by 0.5
        ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
        before = torch.log_softmax(model(input_ids=ids).logits.double(), -1)
        step = TransformStepConfig(method="spinquant", rotations=("R1", "R2"), transform_type="random-hadamard")
        oneshot(model=model, recipe=rotation.modifiers(step))
        after = torch.log_softmax(model(input_ids=ids).logits.double(), -1)
    kl = float((before.exp() * (before - after)).sum(-1).mean())
    assert kl < 1e-8, kl
