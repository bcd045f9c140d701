"""methods/method_registry.py: one entry per method carries everything the rest of quantkit asks about it.

A method that exists only as a registry entry (a config class and a handler defined here, the entry
put in METHODS for the test) validates, plans, converts, verifies and is described in quantkit.json
without a change anywhere else."""

import dataclasses
import json
from typing import ClassVar, Literal

import pytest

from quantkit.methods.configs import MethodConfig
from quantkit.methods.method_registry import METHODS, Method
from quantkit.models.scheme_facts import DENSE


class FakeInt8Config(MethodConfig):
    """Symmetric INT8 per output channel, rounded to nearest, stored dense (as the source's floats)."""

    method: Literal["fake-int8"]
    ignore: tuple[str, ...] = ("lm_head",)
    weight_bits: ClassVar[int] = 8


def fake_int8_weight(w):
    import torch

    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(w.dtype).tiny) / 127
    return (w / scale).round().clamp(-127, 127) * scale


def fake_int8(model, cfg, samples, src=None, device=None, transform=None):
    import torch

    from quantkit.quantize.preflight import is_ignored

    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and not is_ignored(name, cfg.ignore):
                mod.weight.copy_(fake_int8_weight(mod.weight))
    return model


FAKE = Method("fake-int8", FakeInt8Config, fake_int8, container="dense", calibrates=False, checks_layers=True)


@pytest.fixture
def fake_method(monkeypatch):
    monkeypatch.setitem(METHODS, FAKE.name, FAKE)
    return FAKE


def fake_recipe(tmp_path, method="fake-int8"):
    path = tmp_path / "fake.yaml"
    path.write_text(f"steps:\n  - quantize: {{method: {method}}}\n")
    return str(path)


def test_a_method_registered_in_one_entry_converts_end_to_end(cli, tiny_llama, tmp_path, fake_method):
    import torch
    from safetensors.torch import load_file

    recipe, out = fake_recipe(tmp_path), tmp_path / "art"
    code, _, err, data = cli("recipe", "validate", recipe, "--json")
    assert code == 0 and data["valid"][0]["variants"] == ["fake"], err
    code, _, err, plan = cli("convert", recipe, "--model", str(tiny_llama), "--out", str(out), "--plan", "--json")
    assert code == 0 and plan["fits"] and "quantize" in plan["time_breakdown"] and not out.exists(), err
    code, _, err, meta = cli("convert", recipe, "--model", str(tiny_llama), "--out", str(out), "--json")
    assert code == 0, err
    assert meta["verification"]["status"] == "passed" and meta["recipe"]["steps"] == [
        {"quantize": {"method": "fake-int8", "ignore": ["lm_head"]}}
    ]
    assert meta["quantization"] == {
        "format": "dense",
        "method": "fake-int8",
        "scheme": "W8A16",
        "weight_bits": 8,
        "ignore": ["lm_head"],
        "weights": [DENSE.as_dict()],  # what its config.json declares: dense weights (rounded, not stored quantized)
        "kv_cache": None,  # no KV cache scheme: the cache stays 16-bit
    }
    assert meta["device"]["dtype"] == "float32"  # 8-bit weights calibrate in float32 (quantize/job.py quant_dtype)
    source, saved = load_file(next(tiny_llama.glob("*.safetensors"))), load_file(next(out.glob("*.safetensors")))
    name = next(k for k in saved if k.endswith("self_attn.q_proj.weight"))
    expected = fake_int8_weight(source[name].float()).to(saved[name].dtype)
    assert torch.equal(saved[name], expected) and not torch.equal(
        saved[name], source[name]
    )  # the handler's weights, saved as they were
    head = next((k for k in saved if k.startswith("lm_head")), None)
    assert head is None or torch.equal(saved[head], source[head])  # ignore: lm_head stays as it was


