"""The recipe's `quantize:` section of each method: frozen, validated pydantic models.

The recipe schema finds the class for a step through the method registry (methods/method_registry.py),
so a method's config lives here and nowhere else names it. Every config carries what the export
and the plan need to know about the stored weights: `weight_bits`, `storage_group` (the group its
scales cover, -1 per output channel) and `scheme` (how quantkit.json names it).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from quantkit.core.kv_cache import KvCacheConfig
from quantkit.core.yamlio import StrictConfig
from quantkit.errors import QuantkitError
from quantkit.methods.schemes import AutoMixed, Scheme
from quantkit.models import scheme_facts
from quantkit.models.scheme_facts import SchemeFacts

GroupSize = Literal[32, 64, 128, -1]
Bits = Literal[4, 8]


class MethodConfig(StrictConfig):
    """The base of every method's config: unknown keys refused, frozen once read, numbers finite."""

    # Each config has `method: Literal[NAME]` (its registry key), `ignore` (module names left
    # unquantized) and `weight_bits`; fields are declared in the subclasses, in the order a recipe
    # dump shows them.
    storage_group: ClassVar[int] = -1

    @property
    def scheme(self) -> str:
        return f"W{self.weight_bits}A16"


class LayerOverride(StrictConfig):
    """Mixed precision: layers whose names match `targets` get other settings.

    Targets are regexes matched from the start of the module name (re.match, as
    llm-compressor does): `.*mlp\\.down_proj$`, `model\\.layers\\.0\\..*`.
    """

    targets: tuple[str, ...] = Field(min_length=1)
    bits: Bits = 8
    group_size: GroupSize = -1
    symmetric: bool = True


class ChosenOn(StrictConfig):
    """The windows a step's overrides were chosen on, as `quantkit sensitivity` prints them beside
    the overrides: the artifact records them (quantkit.json `recipe.steps`), so `eval` refuses to
    score it on those windows as it does its calibration windows."""

    source: str
    sha256: str | None = None
    seq_len: int = Field(ge=1)
    window_starts: tuple[int, ...] = ()
    seed: int | None = None
    region: str | None = None
    parts: tuple["ChosenOn", ...] = ()  # a calibration mix: each text's windows


class WeightOnly(MethodConfig):
    """Integer weights in groups (or per channel), activations left in 16 bits."""

    bits: Bits = 4
    group_size: GroupSize = 128
    symmetric: bool = True
    observer: Literal["minmax", "mse"] = "minmax"
    ignore: tuple[str, ...] = ("lm_head",)
    overrides: tuple[LayerOverride, ...] = ()
    # Mixed precision chosen on the model under a bits budget, instead of overrides written by hand.
    auto: AutoMixed | None = None
    chosen_on: ChosenOn | None = None  # the text `quantkit sensitivity` chose the overrides on
    kv_cache: KvCacheConfig | None = None  # the KV cache's FP8 scales (calibrated in this pass) and llama.cpp types

    @model_validator(mode="after")
    def _auto(self) -> "WeightOnly":
        if self.chosen_on is not None and not self.overrides:
            raise ValueError("chosen_on records the text the overrides were chosen on; give it with overrides")
        if self.auto is not None:
            if self.overrides:
                raise ValueError(
                    "auto and overrides: give one of them (auto writes the overrides on the model being converted)"
                )
            try:
                self.auto.check(Scheme(self.bits, self.group_size, self.symmetric))
            except QuantkitError as exc:
                raise ValueError(f"auto: {exc}") from None
        return self

    @property
    def weight_bits(self) -> int:
        return self.bits

    @property
    def storage_group(self) -> int:  # type: ignore[override]
        return self.group_size

    @property
    def facts(self) -> tuple[SchemeFacts, ...]:
        """The schemes the artifact's config groups declare (models/scheme_facts.py), base first."""
        own = scheme_facts.int_weights(self.bits, self.group_size, self.symmetric)
        ovs = [scheme_facts.int_weights(o.bits, o.group_size, o.symmetric) for o in self.overrides]
        return tuple(dict.fromkeys([own, *ovs]))


