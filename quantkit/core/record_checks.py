"""What every typed record's `from_json` shares: the keys of a JSON object checked against the
record's fields, so a typo or a missing key in a result file is one line where the file is read,
never a column that silently goes missing further on."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from quantkit.errors import QuantkitError


class RecordError(QuantkitError):
    """A JSON record that is not what its schema says: not an object, an unknown key, a missing one."""


def checked(cls, data, what: str) -> dict:
    """`data` (a JSON object) with exactly the fields of dataclass `cls`, else RecordError naming the key."""
    if not isinstance(data, dict):
        raise RecordError(f"{what}: expected a JSON object, not {type(data).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise RecordError(f"{what}: unknown key {unknown[0]!r} (known: {', '.join(names)})")
    missing = [n for n in names if n not in data]
    if missing:
        raise RecordError(f"{what}: missing key {missing[0]!r}")
    return dict(data)


def of_kind(cls, data, kind: str, what: str) -> dict:
    """`data` checked against `cls`'s fields (`checked`) and holding `kind` as its `kind`, else RecordError."""
    d = checked(cls, data, what)
    if d["kind"] != kind:
        raise RecordError(f"{what}: kind {d['kind']!r}, not {kind!r}")
    return d


# ---- values: a record read back from disk is checked by value too (finite, in range, the right
# type), so a damaged or hand-edited file is one line where it is read, never a negative TPOT in a
# report, a NaN that silently drops a point, or a TypeError deep inside a run.


@dataclass(frozen=True)
class Num:
    """A finite number (never a boolean) of at least `low` (above it when `above`), at most `high`;
    None only where `none`; +infinity only where `infinite` (a figure that could not be computed)."""

    low: float | None = None
    high: float | None = None
    above: bool = False
    none: bool = False
    infinite: bool = False

    def __call__(self, v, what: str):
        if v is None and self.none:
            return None
        if self.infinite and v == math.inf and not isinstance(v, bool):
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RecordError(f"{what}: {v!r} is not a finite number")
        if self.low is not None and (v <= self.low if self.above else v < self.low):
            raise RecordError(f"{what}: {v!r} is not {'above' if self.above else 'at least'} {self.low:g}")
        if self.high is not None and v > self.high:
            raise RecordError(f"{what}: {v!r} is above {self.high:g}")
        return v


@dataclass(frozen=True)
class Whole:
    """A whole number (never a boolean) of at least `low`; None only where `none`."""

    low: int = 0
    none: bool = False

    def __call__(self, v, what: str):
        if v is None and self.none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < self.low:
            raise RecordError(f"{what}: {v!r} is not a whole number of at least {self.low}")
        return v


@dataclass(frozen=True)
class Of:
    """A value of JSON type `kind` (str, bool, dict, list); None only where `none`."""

    kind: type
    none: bool = False

    def __call__(self, v, what: str):
        if (v is None and self.none) or (isinstance(v, self.kind) and (self.kind is bool or not isinstance(v, bool))):
            return v
        raise RecordError(f"{what}: expected {_JSON_NAMES[self.kind]}, not {_json_name(v)}")


_JSON_NAMES = {str: "a string", bool: "true or false", dict: "an object", list: "a list", int: "a whole number"}


def _json_name(v) -> str:
    return "null" if v is None else _JSON_NAMES.get(type(v), type(v).__name__)


COUNT = Whole()
COUNT_OR_NONE = Whole(none=True)
NONNEG = Num(low=0)
NONNEG_OR_NONE = Num(low=0, none=True)
POSITIVE = Num(low=0, above=True)
POSITIVE_OR_NONE = Num(low=0, above=True, none=True)
FRACTION = Num(low=0, high=1)
TEXT = Of(str)
TEXT_OR_NONE = Of(str, none=True)
FLAG = Of(bool)
FLAG_OR_NONE = Of(bool, none=True)
OBJECT = Of(dict)
OBJECT_OR_NONE = Of(dict, none=True)
LIST = Of(list)


def check_values(d: dict, rules: dict, what: str) -> dict:
    """`d` after each key that `rules` names passed its rule (Num, Whole, Of); RecordError names the key."""
    for key, rule in rules.items():
        rule(d[key], f"{what}.{key}")
    return d


def known_keys(cls, data: dict, what: str) -> dict:
    """`data` (a copy) when every key is a field of the dataclass `cls`; else ValueError naming the
    first unknown key and `what` held it."""
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in {what}")
    return dict(data)
