"""Recipe files: reading YAML, includes, `--set` overrides, and errors that name the file and key.

The schema (typed, frozen configs and their cross-checks) is recipe/schema.py; everything that
touches a file or a user's string on its way there is here. Includes (`variants[i].recipe`) stay
in the including recipe's directory tree unless the user allows another directory (--include-dir).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from quantkit.core.yamlio import NoAliasLoader, format_loc, format_validation_error
from quantkit.errors import RecipeError
from quantkit.recipe.schema import Recipe
from quantkit.resources import builtin, find_recipe, recipes_dir

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
        value = yaml.load(raw, Loader=NoAliasLoader) if raw.strip() else None  # noqa: S506 (a SafeLoader)
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


def recipe_from_dict(data: Any, source: str = "<recipe>", origin=None) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping at the top level")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(source, exc, origin)) from None


MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; anything larger is not one


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
        raise RecipeError(
            f"{label}: not a recipe: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}; a binary file?)"
        ) from None
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
        data = yaml.load(_read_recipe_text(p, label), Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise RecipeError(f"{label}: not valid YAML (nested too deeply)") from None
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
    return RecipeError(
        f"{label}: not a recipe (the file holds {kind}; a recipe is a YAML mapping of keys such as steps:)"
    )


def include_target(path: Path, ref: Any, where: str, roots: tuple[Path, ...]) -> Path:
    """`variants[i].recipe: REF` -> the file, which must lie (symlinks resolved) in the including
    recipe's directory tree or under one of `roots` (--include-dir)."""

    if not isinstance(ref, str) or not ref.strip():
        raise RecipeError(f"{path}: {where}: expected a recipe file name, relative to {path.parent}")
    target = path.parent / ref
    shipped = builtin(recipes_dir()).get(ref[:-5] if ref.endswith(".yaml") else ref)
    if not os.path.lexists(target) and shipped is not None:
        return shipped.resolve()  # a built-in recipe by name, where the suite's directory has no such file
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise RecipeError(f"{path}: {where}: {ref} cannot be resolved (a symlink loop?)") from None
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


def load_recipe(
    path: str | Path, overrides: tuple[str, ...] | list[str] = (), include_dirs: tuple[str, ...] | list[str] = ()
) -> Recipe:
    """Read, apply --set overrides, validate. The one entry point for recipe files.

    `include_dirs` are directories besides the recipe's own tree that `variants[i].recipe`
    includes may come from (the user's explicit allowance, never the recipe's). `path` may name a
    built-in recipe (`int4-w4a16-gptq-g64`) where no such file exists."""

    path = find_recipe(path)
    data = load_raw(path)
    if not isinstance(data, dict):
        raise _not_a_mapping(str(path), data)
    included = _include_variant_recipes(data, Path(path), tuple(Path(d) for d in include_dirs))
    for assignment in overrides:
        apply_override(data, assignment)
    return recipe_from_dict(data, str(path), _origin(path, included, overrides))
