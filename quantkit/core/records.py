"""What every typed record's `from_json` shares: the keys of a JSON object checked against the
record's fields, so a typo or a missing key in a result file is one line where the file is read,
never a column that silently goes missing further on."""

from __future__ import annotations

from dataclasses import fields

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
