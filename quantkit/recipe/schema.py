"""Recipes: YAML -> frozen, validated objects, checked once at the edge.

Every error names the file and the key path (``recipes/x.yaml: steps[1].quantize.group_size:
must be one of 32, 64, 128 or -1``). Deeper code trusts what comes out of here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializeAsAny,
    StringConstraints,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from quantkit.core.option_fields import defaults
from quantkit.core.yamlio import StrictConfig
from quantkit.methods.configs import MethodConfig
from quantkit.methods.method_registry import METHODS, names, spoken
from quantkit.recipe.bench_options import BENCH_ENGINES, BenchOptions, combination_error
from quantkit.recipe.eval_options import EVAL_ENGINES, EvalOptions, buckets_error
from quantkit.recipe.section_fields import section_model

SCHEMA_VERSION = 1
BENCH_DEFAULTS = defaults(BenchOptions)
EVAL_DEFAULTS = defaults(EvalOptions)


# ---------------------------------------------------------------- gqa


class RecoverConfig(StrictConfig):
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
    # Steps per layer of attention transfer before distillation (gqa/transfer.py); 0: none.
    transfer_steps: int = Field(0, ge=0)


class GqaConfig(StrictConfig):
    kv_heads: int = Field(ge=1)
    grouping: Literal["contiguous", "searched"] = "contiguous"
    merge: Literal["mean", "calibrated"] = "mean"
    recover: RecoverConfig | None = None


# ---------------------------------------------------------------- rotations (transform steps)

# Rotations by where they act (compressed-tensors TransformLocation): offline ones are fused into
# the weights (nothing at run time); online ones rotate activations at run time through hooks.
ROTATIONS = {
    "spinquant": {"R1": "offline", "R2": "offline", "R3": "online", "R4": "online"},
    "quip": {"v": "online", "u": "online"},
}
# llm-compressor 0.14's defaults (SpinQuantModifier, QuIPModifier).
ROTATION_DEFAULTS = {
    "spinquant": {"rotations": ("R1", "R2"), "transform_type": "hadamard"},
    "quip": {"rotations": ("v",), "transform_type": "random-hadamard"},
}
ONLINE_REFUSED = (
    "online rotations (applied to activations at run time) cannot be verified here: transformers' loader "
    "(transformers 5.17, compressed-tensors 0.19) drops their transform weights, so the saved model would not "
    "reproduce the converted one, and quantkit's reload check, eval and bench all load through it; vLLM would "
    "serve input/output rotations at tensor-parallel size 1 on bias-free layers only, and has no attention-side "
    "(R3) rotation. Offline rotations fused into the weights: spinquant R1, R2"
)


class TransformStepConfig(StrictConfig):
    """A rotation before quantization, through llm-compressor's SpinQuantModifier / QuIPModifier
    (Liu et al. 2024, SpinQuant; Tseng et al. 2024, QuIP#). Offline rotations only: see ONLINE_REFUSED."""

    method: Literal["spinquant", "quip"]
    rotations: tuple[str, ...] = ()
    transform_type: Literal["hadamard", "random-hadamard", "random-matrix"] = "hadamard"
    # Block-diagonal rotations of this size (a power of two for "hadamard"); unset: the whole
    # hidden size (R1) and head dimension (R2).
    block_size: int | None = Field(None, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("method") in ROTATION_DEFAULTS:
            data = {**ROTATION_DEFAULTS[data["method"]], **data}
            if isinstance(data.get("rotations"), (list, tuple)):
                data["rotations"] = tuple(str(r) for r in data["rotations"])
        return data

    @model_validator(mode="after")
    def _offline_only(self) -> "TransformStepConfig":
        known = ROTATIONS[self.method]
        if not self.rotations:
            raise ValueError(f"rotations: give at least one of {', '.join(known)}")
        unknown = [r for r in self.rotations if r not in known]
        if unknown:
            raise ValueError(f"rotations: {self.method} has no rotation {unknown[0]!r}; valid: {', '.join(known)}")
        online = [r for r in self.rotations if known[r] == "online"]
        if online:
            raise ValueError(f"rotations: {self.method} {', '.join(online)}: {ONLINE_REFUSED}")
        if len(set(self.rotations)) != len(self.rotations):
            raise ValueError("rotations: each rotation at most once")
        return self


class Step(StrictConfig):
    """One step: exactly one of `quantize`, `gqa` or `transform`."""

    # The method's own config class (methods/method_registry.py METHODS[method].config); serialized as that class.
    quantize: SerializeAsAny[MethodConfig] | None = None
    gqa: GqaConfig | None = None
    transform: TransformStepConfig | None = None

    @field_validator("quantize", mode="wrap")
    @classmethod
    def _method_config(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """`quantize: {method: NAME, ...}` is validated by NAME's config class, looked up when the
        recipe is read; errors keep their key path (steps[0].quantize.group_size)."""
        if data is None or isinstance(data, MethodConfig):
            return handler(data)
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping (method: NAME and its keys); valid methods: {', '.join(METHODS)}")
        if "method" not in data:
            raise ValueError(f"needs a 'method' key; valid methods: {', '.join(METHODS)}")
        method = METHODS.get(data["method"]) if isinstance(data["method"], str) else None
        if method is None:
            raise ValueError(f"unknown method {str(data['method'])!r}; valid methods: {', '.join(METHODS)}")
        return method.config.model_validate(data)

    @model_validator(mode="after")
    def _one_kind(self) -> "Step":
        if sum(x is not None for x in (self.quantize, self.gqa, self.transform)) != 1:
            raise ValueError("a step holds exactly one of: quantize, gqa, transform")
        return self

    @property
    def kind(self) -> str:
        return "quantize" if self.quantize is not None else "gqa" if self.gqa is not None else "transform"


# ---------------------------------------------------------------- sections


class CalibrationConfig(StrictConfig):
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
    # Where calibration runs (`quantkit convert --device` overrides it): auto = the GPU if any.
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda)(:[0-9]+)?$")


# The engine names a recipe may use. The recipe is read below the packages that implement them
# (bench/engines ENGINES, evals/scorers SCORERS), so it names them beside their options
# (recipe/bench_options.py BENCH_ENGINES, recipe/eval_options.py EVAL_ENGINES); tests/test_recipe.py
# checks that these are exactly the registries' names, so a new engine is refused nowhere.
TASK_ENGINES = ("transformers",)  # the eval engines lm-eval tasks run beside (a scorer's runs_tasks)


class EvalConfig(section_model("EvalOptionKeys", EvalOptions, StrictConfig)):
    """`eval:`: every option of `quantkit eval` that a recipe sets, with its default, values and
    bound (recipe/eval_options.py, where they are declared once), then the engines. `texts: [...]`:
    one report row per variant per text (domain); `text: X` is the one-text shorthand. None of them
    (and no tasks): the default domains (quantkit/evals/domains.py), at least two."""

    # What scores each variant (EVAL_ENGINES): `[transformers, llamacpp]` gives every variant a row
    # per engine and domain; llamacpp scores the variant's exact GGUF (exported on the fly).
    engines: tuple[Literal[EVAL_ENGINES], ...] = (EVAL_DEFAULTS["engine"],)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "text" not in data:
            return data
        data = dict(data)
        text = data.pop("text")
        if text is None:
            return data
        if data.get("texts") not in (None, [], (), [text], (text,)):
            raise ValueError("text: give `text: SPEC` or `texts: [SPEC, ...]`, not both")
        return {**data, "texts": (text,)}

    @model_validator(mode="after")
    def _engines(self) -> "EvalConfig":
        if self.split != "all" and any(t.strip() == "self" for t in self.texts):
            raise ValueError("split: generated text (self) has no token positions to split; use split: all")
        if not self.engines or len(set(self.engines)) != len(self.engines):
            raise ValueError("engines: give each eval engine once, at least one")
        error = buckets_error(self, lambda f: f.name)  # as `quantkit eval` checks its options
        if error:
            raise ValueError(error)
        if self.tasks and self.engines[0] not in TASK_ENGINES:
            raise ValueError(
                f"tasks: lm-eval tasks run with the first eval engine, which must be {' or '.join(TASK_ENGINES)} "
                "(tasks_backend picks hf or vllm)"
            )
        return self

    @property
    def text(self) -> str | None:
        """The first text (the one-text format's field)."""
        return self.texts[0] if self.texts else None


class _EngineKeys(StrictConfig):
    # `engines: [compiled, llamacpp]` benches every variant on each engine (a row per engine in the
    # report, a rule-check fit per engine); `engine: X` is the one-engine shorthand, and names the
    # first engine either way.
    engine: str = BENCH_DEFAULTS["engine"]
    engines: tuple[str, ...] = ()


class BenchConfig(section_model("BenchOptionKeys", BenchOptions, _EngineKeys)):
    """`bench:`: the engines, then every option of `quantkit bench` that a recipe sets, with its
    default, values and bound (recipe/bench_options.py, where they are declared once)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        engine, engines = data.get("engine"), data.get("engines")
        if not isinstance(engines, (list, tuple)):
            return (
                {**data, "engines": (engine or BENCH_DEFAULTS["engine"],)} if engines is None else data
            )  # the field reports a non-list
        if not engines:
            raise ValueError("engines: give at least one engine")
        if engine is not None and engine != engines[0]:  # a dumped recipe holds both, consistent
            raise ValueError(
                f"engine: {engine} is not the first of engines ({', '.join(map(str, engines))}); give one of the two"
            )
        return {**data, "engine": engines[0]}

    @field_validator("flash_attn", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: Any) -> Any:
        """YAML reads a bare on / off as true / false."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _known_engines(self) -> "BenchConfig":
        unknown = [e for e in self.engines if e not in BENCH_ENGINES]
        if unknown:
            raise ValueError(f"unknown engine {unknown[0]!r}; valid: {', '.join(BENCH_ENGINES)}")
        if len(set(self.engines)) != len(self.engines):
            raise ValueError("engines: each engine at most once")
        error = combination_error(self, lambda f: f.name)  # as `quantkit bench` checks its options
        if error:
            raise ValueError(error)
        return self


FORMAT_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,49}$"  # an export format's name (a directory of the run: RUN_DIR/FMT/)


class ExportConfig(StrictConfig):
    max_shard_size: str = "5GB"
    # Serving formats written beside each variant's artifact, by the exporter registry
    # (export/export_registry.py, a higher layer: `quantkit run` checks the names against it before anything
    # runs); "gguf" = exact GGUF for llama.cpp, refused (not approximated) where the grid has no GGUF type.
    formats: tuple[Annotated[str, StringConstraints(pattern=FORMAT_PATTERN)], ...] = ()


# Names become directory names (`runs/NAME`, `runs/NAME/artifacts/VARIANT`): plain names only, so
# `name: ../../x` or `name: /tmp/x` can never make `run` write outside its run directory.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"

# Variant names `quantkit run` gives its own rows. A run adds the unmodified checkpoint as
# "baseline" (its report row, runs/NAME/gguf/baseline.gguf) unless a variant says `baseline: true`;
# a quantized variant of that name would take over that row. Compared ignoring case: names are
# file names, and two that differ in case alone are one file on macOS and Windows file systems.
# (Every other path a run writes - steps.json, report.*, plots/, artifacts/, gguf/ - sits beside
# artifacts/ and gguf/, never inside them, and its files' names start with '.' or end in
# .quantkit.json beside NAME.gguf, so no plain name collides with them.)
BASELINE_NAME = "baseline"
RESERVED_NAMES = {BASELINE_NAME: "the unmodified source checkpoint's row, which `quantkit run` adds"}


def reserved(name: str) -> str | None:
    """What a reserved name stands for, or None for a name a variant may take."""
    return RESERVED_NAMES.get(name.lower())


# llama-quantize's target types quantkit makes (tools/quantize/quantize.cpp QUANT_OPTIONS of the
# llama.cpp llama-cpp-python vendors): every quantizing type but the ternary and MoE-only ones and
# the 1-bit ones. quantkit/gguf/llama_quantize.py makes them; named here so a recipe is checked when read.
GGUF_TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q2_K_S",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ2_M",
    "IQ3_XXS",
    "IQ3_XS",
    "IQ3_S",
    "IQ3_M",
    "IQ4_NL",
    "IQ4_XS",
)


