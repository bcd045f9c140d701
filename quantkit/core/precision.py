"""The floating-point type torch computes in where nobody asked for one, chosen from the device's
measured matmul rates (bench/probe.py's `matmul_tflops`), never from its name or CPUID.

bfloat16 halves the bytes every weight read costs, but only a device with bf16 arithmetic runs it
fast: AMX and AVX512-BF16 CPUs and GPUs from Ampere on. A CPU without it widens each operand in
software (an AVX-512 VNNI Xeon without BF16 probed bf16 at 0.054 TFLOP/s, an order of magnitude
below its float32), so there float32 computes the same step several times faster. The rule: the
faster of the two matmuls, as probed on this device (a prefill, a calibration forward and a
scoring pass are matmul-bound). float16 is taken only when asked: its range overflows on some
models' activations, which bfloat16 and float32 share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

CHOICES = ("bfloat16", "float32")  # what the rule picks from
DTYPES = ("bfloat16", "float32", "float16")  # what a user may ask for


@dataclass(frozen=True)
class Precision:
    """A dtype and why: `asked` (the user's), or the probe's rates that chose it."""

    dtype: str
    reason: str
    asked: bool = False

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "reason": self.reason, "asked": self.asked}


def choose(rates: Mapping[str, float] | None, asked: str | None = None) -> Precision:
    """`asked` where given; else bfloat16 where its probed matmul ran at least as fast as float32's,
    float32 otherwise (and where the probe measured no bf16 rate: a probe from before the rates
    were kept, or a device that has no bf16 matmul at all)."""
    if asked is not None:
        if asked not in DTYPES:
            raise ValueError(f"not a compute dtype: {asked!r} (one of {', '.join(DTYPES)})")
        return Precision(asked, "asked for", True)
    bf16, fp32 = (float((rates or {}).get(k) or 0.0) for k in CHOICES)
    if bf16 <= 0.0 or fp32 <= 0.0:
        return Precision("float32", "no probed bf16 and float32 matmul rates to compare")
    ratio = bf16 / fp32
    if ratio >= 1.0:
        return Precision("bfloat16", f"bf16 matmul {bf16:.2f} TFLOP/s, {ratio:.1f}x float32's (probed)")
    return Precision(
        "float32",
        f"bf16 matmul {bf16:.3f} TFLOP/s, {ratio:.2f}x float32's {fp32:.2f} (probed): no native bf16 arithmetic here",
    )
