"""A settings field that is also a command-line option and a recipe key, declared once.

A command's settings are a frozen dataclass; each field that a user sets is made with `option()`,
which records in the field's metadata what the two edges need: the help, the flag (when it is not
`--field-name`), the values it takes, its lower bound, and its key where a section spells it
otherwise. `quantkit.cli._options` turns these fields into click options and reads them back into
the settings; `quantkit.recipe.section_fields` turns them into the fields of a recipe section (as
vLLM derives its CLI from EngineArgs' fields). So a default, a help text or a bound is written in
one place.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable

# How the command line spells a field: VALUE (one value, its type the field's), SWITCH (a bool
# as --x/--no-x), FLAG (a bool as --x alone), INTS, FLOATS and WORDS (a tuple as comma-separated
# text), MANY (a tuple as a repeated option; none given: the field's default), ONOFF (a bool or
# None as on | off, not given: None).
VALUE, SWITCH, FLAG, INTS, FLOATS, WORDS, MANY, ONOFF = (
    "value",
    "switch",
    "flag",
    "ints",
    "floats",
    "words",
    "many",
    "onoff",
)


@dataclass(frozen=True)
class Option:
    help: str = ""
    flag: str | None = None  # the command-line flag; None: --field-name
    cli: str | None = VALUE  # one of the spellings above; None: no command-line option
    recipe: bool = True  # a key of the command's recipe section (where the command has one)
    choices: tuple | None = None  # the values it takes (a tuple field: each item's)
    ge: float | None = None  # the least value (a tuple field: each item's)
    metavar: str | None = None
    show_default: bool = True
    pattern: str | None = None  # the recipe's spelling of a text value (a regular expression)
    key: str | None = None  # its key in a recipe section or study file; None: the field's name


def option(default: Any = MISSING, *, default_factory: Any = MISSING, **spec: Any) -> Any:
    """A dataclass field that is also an option: `option(256, help="...", ge=1)`."""
    return field(default=default, default_factory=default_factory, metadata={"option": Option(**spec)})


def spec(f: Field) -> Option | None:
    return f.metadata.get("option")


def option_fields(cls) -> list[Field]:
    """The fields of `cls` that are options, in their order."""
    return [f for f in fields(cls) if spec(f) is not None]


def default_of(f: Field) -> Any:
    """A field's default (its factory's value for a mutable one)."""
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def defaults(cls) -> dict[str, Any]:
    """Each field's default, by name: what a command or a recipe section that omits it gets."""
    return {f.name: default_of(f) for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}


def flag(f: Field) -> str:
    """The field's command-line flag."""
    s = spec(f)
    return (s and s.flag) or "--" + f.name.replace("_", "-")


def section_key(f: Field) -> str:
    """The field's key in a recipe section or study file."""
    s = spec(f)
    return (s and s.key) or f.name


def bound_error(settings: Any, name: Callable[[Field], str] = flag) -> str | None:
    """The first option of `settings` outside its choices or below its bound (a number that is not
    finite included), in one line naming it by `name` (its flag; a recipe names its key); None
    where every one holds."""
    for f in option_fields(type(settings)):
        s, value = spec(f), getattr(settings, f.name)
        items = value if isinstance(value, tuple) else () if value is None else (value,)
        for x in items:
            if s.choices is not None and x not in s.choices:
                return f"{name(f)} {x}: use one of {', '.join(map(str, s.choices))}"
            if s.ge is not None and not _at_least(x, s.ge):
                if isinstance(value, tuple):
                    return f"{name(f)} {','.join(map(str, value))}: each must be at least {s.ge:g}"
                finite = "a finite number, " if isinstance(x, float) else ""
                return f"{name(f)} must be {finite}at least {s.ge:g}, not {x}"
    return None


def _at_least(x: Any, least: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= least