class RTNConfig(WeightOnly):
    """Round-to-nearest: no calibration data."""

    method: Literal["rtn"]


class GPTQConfig(WeightOnly):
    """GPTQ (Frantar et al. 2022) through llm-compressor."""

    method: Literal["gptq"]
    # llm-compressor's default: columns by decreasing Hessian diagonal, groups kept in place (no
    # g_idx, so no runtime cost). On the demo: +21.4% PPL with it, +38.5% without (W4 g64).
    actorder: Literal["static", "group", "weight"] | None = "static"
    dampening: float = Field(0.01, gt=0, lt=1)
    block_size: int = Field(128, ge=1)


class AWQConfig(WeightOnly):
    """AWQ (Lin et al. 2023) activation-aware scaling, then RTN or GPTQ rounding."""

    method: Literal["awq"]
    rounding: Literal["rtn", "gptq"] = "rtn"
    duo_scaling: bool = True
    actorder: Literal["static", "group", "weight"] | None = "static"  # with rounding: gptq
    dampening: float = Field(0.01, gt=0, lt=1)


# auto-round 0.15.1's presets (auto_round/cli/main.py RECIPES; README "auto-round-best/-light"):
# default 200 iterations, 128 samples, lr auto (1/iters); best 1000 iterations, 512 samples;
# light 50 iterations, lr 5e-3, 128 samples. All three tune 2048-token sequences in batches of 8;
# quantkit takes the sequence length from `calibration.seq_len`.
AUTOROUND_PRESETS: dict[str, dict[str, Any]] = {
    "default": {"iters": 200, "lr": None, "samples": 128},
    "best": {"iters": 1000, "lr": None, "samples": 512},
    "light": {"iters": 50, "lr": 5e-3, "samples": 128},
}


