"""The dtype rule (core/precision.py): the faster of bf16 and float32 in the probe's rates, unless asked."""

import pytest

from quantkit.core.precision import Precision, choose

# probed figures (TFLOP/s) of the CPU kinds quantkit runs on, as bench/probe.py records them
AMX = {"bfloat16": 0.91, "float16": 0.15, "float32": 0.15}  # AMX: bf16 six times float32
NO_BF16 = {"bfloat16": 0.054, "float16": 0.001, "float32": 0.6}  # AVX-512 VNNI without BF16: bf16 emulated
GPU = {"bfloat16": 700.0, "float16": 700.0, "float32": 60.0}


@pytest.mark.parametrize("rates, want", [(AMX, "bfloat16"), (NO_BF16, "float32"), (GPU, "bfloat16")])
def test_the_faster_of_bf16_and_float32(rates, want):
    p = choose(rates)
    assert p.dtype == want and not p.asked and "probed" in p.reason


def test_the_reason_gives_the_ratio():
    assert choose(NO_BF16).reason == (
        "bf16 matmul 0.054 TFLOP/s, 0.09x float32's 0.60 (probed): no native bf16 arithmetic here"
    )
    assert choose(AMX).reason == "bf16 matmul 0.91 TFLOP/s, 6.1x float32's (probed)"


def test_float16_only_when_asked_and_asked_wins():
    assert choose({"bfloat16": 1.0, "float16": 9.0, "float32": 1.0}).dtype == "bfloat16"  # a tie goes to bf16
    assert choose(NO_BF16, "bfloat16") == Precision("bfloat16", "asked for", True)
    assert choose(None, "float16").dtype == "float16"
    with pytest.raises(ValueError, match="not a compute dtype"):
        choose(AMX, "int8")


@pytest.mark.parametrize("rates", [None, {}, {"bfloat16": 1.0}, {"bf16_matmul_tflops": 1.0}])
def test_without_both_rates_float32(rates):
    p = choose(rates)
    assert p.dtype == "float32" and "no probed" in p.reason
