"""Recipes: YAML -> frozen, validated objects, checked once at the edge.

Every error names the file and the key path (``recipes/x.yaml: steps[1].quantize.group_size:
must be one of 32, 64, 128 or -1``). Deeper code trusts what comes out of here.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1
GroupSize = Literal[32, 64, 128, -1]
Bits = Literal[4, 8]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- quantize methods


class LayerOverride(_Strict):
    """Mixed precision: layers whose names match `targets` get other settings.

    Targets are regexes matched from the start of the module name (re.match, as
    llm-compressor does): `.*mlp\\.down_proj$`, `model\\.layers\\.0\\..*`.
    """

    targets: tuple[str, ...] = Field(min_length=1)
    bits: Bits = 8
    group_size: GroupSize = -1
    symmetric: bool = True


class _WeightOnly(_Strict):
    bits: Bits = 4
    group_size: GroupSize = 128
    symmetric: bool = True
    observer: Literal["minmax", "mse"] = "minmax"
    ignore: tuple[str, ...] = ("lm_head",)
    overrides: tuple[LayerOverride, ...] = ()
    calibrated: ClassVar[bool] = True

    @property
    def weight_bits(self) -> int:
        return self.bits


class RTNConfig(_WeightOnly):
    """Round-to-nearest: no calibration data."""

    method: Literal["rtn"]
    calibrated: ClassVar[bool] = False


class GPTQConfig(_WeightOnly):
    """GPTQ (Frantar et al. 2022) through llm-compressor."""

    method: Literal["gptq"]
    # llm-compressor's default: columns by decreasing Hessian diagonal, groups kept in place (no
    # g_idx, so no runtime cost). On the demo: +21.4% PPL with it, +38.5% without (W4 g64).
    actorder: Literal["static", "group", "weight"] | None = "static"
    dampening: float = Field(0.01, gt=0, lt=1)
    block_size: int = Field(128, ge=1)


class AWQConfig(_WeightOnly):
    """AWQ (Lin et al. 2023) activation-aware scaling, then RTN or GPTQ rounding."""

    method: Literal["awq"]
    rounding: Literal["rtn", "gptq"] = "rtn"
    duo_scaling: bool = True
    actorder: Literal["static", "group", "weight"] | None = "static"  # with rounding: gptq
    dampening: float = Field(0.01, gt=0, lt=1)


class W8A8Config(_Strict):
    """SmoothQuant (Xiao et al. 2022) + GPTQ: int8 weights per channel, dynamic per-token int8 activations."""

    method: Literal["w8a8"]
    smoothing_strength: float = Field(0.8, gt=0, lt=1)
    dampening: float = Field(0.01, gt=0, lt=1)
    ignore: tuple[str, ...] = ("lm_head",)
    calibrated: ClassVar[bool] = True
    weight_bits: ClassVar[int] = 8


class BnbNF4Config(_Strict):
    """bitsandbytes NF4 (Dettmers et al. 2023): no calibration, blocks of 64."""

    method: Literal["bnb-nf4"]
    double_quant: bool = True
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    ignore: tuple[str, ...] = ("lm_head",)
    calibrated: ClassVar[bool] = False
    weight_bits: ClassVar[int] = 4


class BnbInt8Config(_Strict):
    """bitsandbytes LLM.int8() (Dettmers et al. 2022): no calibration."""

    method: Literal["bnb-int8"]
    threshold: float = Field(6.0, ge=0)
    ignore: tuple[str, ...] = ("lm_head",)
    calibrated: ClassVar[bool] = False
    weight_bits: ClassVar[int] = 8


METHOD_CONFIGS: dict[str, type[_Strict]] = {
    "rtn": RTNConfig,
    "gptq": GPTQConfig,
    "awq": AWQConfig,
    "w8a8": W8A8Config,
    "bnb-nf4": BnbNF4Config,
    "bnb-int8": BnbInt8Config,
}
QuantizeConfig = Annotated[
    Union[RTNConfig, GPTQConfig, AWQConfig, W8A8Config, BnbNF4Config, BnbInt8Config],
    Field(discriminator="method"),
]

# ---------------------------------------------------------------- gqa


class RecoverConfig(_Strict):
    """Short KL distillation from the original model after a GQA merge."""

    tokens: int = Field(262_144, ge=1024)
    max_minutes: float = Field(10.0, gt=0)
    lr: float = Field(1e-3, gt=0)
    seq_len: int = Field(256, ge=16)
    batch_size: int = Field(4, ge=1)
    train: Literal["kv", "kvqo"] = "kv"
    heldout_windows: int = Field(4, ge=1)
    eval_every: int = Field(20, ge=1)
    patience: int = Field(3, ge=1)


class GqaConfig(_Strict):
    kv_heads: int = Field(ge=1)
    grouping: Literal["contiguous", "searched"] = "contiguous"
    merge: Literal["mean", "calibrated"] = "mean"
    recover: RecoverConfig | None = None


class Step(_Strict):
    """One step: exactly one of `quantize` or `gqa`."""

    quantize: QuantizeConfig | None = None
    gqa: GqaConfig | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "Step":
        if (self.quantize is None) == (self.gqa is None):
            raise ValueError("a step holds exactly one of: quantize, gqa")
        return self

    @property
    def kind(self) -> str:
        return "quantize" if self.quantize is not None else "gqa"


# ---------------------------------------------------------------- sections


class CalibrationConfig(_Strict):
    source: str | None = None
    samples: int = Field(128, ge=1)
    seq_len: int = Field(512, ge=8)
    seed: int = 0
    chat_template: bool = False
    region: Literal["all", "first-half", "second-half"] = "second-half"
    # The precision the model is calibrated in. bf16 forwards are about 3x faster on AMX/AVX512-BF16
    # cores, but bf16 rounding of the weights is comparable to INT8's own error; "auto" takes
    # float32 when any weight is quantized to 8 bits and bfloat16 otherwise.
    compute_dtype: Literal["auto", "bfloat16", "float32"] = "auto"


class EvalConfig(_Strict):
    text: str | None = None
    seq_len: int = Field(512, ge=8)
    max_tokens: int = Field(8192, ge=8)
    region: Literal["all", "first-half", "second-half"] = "first-half"
    tasks: tuple[str, ...] = ()
    limit: int | None = Field(None, ge=1)


class BenchConfig(_Strict):
    engine: str = "compiled"
    device: Literal["cpu", "cuda"] = "cpu"
    prompt_len: int = Field(256, ge=1)
    gen_len: int = Field(64, ge=2)
    repeats: int = Field(5, ge=1)
    min_seconds: float = Field(2.0, ge=0)
    prompt_sweep: tuple[int, ...] = ()


class ExportConfig(_Strict):
    max_shard_size: str = "5GB"
    # Extra serving formats written beside each variant's artifact (quantkit/cli/export.py FORMATS);
    # "gguf" = exact GGUF for llama.cpp, refused (not approximated) where the grid has no GGUF type.
    formats: tuple[Literal["gguf"], ...] = ()


# Names become directory names (`runs/NAME`, `runs/NAME/artifacts/VARIANT`): plain names only, so
# `name: ../../x` or `name: /tmp/x` can never make `run` write outside its run directory.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class Variant(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    # A variant without steps is the unmodified checkpoint, and must say so: a step-less variant
    # named like a quantized one (an include whose steps were lost) would be reported as one.
    baseline: bool = False
    steps: tuple[Step, ...] = ()


def _check_steps(steps: tuple[Step, ...]) -> None:
    kinds = [s.kind for s in steps]
    if kinds.count("quantize") > 1 or kinds.count("gqa") > 1:
        raise ValueError("at most one gqa step and one quantize step")
    if kinds == ["quantize", "gqa"]:
        raise ValueError("gqa must come before quantize (a quantized model cannot be re-headed)")


def _check_effective_steps(recipe: "Recipe") -> None:
    """Only a variant marked `baseline: true` (or run's implicit baseline) converts nothing."""
    if not recipe.variants and not recipe.steps:
        raise ValueError("no steps and no variants: nothing to convert")
    if sum(v.baseline for v in recipe.variants) > 1:
        raise ValueError("more than one variant has baseline: true")
    for i, v in enumerate(recipe.variants):
        if v.baseline and v.steps:
            raise ValueError(f"variants[{i}] ({v.name}): baseline: true is the unmodified checkpoint, it takes no steps")
        if not v.baseline and not v.steps:
            raise ValueError(f"variants[{i}] ({v.name}): no steps; give it steps (or recipe: FILE), "
                             "or mark the unmodified checkpoint with baseline: true")


class Recipe(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field("", pattern=r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,99})?$")  # NAME_PATTERN, or empty
    description: str = ""
    model: str | None = None
    calibration: CalibrationConfig = CalibrationConfig()
    steps: tuple[Step, ...] = ()
    variants: tuple[Variant, ...] = ()
    eval: EvalConfig = EvalConfig()
    bench: BenchConfig = BenchConfig()
    export: ExportConfig = ExportConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> "Recipe":
        if self.steps and self.variants:
            raise ValueError("use either steps (one variant) or variants (a suite), not both")
        _check_steps(self.steps)
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError("variant names must be unique")
        for v in self.variants:
            _check_steps(v.steps)
        _check_effective_steps(self)
        return self

    def all_variants(self) -> tuple[Variant, ...]:
        """The variants a run covers; a single-variant recipe is itself one variant."""
        if self.variants:
            return self.variants
        return (Variant(name=self.name or "variant", description=self.description, steps=self.steps),)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------- files

# Reading recipe files (YAML, includes, --set, error locations) lives in recipe_files.py; these
# names stay importable from here.
_FILE_API = ("apply_override", "format_loc", "format_validation_error", "include_target", "load_raw", "load_recipe",
             "parse_key_path", "plain_name", "recipe_from_dict")


def __getattr__(name: str):
    if name in _FILE_API:
        from . import recipe_files

        return getattr(recipe_files, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
