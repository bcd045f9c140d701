"""User YAML (recipes, calibration mixes, lever studies): read safely, and what is wrong said in one line.

`NoAliasLoader` is safe_load without aliases: `*ref` expands to shared objects, and nested ones
make a few hundred bytes validate as billions of nodes (the "billion laughs" document).
`format_validation_error` turns pydantic's first error into `SOURCE: key.path[0]: message`.
"""

from __future__ import annotations

import yaml
from pydantic import ValidationError


class NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)


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
