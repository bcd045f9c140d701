"""Weight schemes a unit may take, the units vLLM serves as one kernel, and the recipe's `auto:`
block that asks for mixed precision under a bits budget.

They sit beside the method configs because the recipe validates `auto:` when it is read (which
choices exist, which units, a budget the base scheme can meet); the search that measures and
chooses is quantize/sensitivity.py and quantize/mixed.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from quantkit.core.hardware import get_device
from quantkit.core.roofline import Shape, linear_bits_for_tpot, quantized_layout
from quantkit.core.yamlio import StrictConfig
from quantkit.errors import QuantkitError

# unit -> (parent module in a decoder layer, its member linears); Llama, Mistral, Qwen2 names.
# vLLM fuses q/k/v (qkv_proj) and gate/up (gate_up_proj) and refuses a fused layer whose shards
# have different schemes, so a unit is always raised whole.
UNITS: dict[str, tuple[str, tuple[str, ...]]] = {
    "qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "o": ("self_attn", ("o_proj",)),
    "gate_up": ("mlp", ("gate_proj", "up_proj")),
    "down": ("mlp", ("down_proj",)),
}

_CHOICE = re.compile(r"int(4|8)(?:-g(32|64|128))?(-asym)?")


@dataclass(frozen=True)
class Scheme:
    """A weight scheme a unit may take: bits, group (-1: one scale per output channel), symmetry."""

    bits: int
    group_size: int = -1
    symmetric: bool = True

    @property
    def name(self) -> str:
        group = "" if self.group_size == -1 else f"-g{self.group_size}"
        return f"int{self.bits}{group}{'' if self.symmetric else '-asym'}"

    def bits_per_weight(self, in_features: int) -> float:
        """Stored bits per weight of a row of `in_features` weights (roofline's storage accounting:
        16-bit scales, a zero point of `bits` per group when asymmetric)."""

        return (
            quantized_layout(self.bits, self.group_size, self.symmetric).linear.bytes_for(1, in_features)
            * 8
            / in_features
        )

    @property
    def nominal_bits(self) -> float:
        """Bits per weight on a row too wide for a per-channel scale to count (the edge's check)."""
        return self.bits_per_weight(1 << 20)

    def stored_bits(self, out_features: int, in_features: int, scale_bits: int) -> int:
        """Bits one (out, in) linear takes in compressed-tensors' pack-quantized format, exactly:
        codes packed into int32 along each row, a scale per group at `scale_bits` (the
        checkpoint's precision), and, when asymmetric, zero points packed into int32 along the
        output dimension (compressed_tensors.compressors.pack_to_int32)."""
        groups = 1 if self.group_size == -1 else math.ceil(in_features / self.group_size)
        per_int32 = 32 // self.bits
        codes = out_features * math.ceil(in_features / per_int32) * 32
        scales = out_features * groups * scale_bits
        zeros = 0 if self.symmetric else math.ceil(out_features / per_int32) * groups * 32
        return codes + scales + zeros


def parse_choice(text: str) -> Scheme:
    """`int8` (per channel), `int4-g32`, `int4-g128-asym`, ... -> Scheme; anything else one line."""
    m = _CHOICE.fullmatch(text.strip())
    if m is None:
        raise QuantkitError(f"choice {text!r}: expected int8, int8-gG, int4-gG or int4-gG-asym (G one of 32, 64, 128)")
    bits, group = int(m.group(1)), int(m.group(2)) if m.group(2) else -1
    if bits == 4 and group == -1:
        raise QuantkitError(f"choice {text!r}: 4-bit needs a group (int4-g32, int4-g64, int4-g128)")
    return Scheme(bits, group, m.group(3) is None)


def raising(base: Scheme, choices: list[str]) -> list[Scheme]:
    """The choices as schemes, each one stored wider than `base` (else the budget buys nothing
    with it), each once; one line naming the first that is not."""
    schemes = [parse_choice(c) for c in choices]
    for text, s in zip(choices, schemes):
        if s.nominal_bits <= base.nominal_bits:
            raise QuantkitError(
                f"choice {text!r} ({s.nominal_bits:g} bits/weight) does not raise a unit above the base "
                f"scheme {base.name} ({base.nominal_bits:g}); choose wider ones (int8, int4-g32, ...)"
            )
    if len(set(schemes)) != len(schemes):
        raise QuantkitError(f"choices {', '.join(choices)}: each scheme once")
    return schemes


class AutoMixed(StrictConfig):
    """`auto:` of a weight-only quantize step: the units to raise above the step's own scheme,
    chosen on the model being converted so that its bits per weight stay within `budget_bits`."""

    # The budget, one of two ways. budget_bits: average stored bits per weight over the decoder
    # layers' linear weights (scales and zero points included; models/sizes.py measures the
    # artifact the same way). budget_tpot_ms: a batch-1 decode step's time on `device` (a
    # datasheet device, `quantkit roofline --help`) at `context` cached tokens, turned into that
    # bits budget through the roofline (TPOT = bytes read per token / bandwidth) on the model's
    # own shape (core/roofline.py linear_bits_for_tpot).
    budget_bits: float | None = Field(None, gt=0, le=16)
    budget_tpot_ms: float | None = Field(None, gt=0)
    device: str | None = None
    context: int = Field(0, ge=0)
    units: tuple[str, ...] = tuple(UNITS)
    choices: tuple[str, ...] = ("int8",)
    metric: str = "kl"
    # The calibration source's windows the sensitivity pass measures on (its seed and region). The
    # pass runs units x layers x (1 + choices) forwards over them, so the tokens set its cost
    # (`convert --plan` counts it). How stable a ranking is on a model: `quantkit sensitivity` with
    # two --seed values (disjoint windows of the same text).
    windows: int = Field(4, ge=1, le=1024)
    seq_len: int = Field(256, ge=8)

    @model_validator(mode="after")
    def _one_budget(self) -> "AutoMixed":
        if (self.budget_bits is None) == (self.budget_tpot_ms is None):
            raise ValueError("give one budget: budget_bits, or budget_tpot_ms with device")
        if self.budget_tpot_ms is not None and self.device is None:
            raise ValueError(
                "budget_tpot_ms needs device: the device the TPOT is a target on (quantkit roofline --help lists them)"
            )
        if self.budget_tpot_ms is None and (self.device is not None or self.context):
            raise ValueError("device and context belong to budget_tpot_ms")
        if self.device is not None:
            try:
                get_device(self.device)
            except QuantkitError as exc:
                raise ValueError(str(exc)) from None
        return self

    def bits_for(self, cfg: dict) -> tuple[float, dict | None]:
        """The bits budget on a model (its config.json), and, for a TPOT budget, how it was derived."""
        if self.budget_bits is not None:
            return self.budget_bits, None

        dev = get_device(self.device)
        bits = linear_bits_for_tpot(Shape.from_config(cfg), self.budget_tpot_ms / 1e3, dev.bandwidth, self.context)
        return bits, {
            "budget_tpot_ms": self.budget_tpot_ms,
            "device": self.device,
            "bandwidth_bytes_per_s": dev.bandwidth,
            "bandwidth_source": dev.source,
            "context": self.context,
            "budget_bits": bits,
        }

    @field_validator("units")
    @classmethod
    def _units(cls, units: tuple[str, ...]) -> tuple[str, ...]:
        bad = [u for u in units if u not in UNITS]
        if not units or bad or len(set(units)) != len(units):
            raise ValueError(f"give each of a subset of {', '.join(UNITS)} once (vLLM's fused kernels)")
        return units

    @field_validator("choices")
    @classmethod
    def _choices(cls, choices: tuple[str, ...]) -> tuple[str, ...]:
        if not choices:
            raise ValueError("give at least one scheme to raise units to (int8, int4-g32, ...)")
        for c in choices:
            try:
                parse_choice(c)
            except QuantkitError as exc:
                raise ValueError(str(exc)) from None
        return choices

    @field_validator("metric", mode="before")
    @classmethod
    def _metric(cls, metric: Any) -> Any:
        if metric != "kl":
            raise ValueError(
                f"{metric!r}: only kl for now (the KL of the next-token distribution against the unquantized "
                "model's, each unit rounded alone)"
            )
        return metric

    def schemes(self, base: Scheme) -> list[Scheme]:
        """The base scheme first, then the choices (the solver's order)."""
        return [base, *raising(base, list(self.choices))]

    def check(self, base: Scheme) -> None:
        """Against the step's own scheme: every choice raises a unit above it, and the budget is
        at least what every unit at the base takes (the model's exact floor is checked on its
        skeleton before loading)."""
        self.schemes(base)
        if (
            self.budget_bits is not None and self.budget_bits < base.nominal_bits
        ):  # a TPOT budget is checked on the model
            raise QuantkitError(
                f"budget_bits {self.budget_bits:g}: between {base.nominal_bits:g} (every weight at the base "
                f"scheme {base.name}) and 16"
            )
