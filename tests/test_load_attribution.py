"""quantkit.load.bench_bound: the device's bound read from a bench result's rows (`--attribution`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from quantkit.bench.bench_records import BenchResult
from quantkit.core.attribution import FixedCosts, KernelTime, attribute
from quantkit.load.bench_bound import read_attribution
from quantkit.load.config import LoadError

V2 = Path(__file__).parent / "bench_v2.json"


def _bench(tmp_path: Path, kernel_s: tuple[float, ...]) -> Path:
    """The schema-2 fixture migrated, each row given an attribution whose kernel time decides its bound."""
    result = BenchResult.from_json(json.loads(V2.read_text()))
    fixed = FixedCosts(2.0, 1e-3, (256, 2304), (2.8, 4.8), 0.5, "twin")
    rows = []
    for row, seconds in zip(result.rows, kernel_s):
        kernels = (KernelTime("Q4_0", 80e6, 2 * 140e6, seconds),)
        found = attribute(20.0, 80e6, 20e6, 1000.0, 10e9, kernels, fixed, ("probe",), {"flash_attn": False})
        rows.append(dataclasses.replace(row, attribution=found))
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(dataclasses.replace(result, rows=tuple(rows)).to_json()))
    return path


def test_the_bound_every_row_shares_or_the_named_rows(tmp_path):
    result = BenchResult.from_json(json.loads(V2.read_text()))
    names = [r.name for r in result.rows]
    path = _bench(tmp_path, (0.05,) * len(names))  # kernels far beyond the bytes: compute-bound
    found = read_attribution(str(path))
    assert found.bound == "compute" and "attribution.bound" in found.source
    named = read_attribution(f"{path}#{names[0]}")
    assert named.bound == "compute" and names[0] in named.source


def test_refusals_are_one_line(tmp_path):
    with pytest.raises(LoadError, match="cannot read"):
        read_attribution(str(tmp_path / "none.json"))
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(LoadError, match="not valid JSON"):
        read_attribution(str(tmp_path / "x.json"))
    (tmp_path / "y.json").write_text('{"kind": "load-run"}')
    with pytest.raises(LoadError, match="not a quantkit bench result"):
        read_attribution(str(tmp_path / "y.json"))
    with pytest.raises(LoadError, match="no row carries an attribution"):
        read_attribution(str(V2))  # schema 2: before rows were attributed
    path = _bench(tmp_path, (0.05,) * 8)
    with pytest.raises(LoadError, match="no row named 'nope'"):
        read_attribution(f"{path}#nope")
