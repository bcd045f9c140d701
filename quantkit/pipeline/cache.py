"""`quantkit run`'s step results, stored in RUN_DIR/steps.json under keys hashed from their inputs.

A key covers everything a step's result depends on (quantkit's version, the checkpoint's hash,
the resolved settings, the texts' contents), so a re-run reuses exactly the unchanged steps.
A damaged steps.json, or a damaged record in it, means those steps are done again, with a note.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.core.atomic import write_json
from quantkit.data.mix import fingerprint
from quantkit.errors import QuantkitError
from quantkit.progress import note


def step_key(*parts) -> str:
    """A step's cache key: a hash of everything its result depends on."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def text_fingerprint(spec: str | None) -> str | None:
    """What a text SPEC's content is for a cache key: a file's sha256, a mix's fingerprint, else the SPEC itself."""
    if spec and spec.startswith("mix:"):  # the mix file and its parts' hashes (data/mix.py: fingerprint)
        return f"{spec}:{fingerprint(spec[4:])}"
    if spec and spec.startswith("file:"):
        p = Path(spec[5:]).expanduser()
        if p.is_file():
            return hashlib.sha256(p.read_bytes()).hexdigest()
    return spec


@dataclass
class StepCache:
    """Step results stored in RUN_DIR/steps.json, keyed by content hashes of their inputs."""

    path: Path
    data: dict = field(default_factory=dict)

    @classmethod
    def open(cls, run_dir: Path) -> "StepCache":
        p = run_dir / "steps.json"
        if not p.is_file():
            return cls(p, {})
        try:
            data = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            data = exc
        if not isinstance(data, dict):
            note(
                f"{p} is damaged ({'not valid JSON' if isinstance(data, Exception) else 'not a JSON object'}); "
                "its steps will be done again"
            )
            data = {}
        return cls(p, data)

    def get(self, key: str):
        hit = self.data.get(key)
        return hit if isinstance(hit, dict) else None  # a damaged record: redo the step

    def read(self, key: str, reader, what: str):
        """The record stored under `key` as its typed `reader` (a from_json, which checks its keys
        and values) reads it; None when there is none, or when it does not read (a damaged or edited
        record: the step is done again, with a note naming what was wrong)."""
        hit = self.get(key)
        if hit is None:
            return None
        try:
            return reader(hit)
        except (QuantkitError, TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
            note(f"{what}: the stored result does not read ({first}); doing it again")
            return None

    def put(self, key: str, value) -> None:
        self.data[key] = value
        write_json(self.path, self.data, indent=1, default=str)
