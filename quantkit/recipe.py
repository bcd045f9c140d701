"""Recipes: YAML -> frozen, validated objects, checked once at the edge.

Every error names the file and the key path (``recipes/x.yaml: steps[1].quantize.group_size:
must be one of 32, 64, 128 or -1``). Deeper code trusts what comes out of here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import RecipeError

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


class Variant(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    steps: tuple[Step, ...] = ()


def _check_steps(steps: tuple[Step, ...]) -> None:
    kinds = [s.kind for s in steps]
    if kinds.count("quantize") > 1 or kinds.count("gqa") > 1:
        raise ValueError("at most one gqa step and one quantize step")
    if kinds == ["quantize", "gqa"]:
        raise ValueError("gqa must come before quantize (a quantized model cannot be re-headed)")


class Recipe(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = ""
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
        return self

    def all_variants(self) -> tuple[Variant, ...]:
        """The variants a run covers; a single-variant recipe is itself one variant."""
        if self.variants:
            return self.variants
        return (Variant(name=self.name or "variant", description=self.description, steps=self.steps),)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------- loading


_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_key_path(path: str) -> list[str | int]:
    """`steps[0].gqa.kv_heads` -> ['steps', 0, 'gqa', 'kv_heads']."""
    keys: list[str | int] = []
    pos = 0
    for m in _PATH_TOKEN.finditer(path):
        between = path[pos : m.start()]
        if between not in ("", "."):
            raise RecipeError(f"--set {path}: cannot parse key path")
        keys.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if not keys or pos != len(path):
        raise RecipeError(f"--set {path}: cannot parse key path")
    return keys


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `KEY.PATH=VALUE`; the value is parsed as YAML (so 2 is an int, [a] a list)."""
    if "=" not in assignment:
        raise RecipeError(f"--set {assignment}: expected KEY.PATH=VALUE")
    path, raw = assignment.split("=", 1)
    keys = parse_key_path(path.strip())
    value = yaml.safe_load(raw) if raw.strip() else None
    node: Any = data
    for i, key in enumerate(keys[:-1]):
        nxt = keys[i + 1]
        if isinstance(key, int):
            if not isinstance(node, list) or key >= len(node):
                raise RecipeError(f"--set {path}: no list item [{key}] at {format_loc(keys[:i])}")
            node = node[key]
            continue
        if not isinstance(node, dict):
            raise RecipeError(f"--set {path}: {format_loc(keys[:i])} is not a mapping")
        if key not in node or node[key] is None:
            node[key] = [] if isinstance(nxt, int) else {}
        node = node[key]
    last = keys[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise RecipeError(f"--set {path}: no list item [{last}]")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise RecipeError(f"--set {path}: {format_loc(keys[:-1])} is not a mapping")


def format_loc(loc: tuple | list) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _clean_loc(loc: tuple) -> list:
    """Drop pydantic's union tags (the method name) from an error location."""
    cleaned = []
    for i, part in enumerate(loc):
        if i > 0 and loc[i - 1] == "quantize" and part in METHOD_CONFIGS:
            continue
        cleaned.append(part)
    return cleaned


def _message(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "union_tag_invalid":
        return f"unknown method {ctx.get('tag')!r}; valid methods: {', '.join(METHOD_CONFIGS)}"
    if kind == "union_tag_not_found":
        return f"needs a 'method' key; valid methods: {', '.join(METHOD_CONFIGS)}"
    msg = err["msg"]
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg[:1].lower() + msg[1:]


def format_validation_error(source: str, exc: ValidationError, origin=None) -> str:
    """`origin(loc)` may name where a key came from (an included file, a --set) as (source, loc)."""
    errors = exc.errors()
    first = errors[0]
    loc = _clean_loc(first["loc"])
    source, loc = (origin(loc) if origin else None) or (source, loc)
    line = f"{source}: {format_loc(loc)}: {_message(first)}"
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more)"
    return line


def recipe_from_dict(data: Any, source: str = "<recipe>", origin=None) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping at the top level")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(source, exc, origin)) from None


def load_raw(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"{path}: no such recipe file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise RecipeError(f"{path}: not valid YAML{where}") from None
    if data is None:
        data = {}
    if isinstance(data, dict):
        data.setdefault("name", p.stem)
    return data


def _include_variant_recipes(data: dict[str, Any], path: Path) -> dict[int, Path]:
    """`variants[i].recipe: other.yaml` takes that file's steps (path relative to this file);
    returns, per variant index, the file its steps came from."""
    variants = data.get("variants")
    included_from: dict[int, Path] = {}
    if not isinstance(variants, list):
        return included_from
    for i, variant in enumerate(variants):
        if not isinstance(variant, dict) or "recipe" not in variant:
            continue
        ref = variant.pop("recipe")
        target = path.parent / str(ref)
        if not target.is_file():
            raise RecipeError(f"{path}: variants[{i}].recipe: no such recipe file {target}")
        included = load_raw(target)
        if "variants" in included:
            raise RecipeError(f"{path}: variants[{i}].recipe: {ref} is a suite; include single-variant recipes only")
        if "steps" not in variant:
            variant["steps"] = included.get("steps", [])
            included_from[i] = target
        variant.setdefault("description", included.get("description", ""))
        variant.setdefault("name", included.get("name", target.stem))
    return included_from


def _origin(path, included: dict[int, Path], overrides):
    """Where the key at an error's location was written: a --set, an included recipe, or the file."""

    def origin(loc: list):
        for assignment in overrides:
            keys = parse_key_path(assignment.split("=", 1)[0].strip())
            if loc and (loc[: len(keys)] == keys or keys[: len(loc)] == loc):
                return f"--set {assignment}", loc
        if len(loc) > 2 and loc[0] == "variants" and loc[1] in included and loc[2] == "steps":
            return f"{included[loc[1]]} (included by {path}: variants[{loc[1]}].recipe)", loc[2:]
        return None

    return origin


def load_recipe(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> Recipe:
    """Read, apply --set overrides, validate. The one entry point for recipe files."""
    data = load_raw(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping at the top level")
    included = _include_variant_recipes(data, Path(path))
    for assignment in overrides:
        apply_override(data, assignment)
    recipe = recipe_from_dict(data, str(path), _origin(path, included, overrides))
    from .methods import check_implemented  # the registry knows what has landed

    check_implemented(recipe, str(path))
    return recipe
