"""The device's batch-1 attribution, read from a `quantkit bench --json` result: which resource a
decode step is bound by there (a bench row's `attribution.bound`: bandwidth, compute or overhead,
core/attribution.py), so that "TPOT degraded first" names it rather than assuming one (degrade.py)."""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.bench.bench_records import BenchResult
from quantkit.core.record_checks import RecordError
from quantkit.load.config import LoadError
from quantkit.load.degrade import DeviceBound


def read_attribution(spec: str) -> DeviceBound:
    """`BENCH.json` or `BENCH.json#ROW`: the named row's bound, or the one bound every attributed row shares."""
    path, _, row_name = spec.partition("#")
    try:
        result = BenchResult.from_json(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise LoadError(f"--attribution {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError:
        raise LoadError(f"--attribution {path}: not valid JSON") from None
    except RecordError as exc:
        raise LoadError(f"--attribution {path}: not a quantkit bench result ({exc})") from None
    rows = [r for r in result.rows if not row_name or r.name == row_name]
    if not rows:
        names = ", ".join(r.name for r in result.rows)
        raise LoadError(f"--attribution {path}: no row named {row_name!r} (rows: {names})")
    bounds = {r.attribution.bound for r in rows if r.attribution is not None}
    if not bounds:
        raise LoadError(f"--attribution {path}: no row carries an attribution (bench it again with this quantkit)")
    if len(bounds) > 1:
        raise LoadError(
            f"--attribution {path}: its rows are bound by {', '.join(sorted(bounds))}; name one: {path}#ROW"
        )
    which = f"row {row_name}" if row_name else f"{len(rows)} row(s)"
    return DeviceBound(bound=bounds.pop(), source=f"{Path(path).name} {which} (attribution.bound)")