# ggml types `mixed:` may give a decoder-layer weight (quantize/kquant_chooser.py makes each with
# llama-quantize --pure).
GGUF_MIXABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


class GgufVariantConfig(StrictConfig):
    """A variant that llama.cpp's own tools make from the source checkpoint, as a llama.cpp user would:
    its exact F16 GGUF, then llama-quantize `type`, with an importance matrix (llama-imatrix) over the
    text of the run's calibration windows when `imatrix` is true. `mixed`: quantkit chooses each
    decoder-layer weight's type among `mixed_types` within `type`'s own file size (`export --mixed`)."""

    type: str
    imatrix: bool = True
    mixed: bool = False
    mixed_types: tuple[str, ...] | None = None  # None: export --mixed's default list

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v.upper() not in GGUF_TYPES:
            raise ValueError(f"{v!r} is not a type quantkit makes with llama-quantize; valid: {', '.join(GGUF_TYPES)}")
        return v.upper()

    @field_validator("mixed_types")
    @classmethod
    def _mixable(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        names = tuple(t.upper() for t in v)
        bad = [t for t in names if t not in GGUF_MIXABLE]
        if bad or not names or len(set(names)) != len(names):
            raise ValueError(
                f"{bad[0] + ' is ' if bad else ''}not a list of types a weight may take, each once; "
                f"valid: {', '.join(GGUF_MIXABLE)}"
            )
        return names

    @model_validator(mode="after")
    def _types_with_mixed(self) -> "GgufVariantConfig":
        if self.mixed_types is not None and not self.mixed:
            raise ValueError("mixed_types: the types `mixed: true` chooses among; give it with mixed")
        return self


class Variant(StrictConfig):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    # A variant without steps is the unmodified checkpoint, and must say so: a step-less variant
    # named like a quantized one (an include whose steps were lost) would be reported as one.
    baseline: bool = False
    steps: tuple[Step, ...] = ()
    gguf: GgufVariantConfig | None = None  # made by llama.cpp's llama-quantize instead of steps

    @property
    def kv_cache(self):
        """Its quantize step's `kv_cache:` (core/kv_cache.py KvCacheConfig), or None."""
        return next((s.quantize.kv_cache for s in self.steps if getattr(s.quantize, "kv_cache", None)), None)

    @model_validator(mode="after")
    def _not_reserved(self) -> "Variant":
        if reserved(self.name) and not self.baseline:  # `baseline: true` *is* that checkpoint: it may keep the name
            raise ValueError(_reserved_message(self.name, "variant"))
        if self.gguf is not None and (self.steps or self.baseline):
            raise ValueError(
                "gguf: llama-quantize makes this variant from the source checkpoint; it takes no steps "
                "and is not the baseline"
            )
        return self


def _reserved_message(name: str, what: str) -> str:
    return (
        f"name {name!r} is reserved for {reserved(name)}; name this {what} otherwise "
        f"(reserved names, in any letter case: {', '.join(RESERVED_NAMES)})"
    )


def _check_steps(steps: tuple[Step, ...]) -> None:
    kinds = [s.kind for s in steps]
    if kinds.count("quantize") > 1 or kinds.count("gqa") > 1 or kinds.count("transform") > 1:
        raise ValueError("at most one gqa step, one transform step and one quantize step")
    if kinds == ["quantize", "gqa"]:
        raise ValueError("gqa must come before quantize (a quantized model cannot be re-headed)")
    _check_transform_step(steps, kinds)
    _check_kv_cache(steps)


def _check_kv_cache(steps: tuple[Step, ...]) -> None:
    """FP8 K/V scales are calibrated on the calibration windows, in the step's own pass."""
    for s in steps:
        kv = getattr(s.quantize, "kv_cache", None)
        if kv is not None and kv.fp8 is not None and not METHODS[s.quantize.method].calibrates:
            raise ValueError(
                f"kv_cache.fp8: the K/V scales are calibrated on the calibration windows, which method "
                f"{s.quantize.method} reads none of; use {spoken(names('calibrates'))} (kv_cache.llamacpp alone "
                "needs no calibration)"
            )


def _check_transform_step(steps: tuple[Step, ...], kinds: list[str]) -> None:
    """A rotation only pays off under quantization, and llm-compressor applies it in the same pass."""
    if "transform" not in kinds:
        return
    i = kinds.index("transform")
    if kinds[i + 1 : i + 2] != ["quantize"]:
        raise ValueError("a transform step must be followed by its quantize step (gqa, then transform, then quantize)")
    method = steps[i + 1].quantize.method
    if not METHODS[method].rotates:
        raise ValueError(f"a transform step composes with {spoken(names('rotates'))} (llm-compressor), not {method}")


def _check_effective_steps(recipe: "Recipe") -> None:
    """Only a variant marked `baseline: true` (or run's implicit baseline) converts nothing."""
    if not recipe.variants and not recipe.steps:
        raise ValueError("no steps and no variants: nothing to convert")
    if sum(v.baseline for v in recipe.variants) > 1:
        raise ValueError("more than one variant has baseline: true")
    for i, v in enumerate(recipe.variants):
        if v.baseline and v.steps:
            raise ValueError(
                f"variants[{i}] ({v.name}): baseline: true is the unmodified checkpoint, it takes no steps"
            )
        if not v.baseline and not v.steps and v.gguf is None:
            raise ValueError(
                f"variants[{i}] ({v.name}): no steps; give it steps (or recipe: FILE) or gguf: {{type: T}}, "
                "or mark the unmodified checkpoint with baseline: true"
            )


class Recipe(StrictConfig):
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
        if self.steps and reserved(self.name):  # a one-variant recipe's name is its variant's (all_variants)
            raise ValueError(_reserved_message(self.name, "recipe") + "; without name: a recipe takes its file's name")
        names = [v.name.lower() for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError("variant names must be unique, ignoring case (each names a directory)")
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
