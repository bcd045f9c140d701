"""A recipe section made from a settings record's options (core/option_fields.py): each option
that is a recipe key becomes a pydantic field with the option's type, default, values and bound,
so the section and the command line take the same values and refuse the same ones. Where a
section differs from its command on purpose, the difference is data: a key spelled otherwise is
the option's `key`, a default of the section's own is given to `section_model` by name."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import Field, create_model

from quantkit.core.option_fields import Option, default_of, option_fields, section_key, spec


def section_model(name: str, settings_cls: type, base: type, defaults: dict[str, Any] | None = None) -> type:
    """A model named `name` on `base` (a StrictConfig, with any keys of the section that are not
    options) with a field for each of `settings_cls`'s options that a recipe sets, in their order,
    under its key. `defaults` (field name -> value) are the section's own defaults where they
    differ from the command's; a None there makes the key optional."""
    own = dict(defaults or {})
    hints = get_type_hints(settings_cls)
    found = {}
    for f in section_fields(settings_cls):
        s, hint = spec(f), hints[f.name]
        default = own.pop(f.name, default_of(f))
        if default is None:
            hint = hint | None
        scalar_ge = None if _is_tuple(_without_none(hint)[0]) else s.ge
        found[section_key(f)] = (
            _recipe_type(hint, s),
            Field(default, ge=scalar_ge, pattern=s.pattern, description=s.help or None),
        )
    if own:
        raise TypeError(f"{name}: defaults for no key of the section: {', '.join(own)}")
    return create_model(name, __base__=base, __module__=base.__module__, **found)


def section_fields(settings_cls: type) -> list:
    """The options of `settings_cls` that are keys of its recipe section, in their order."""
    return [f for f in option_fields(settings_cls) if spec(f).recipe]


def section_values(section: Any, settings_cls: type) -> dict[str, Any]:
    """A section's values of `settings_cls`'s options, by field name (a renamed key read back)."""
    return {f.name: getattr(section, section_key(f)) for f in section_fields(settings_cls)}


def _is_tuple(hint: Any) -> bool:
    return get_origin(hint) is tuple


def _without_none(hint: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); X -> (X, False)."""
    args = get_args(hint)
    if get_origin(hint) in (Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _recipe_type(hint: Any, s: Option) -> Any:
    """The field's type as a recipe reads it: its choices as a Literal, a tuple's items each bounded
    (strictly: a YAML `true` or "1" is not a depth), Any (a value built later) as text."""
    base, optional = _without_none(hint)
    if _is_tuple(base):
        item = _item_type(get_args(base)[0], s)
        base = tuple[item, ...]
    else:
        base = Literal[s.choices] if s.choices else str if base is Any else base
    return base | None if optional else base


def _item_type(item: Any, s: Option) -> Any:
    if s.choices:
        return Literal[s.choices]
    if s.ge is not None:
        return Annotated[item, Field(strict=True, ge=s.ge)]
    return item
