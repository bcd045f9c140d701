"""A command's click options made from its settings record's fields (core/option_fields.py), and
the settings read back from what click parsed: an option's flag, type, default and help are the
field's, so they are written once (vLLM's add_cli_args / from_cli_args, over a dataclass)."""

from __future__ import annotations

import types
from dataclasses import Field
from typing import Any, Callable, Union, get_args, get_origin, get_type_hints

import click

from quantkit.cli._common import int_list
from quantkit.core.option_fields import (
    FLAG,
    FLOATS,
    INTS,
    MANY,
    ONOFF,
    SWITCH,
    WORDS,
    default_of,
    flag,
    option_fields,
    spec,
)
from quantkit.errors import QuantkitError


def cli_fields(settings_cls: type) -> list[Field]:
    """The fields of `settings_cls` that are command-line options, in their order."""
    return [f for f in option_fields(settings_cls) if spec(f).cli is not None]


def settings_options(settings_cls: type) -> Callable:
    """A decorator adding a click option for each of `settings_cls`'s command-line fields, in the
    fields' order; the command receives each under the field's name."""
    hints = get_type_hints(settings_cls)
    made = [_click_option(f, hints[f.name]) for f in cli_fields(settings_cls)]

    def decorate(command: Callable) -> Callable:
        for add in reversed(made):  # click lists the last applied first
            command = add(command)
        return command

    return decorate


def _click_option(f: Field, hint: Any) -> Callable:
    s, default = spec(f), default_of(f)
    help_text = s.help or None
    if s.cli == SWITCH:
        name = flag(f)[2:]
        return click.option(f"--{name}/--no-{name}", f.name, default=default, show_default=True, help=help_text)
    if s.cli == FLAG:
        return click.option(flag(f), f.name, is_flag=True, default=default, help=help_text)
    if s.cli == ONOFF:
        return click.option(flag(f), f.name, type=click.Choice(["on", "off"]), default=None, help=help_text)
    if s.cli == MANY:
        return click.option(flag(f), f.name, multiple=True, metavar=s.metavar, help=help_text)
    if s.cli in (INTS, FLOATS, WORDS):  # comma-separated text, read into the tuple by settings_from_cli
        text = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in default) if default else None
        return click.option(
            flag(f),
            f.name,
            default=text,
            show_default=s.show_default and text is not None,
            metavar=s.metavar,
            help=help_text,
        )
    kind = click.Choice(s.choices) if s.choices else _scalar(hint)
    return click.option(
        flag(f),
        f.name,
        type=kind,
        default=default,
        show_default=s.show_default and default is not None,
        metavar=s.metavar,
        help=help_text,
    )


def _scalar(hint: Any) -> Any:
    """int, float or text: the field's type without its None."""
    args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, types.UnionType) else []
    base = args[0] if len(args) == 1 else hint
    return base if base in (int, float) else str


def _items(text: str, kind: str, option: str) -> tuple:
    """Comma-separated text -> a tuple: of integers (int_list), numbers, or words (empty ones dropped)."""
    if kind == INTS:
        return int_list(text, option)
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    if kind == WORDS:
        return words
    try:
        return tuple(float(w) for w in words)
    except ValueError:
        raise QuantkitError(f"{option} {text!r}: expected comma-separated numbers, e.g. 3.5,4,4.5") from None


def settings_from_cli(settings_cls: type, values: dict, **given: Any):
    """`settings_cls` built from click's values of its command-line fields (comma-separated lists
    read into tuples: a malformed one is one line naming its flag), plus `given`."""
    out = dict(given)
    for f in cli_fields(settings_cls):
        if f.name not in values:  # not an option of this command: the field's default
            continue
        value, kind = values[f.name], spec(f).cli
        if kind in (INTS, FLOATS, WORDS):
            value = default_of(f) if value is None else _items(value, kind, flag(f))
        elif kind == MANY:
            value = tuple(value) or default_of(f)
        elif kind == ONOFF:
            value = {"on": True, "off": False, None: None}[value]
        out[f.name] = value
    return settings_cls(**out)
