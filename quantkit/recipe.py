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
    try:
        value = yaml.load(raw, Loader=_NoAliasLoader) if raw.strip() else None  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        raise RecipeError(f"--set {assignment}: the value is not valid YAML") from None
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
    if kind == "string_pattern_mismatch" and err["loc"] and err["loc"][-1] == "name":
        return ("must be a plain name (letters, digits, '.', '_', '-', starting with a letter or digit, at most 100): "
                "it names a directory")
    msg = err["msg"]
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg[:1].lower() + msg[1:]


def format_validation_error(source: str, exc: ValidationError, origin=None) -> str:
    """`origin(loc)` may name where a key came from (an included file, a --set) as (source, loc)."""
    errors = exc.errors()
    first = errors[0]
    loc = _clean_loc(first["loc"])
    source, loc = (origin(loc) if origin else None) or (source, loc)
    line = f"{source}: {format_loc(loc) + ': ' if loc else ''}{_message(first)}"
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


MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; anything larger is not one


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without YAML aliases: `*ref` expands to shared objects, and nested ones make a
    few hundred bytes validate as billions of nodes (the "billion laughs" document)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed in recipes", event.start_mark)
        return super().compose_node(parent, index)


def _read_recipe_text(p: Path, label: str) -> str:
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_RECIPE_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"{label}: cannot read the recipe ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError(f"{label}: not a recipe (larger than {MAX_RECIPE_BYTES >> 20} MiB)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{label}: not a recipe: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}; a binary file?)") from None
    if "\x00" in text:
        raise RecipeError(f"{label}: not a recipe: it contains NUL bytes (a binary file?)")
    return text


def plain_name(stem: str) -> str:
    """A file stem as a recipe name (the default `name:`): characters a name may not hold become '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).lstrip("._-")[:100] or "recipe"


def load_raw(path: str | Path, label: str | None = None) -> Any:
    """The YAML document of a recipe file (a mapping gets its default `name:`); `label` names the file in errors."""
    p, label = Path(path), label or str(path)
    if not p.is_file():
        raise RecipeError(f"{label}: no such recipe file")
    try:
        data = yaml.load(_read_recipe_text(p, label), Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(exc, "problem", None)
        raise RecipeError(f"{label}: not valid YAML{where}{': ' + problem if problem else ''}") from None
    if data is None:
        data = {}
    if isinstance(data, dict):
        data.setdefault("name", plain_name(p.stem))
    return data


def _not_a_mapping(label: str, data: Any) -> RecipeError:
    kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}" if not isinstance(data, str) else "text"
    return RecipeError(f"{label}: not a recipe (the file holds {kind}; a recipe is a YAML mapping of keys such as steps:)")


def include_target(path: Path, ref: Any, where: str, roots: tuple[Path, ...]) -> Path:
    """`variants[i].recipe: REF` -> the file, which must lie (symlinks resolved) in the including
    recipe's directory tree or under one of `roots` (--include-dir)."""
    if not isinstance(ref, str) or not ref.strip():
        raise RecipeError(f"{path}: {where}: expected a recipe file name, relative to {path.parent}")
    target = path.parent / ref
    resolved = target.resolve()
    allowed = (path.parent.resolve(), *(Path(r).expanduser().resolve() for r in roots))
    if not any(resolved.is_relative_to(root) for root in allowed):
        raise RecipeError(
            f"{path}: {where}: {ref} resolves to {resolved}, outside the recipe's directory {allowed[0]}; "
            "includes stay in that tree unless you allow another with --include-dir DIR"
        )
    if not resolved.is_file():
        raise RecipeError(f"{path}: {where}: no such recipe file {target}")
    return resolved


def _include_variant_recipes(data: dict[str, Any], path: Path, roots: tuple[Path, ...] = ()) -> dict[int, str]:
    """`variants[i].recipe: other.yaml` takes that file's steps (path relative to this file). The
    included file is validated as a recipe of its own first, so a typo in it names it; returns, per
    variant index, how to name the file its steps came from."""
    variants = data.get("variants")
    included_from: dict[int, str] = {}
    if not isinstance(variants, list):
        return included_from
    for i, variant in enumerate(variants):
        if not isinstance(variant, dict) or "recipe" not in variant:
            continue
        where = f"variants[{i}].recipe"
        ref = variant.pop("recipe")
        target = include_target(path, ref, where, roots)
        label = f"{target} (included by {path}: {where})"
        for key in ("steps", "baseline"):
            if key in variant:
                raise RecipeError(f"{path}: variants[{i}]: give either recipe: or {key}:, not both")
        included = load_raw(target, label)
        if not isinstance(included, dict):
            raise _not_a_mapping(label, included)
        if "variants" in included:
            raise RecipeError(f"{path}: {where}: {ref} is a suite; include single-variant recipes only")
        recipe_from_dict(included, label)  # the same strict validation as a top-level recipe
        variant["steps"] = included.get("steps") or []
        included_from[i] = label
        variant.setdefault("description", included.get("description", ""))
        variant.setdefault("name", included.get("name", plain_name(target.stem)))
    return included_from


def _origin(path, included: dict[int, Path], overrides):
    """Where the key at an error's location was written: a --set, an included recipe, or the file."""

    def origin(loc: list):
        for assignment in overrides:
            keys = parse_key_path(assignment.split("=", 1)[0].strip())
            if loc and (loc[: len(keys)] == keys or keys[: len(loc)] == loc):
                return f"--set {assignment}", loc
        if len(loc) > 2 and loc[0] == "variants" and loc[1] in included and loc[2] == "steps":
            return included[loc[1]], loc[2:]
        return None

    return origin


def load_recipe(path: str | Path, overrides: tuple[str, ...] | list[str] = (), include_dirs: tuple[str, ...] | list[str] = ()) -> Recipe:
    """Read, apply --set overrides, validate. The one entry point for recipe files.

    `include_dirs` are directories besides the recipe's own tree that `variants[i].recipe`
    includes may come from (the user's explicit allowance, never the recipe's)."""
    data = load_raw(path)
    if not isinstance(data, dict):
        raise _not_a_mapping(str(path), data)
    included = _include_variant_recipes(data, Path(path), tuple(Path(d) for d in include_dirs))
    for assignment in overrides:
        apply_override(data, assignment)
    recipe = recipe_from_dict(data, str(path), _origin(path, included, overrides))
    from .methods import check_implemented  # the registry knows what has landed

    check_implemented(recipe, str(path))
    return recipe
