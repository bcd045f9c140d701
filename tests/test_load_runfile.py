"""quantkit.load.runfile: a run file read back, checked key by key, schema 1 migrated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.load.config import LoadError
from quantkit.load.runfile import LoadRun

FIXTURES = Path(__file__).parent / "load_fixtures"


def test_a_schema_1_run_reads_with_its_parts_absent():
    data = json.loads((FIXTURES / "attribution_cb.json").read_text())
    assert data["schema_version"] == 1
    run = LoadRun.from_json(data, "attribution_cb.json")
    assert run.schema_version == 2 and run.levels == run.steps and run.analysis.slo_knee is None
    assert all("schema-1" in s.ttft_parts.absent and s.samples is None for s in run.steps)
    assert LoadRun.from_json(run.to_json(), "again") == run


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(kind="bench"), "not a quantkit load run"),
        (lambda d: d.update(schema_version=9), "schema_version 9"),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d.pop("analysis"), "missing key 'analysis'"),
        (lambda d: d["config"].update(mode="burst"), "config.mode"),
        (lambda d: d["steps"][0].update(offered=-1), r"steps\[0\].offered must be a positive"),
        (lambda d: d["steps"][0].update(completed="12"), r"steps\[0\].completed"),
        (lambda d: d["steps"][0].update(samples={"ttft_ms": ["x"], "tpot_ms": []}), "samples.ttft_ms holds 'x'"),
    ],
)
def test_a_bad_run_file_is_one_line(change, message):
    data = json.loads((FIXTURES / "attribution_nocb.json").read_text())
    change(data)
    with pytest.raises(LoadError, match=message):
        LoadRun.from_json(data, "run.json")
