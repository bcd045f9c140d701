"""The calibration's precision (quantize/job.py): what the recipe asks, float32 for 8-bit weights,
float32 on every CPU below 8 bits (the same arithmetic on each CPU kind), the probe's choice on a GPU."""

import torch

from quantkit.core.precision import Precision
from quantkit.methods.method_registry import quantize_step
from quantkit.quantize import job
from quantkit.recipe.files import load_recipe


def _step(name: str, *sets: str):
    recipe = load_recipe(name, list(sets))
    return recipe, quantize_step(recipe.all_variants()[0])


def test_four_bits_calibrate_in_float32_on_any_cpu():
    recipe, quant = _step("int4-w4a16-gptq-g64")
    for device in (torch.device("cpu"), torch.device("cpu", 0)):
        p = job.calib_precision(recipe, quant, device)
        assert p.dtype == "float32" and p.reason.startswith("float32 on the CPU") and not p.asked
        assert job.quant_dtype(recipe, quant, None, p) == "float32"


def test_a_gpu_takes_the_probes_choice(monkeypatch):
    recipe, quant = _step("int4-w4a16-gptq-g64")
    asked = []
    bf16 = Precision("bfloat16", "bf16 matmul 700 TFLOP/s, 11.7x float32's (probed)")
    monkeypatch.setattr(job, "compute_precision", lambda device: asked.append(device) or bf16)
    gpu = torch.device("cuda", 1)  # a value: no GPU needed for the rule
    assert job.calib_precision(recipe, quant, gpu) is bf16 and asked == [gpu]
    assert job.quant_dtype(recipe, quant, None, bf16) == "bfloat16"


def test_the_recipe_and_the_eight_bit_rule_need_no_probe(monkeypatch):
    monkeypatch.setattr(job, "compute_precision", lambda device: (_ for _ in ()).throw(AssertionError("probed")))
    recipe, quant = _step("int4-w4a16-gptq-g64", "calibration.compute_dtype=bfloat16")
    assert job.calib_precision(recipe, quant, torch.device("cuda", 0)) is None
    assert job.quant_dtype(recipe, quant, None, None) == "bfloat16"  # asked for, on any device
    recipe, quant = _step("int8-w8a16-rtn")
    assert job.calib_precision(recipe, quant, torch.device("cuda", 0)) is None
    assert job.quant_dtype(recipe, quant, None, None) == "float32"
