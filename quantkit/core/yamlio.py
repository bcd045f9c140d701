"""User YAML (recipes, calibration mixes, lever studies): read safely, and what is wrong said in one line.

`NoAliasLoader` is safe_load without aliases: `*ref` expands to shared objects, and nested ones
make a few hundred bytes validate as billions of nodes (the "billion laughs" document).
`format_validation_error` turns pydantic's first error into `SOURCE: key.path[0]: message`.
"""

from __future__ import annotations

import types
from typing import Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator


class NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases, and without duplicate keys: YAML's loaders keep the last of two
    `steps:` without a word, so half of a recipe would be ignored."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the base constructor says so
                    break
                if first != key_node.start_mark.line + 1:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {first})", key_node.start_mark
                    )
        return super().construct_mapping(node, deep=deep)


class StrictConfig(BaseModel):
    """The base of every config read from a user's YAML (recipes, method steps, studies, mixes):
    unknown keys refused, frozen once read, numbers finite (`.nan` and `.inf` are YAML floats, and
    an infinite budget or duration never ends), and a boolean is not a number (pydantic's lax
    mode reads `true` as 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value, info: ValidationInfo):
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric(field.annotation):
            raise ValueError("expected a number, not true or false")
        return value


def _numeric(annotation) -> bool:
    """int or float, alone or in a union (`float | None`); bool is neither here."""
    if annotation in (int, float):
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_numeric(a) for a in get_args(annotation))
    return False


def format_loc(loc: tuple | list) -> str:
    """('steps', 0, 'gqa') -> 'steps[0].gqa'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def message(err: dict) -> str:
    """One pydantic error as a user reads it (no pydantic vocabulary)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch" and err["loc"] and err["loc"][-1] == "name":
        return (
            "must be a plain name (letters, digits, '.', '_', '-', starting with a letter or digit, at most 100): "
            "it names a directory"
        )
    msg = err["msg"]
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg[:1].lower() + msg[1:]


def format_validation_error(source: str, exc: ValidationError, origin=None) -> str:
    """`origin(loc)` may name where a key came from (an included file, a --set) as (source, loc)."""
    errors = exc.errors()
    loc = list(errors[0]["loc"])
    source, loc = (origin(loc) if origin else None) or (source, loc)
    line = f"{source}: {format_loc(loc) + ': ' if loc else ''}{message(errors[0])}"
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more)"
    return line