class AutoRoundConfig(WeightOnly):
    """AutoRound (Cheng et al. 2024: sign-gradient descent on rounding and clipping, block by block)
    through llm-compressor's AutoRoundModifier. Unset iters and lr come from the preset (filled in
    when the recipe is read, so quantkit.json records the values used)."""

    method: Literal["autoround"]
    preset: Literal["default", "best", "light"] = "default"
    iters: int | None = Field(None, ge=1)  # None only while another key is invalid: _preset fills it
    lr: float | None = Field(None, gt=0, lt=1)
    # Calibration windows AutoRound tunes on (the first N of the calibration set); must not exceed
    # calibration.samples. Unset: the preset's count, or every calibration window if fewer.
    samples: int | None = Field(None, ge=1)
    batch_size: int = Field(8, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset", "default") not in AUTOROUND_PRESETS:
            return data  # the field's own validation reports it
        preset = AUTOROUND_PRESETS[data.get("preset", "default")]
        out = dict(data)
        if out.get("iters") is None:
            out["iters"] = preset["iters"]
            if out.get("lr") is None and preset["lr"] is not None:
                out["lr"] = preset["lr"]
        iters = out["iters"]
        if out.get("lr") is None and isinstance(iters, int) and iters > 0:
            out["lr"] = 1.0 / iters  # auto-round's rule for 4+ bits (SignRoundConfig._lr_for_bits)
        return out

    def resolved_samples(self, available: int) -> int:
        return self.samples if self.samples is not None else min(AUTOROUND_PRESETS[self.preset]["samples"], available)


class W8A8Config(MethodConfig):
    """SmoothQuant (Xiao et al. 2022) + GPTQ: int8 weights per channel, dynamic per-token int8 activations."""

    method: Literal["w8a8"]
    smoothing_strength: float = Field(0.8, gt=0, lt=1)
    dampening: float = Field(0.01, gt=0, lt=1)
    ignore: tuple[str, ...] = ("lm_head",)
    kv_cache: KvCacheConfig | None = None
    weight_bits: ClassVar[int] = 8
    scheme: ClassVar[str] = "W8A8"  # type: ignore[assignment]
    facts: ClassVar[tuple[SchemeFacts, ...]] = (scheme_facts.int_weights(8, -1, True, ("int", 8, True)),)


class FP8Config(MethodConfig):
    """FP8 E4M3 weights with a static scale per output channel, no calibration data. The recipe's
    `scheme: w8a8` also rounds each linear's input to FP8 per token at run time (compressed-tensors'
    FP8_DYNAMIC preset); `w8a16` leaves activations in 16 bits."""

    # The recipe key is `scheme`; the attribute is `fp8_scheme`, so `scheme` stays what quantkit.json calls it.
    model_config = ConfigDict(serialize_by_alias=True)  # merged with StrictConfig's

    method: Literal["fp8"]
    fp8_scheme: Literal["w8a8", "w8a16"] = Field("w8a8", alias="scheme")
    ignore: tuple[str, ...] = ("lm_head",)
    weight_bits: ClassVar[int] = 8
    weight_type: ClassVar[str] = "float8_e4m3fn"

    @property
    def dynamic_activations(self) -> bool:
        return self.fp8_scheme == "w8a8"

    @property
    def activations(self) -> str:
        return "float8_e4m3fn per token, dynamic" if self.dynamic_activations else "16-bit"

    @property
    def scheme(self) -> str:
        return f"FP8-{self.fp8_scheme.upper()}"

    @property
    def facts(self) -> tuple[SchemeFacts, ...]:
        return (scheme_facts.fp8_weights(self.dynamic_activations),)


class BnbNF4Config(MethodConfig):
    """bitsandbytes NF4 (Dettmers et al. 2023): no calibration, blocks of 64."""

    method: Literal["bnb-nf4"]
    double_quant: bool = True
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    ignore: tuple[str, ...] = ("lm_head",)
    weight_bits: ClassVar[int] = 4
    storage_group: ClassVar[int] = 64  # bitsandbytes' NF4 block size, one absmax per block
    scheme: ClassVar[str] = "NF4"  # type: ignore[assignment]

    @property
    def facts(self) -> tuple[SchemeFacts, ...]:
        return (scheme_facts.bnb_4bit("nf4", self.double_quant),)


class BnbInt8Config(MethodConfig):
    """bitsandbytes LLM.int8() (Dettmers et al. 2022): no calibration."""

    method: Literal["bnb-int8"]
    threshold: float = Field(6.0, ge=0)
    ignore: tuple[str, ...] = ("lm_head",)
    weight_bits: ClassVar[int] = 8
    scheme: ClassVar[str] = "LLM.int8"  # type: ignore[assignment]

    facts: ClassVar[tuple[SchemeFacts, ...]] = (scheme_facts.LLM_INT8,)


class FP4Config(MethodConfig):
    """FP4 E2M1 weights in small blocks with a scale each, activations in 16 bits, no calibration data
    (compressed-tensors' NVFP4A16 and MXFP4A16 presets). `format: nvfp4`: blocks of 16 with an FP8
    E4M3 scale each and one FP32 scale per tensor; `mxfp4`: blocks of 32 with a power-of-two (E8M0)
    scale each (the OCP Microscaling format)."""

    model_config = ConfigDict(serialize_by_alias=True)  # the recipe key is `format`; merged with the base config

    method: Literal["fp4"]
    fp4_format: Literal["nvfp4", "mxfp4"] = Field("nvfp4", alias="format")
    ignore: tuple[str, ...] = ("lm_head",)
    weight_bits: ClassVar[int] = 4
    weight_type: ClassVar[str] = "float4_e2m1"

    @property
    def group_size(self) -> int:
        """The block every scale covers (fixed by the format): preflight checks it divides each layer's columns."""
        return self.facts[0].group_size

    @property
    def storage_group(self) -> int:  # type: ignore[override]
        return self.group_size

    @property
    def scale_type(self) -> str:
        return self.facts[0].scales

    @property
    def preset(self) -> str:
        """compressed-tensors' preset scheme name (quantization/quant_scheme.py)."""
        return f"{self.fp4_format.upper()}A16"

    @property
    def scheme(self) -> str:
        return f"{self.fp4_format.upper()}-W4A16"

    @property
    def facts(self) -> tuple[SchemeFacts, ...]:
        return ({"nvfp4": scheme_facts.NVFP4, "mxfp4": scheme_facts.MXFP4}[self.fp4_format],)