def test_the_plan_reads_a_methods_cost_constants_from_its_entry(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    """The same method costed as calibrating with GPTQ's Hessians: the plan's terms follow the entry."""
    monkeypatch.setitem(METHODS, FAKE.name, dataclasses.replace(FAKE, calibrates=True, passes=2, hessians=True))
    args = [
        "convert",
        fake_recipe(tmp_path),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "a"),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "calibration.samples=8",
        "--set",
        "calibration.seq_len=64",
        "--plan",
        "--json",
    ]
    code, _, err, plan = cli(*args)
    assert code == 0, err
    assert {"calibration_forward", "hessians", "gptq_solve"} <= set(plan["time_breakdown"]) and "quantize" not in plan[
        "time_breakdown"
    ]
    assert plan["stages"]["calibration_working_set"] > 0


def test_a_calibrating_method_without_text_is_refused_before_loading(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.quantize.convert

    monkeypatch.setitem(METHODS, FAKE.name, dataclasses.replace(FAKE, calibrates=True))
    monkeypatch.setattr(quantkit.quantize.convert, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err, _ = cli("convert", fake_recipe(tmp_path), "--model", str(tiny_llama), "--out", str(tmp_path / "a"))
    assert code == 2 and "needs calibration text" in err and len(err.strip().splitlines()) == 1


def test_unregistered_names_are_refused_with_the_registrys_names(cli, tmp_path, fake_method):
    code, _, err, _ = cli("recipe", "validate", fake_recipe(tmp_path, "hqq"))
    assert code == 2 and f"unknown method 'hqq'; valid methods: {', '.join(METHODS)}" in err and "fake-int8" in err


def test_without_its_entry_the_method_is_unknown(cli, tmp_path):
    code, _, err, _ = cli("recipe", "validate", fake_recipe(tmp_path))
    assert code == 2 and "steps[0].quantize: unknown method 'fake-int8'" in err


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_entry_is_consistent(name):
    """An entry's config takes its name, its container exists, and a recipe step reads back as that config."""
    from quantkit.artifacts.containers import CONTAINERS
    from quantkit.recipe.files import recipe_from_dict

    m = METHODS[name]
    assert m.name == name and m.container in CONTAINERS
    cfg = recipe_from_dict({"steps": [{"quantize": {"method": name}}]}).steps[0].quantize
    assert type(cfg) is m.config and cfg.method == name
    assert cfg.weight_bits in (4, 8) and cfg.scheme and isinstance(cfg.storage_group, int)
    again = recipe_from_dict({"steps": [{"quantize": cfg.model_dump(mode="json")}]}).steps[0].quantize
    assert again == cfg  # a dumped step (quantkit.json's recipe) reads back as the same config
    assert not (m.loads_quantized and m.layerwise)  # bitsandbytes quantizes at load; llm-compressor layer by layer


def test_method_keys_belong_to_their_method():
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import recipe_from_dict

    with pytest.raises(RecipeError, match=r"steps\[0\]\.quantize\.threshold: unknown key"):
        recipe_from_dict({"steps": [{"quantize": {"method": "gptq", "threshold": 6.0}}]})
    with pytest.raises(RecipeError, match=r"steps\[0\]\.quantize: needs a 'method' key; valid methods: rtn, gptq"):
        recipe_from_dict({"steps": [{"quantize": {"bits": 4}}]})
    with pytest.raises(RecipeError, match=r"steps\[0\]\.quantize: expected a mapping"):
        recipe_from_dict({"steps": [{"quantize": "gptq"}]})
    with pytest.raises(RecipeError, match=r"variants\[0\]\.steps\[0\]\.quantize\.group_size: must be one of"):
        recipe_from_dict({"variants": [{"name": "a", "steps": [{"quantize": {"method": "rtn", "group_size": 48}}]}]})


def test_quantkit_json_records_the_method_as_json(tmp_path):
    """The recipe dump keeps each method's own keys (the config class, not the base)."""
    from quantkit.recipe.files import recipe_from_dict

    r = recipe_from_dict({"steps": [{"quantize": {"method": "autoround", "preset": "light"}}]})
    dumped = json.loads(json.dumps(r.to_dict()))["steps"][0]["quantize"]
    assert (dumped["method"], dumped["iters"], dumped["lr"]) == ("autoround", 50, 0.005)
