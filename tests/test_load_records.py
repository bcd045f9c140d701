"""The load side's records (load/step_record.py, load/load_analysis.py, load/load_comparison.py,
load/lever_records.py): a run built from requests reads back to the same JSON, and the committed
results (benchmarks/results) read as records."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from quantkit.core.atomic import json_safe
from quantkit.load.compare import render_load_comparison
from quantkit.load.config import LoadConfig, Slo
from quantkit.load.cpu import Placement
from quantkit.load.lever_records import LeverStudy
from quantkit.load.levers_report import render_table
from quantkit.load.load_analysis import Analysis
from quantkit.load.load_run import build_run
from quantkit.load.load_stats import summarize_step
from quantkit.load.load_steps import Progress
from quantkit.load.request_timings import RequestRecord
from quantkit.load.runfile import LeverServer, LoadRun
from quantkit.load.step_record import Step

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
RECORDED = Path(__file__).parent / "load_fixtures" / "recorded_transformers_serve.json"


def _progress(repeats: int = 2) -> tuple[LoadConfig, Progress]:
    """The recorded requests of a live run, each step measured `repeats` times (so levels pool)."""
    data = json.loads(RECORDED.read_text())
    cfg = LoadConfig(url="http://127.0.0.1:1", model="m", mode="concurrency", levels=(1, 2), slo=Slo(ttft_ms=5000))
    progress = Progress()
    for repeat in range(repeats):
        for reported, raw in zip(data["steps"], data["requests"]):
            records = [RequestRecord.from_dict(r) for r in raw]
            step = summarize_step(records, mode="concurrency", offered=reported["offered"], t_start=0.0, slo=cfg.slo)
            progress.steps.append(replace(step, phase="climb" if not repeat else "repeat", repeat=repeat))
            progress.step_records.append(records)
            progress.step_deltas.append(None)  # a recorded run: no /metrics
            progress.step_starts.append(0.0)
    progress.stopped = "bounds"
    return cfg, progress


def test_a_run_reads_back_to_the_json_it_wrote():
    cfg, progress = _progress()
    run = build_run(cfg, progress, keep_requests=True)
    data = json.loads(json.dumps(json_safe(run.to_json())))
    again = LoadRun.from_json(data, "run.json")
    assert json.loads(json.dumps(json_safe(again.to_json()))) == data
    assert [s.phase for s in again.levels] == ["pooled", "pooled"] and again.levels[0].steps == 2
    assert again.levels[0].samples is None and again.steps[0].samples is not None  # the steps keep them
    assert "samples" not in data["levels"][0] and "steps" not in data["steps"][0]
    assert again.analysis.slo_knee is not None and again.analysis.slo_knee.levels[0].steps == 2


@pytest.mark.parametrize("engine", ["llama-server", "vllm"])
def test_the_committed_load_parts_runs_read_as_records(engine):
    """benchmarks/results/load_parts.json keeps each run's levels, analysis, cores and server."""
    run = json.loads((RESULTS / "load_parts.json").read_text())["runs"][engine]
    for level in run["levels"]:
        step = Step.from_json(level)
        assert step.to_json() == level
    assert Analysis.from_json(run["analysis"]).to_json() == run["analysis"]
    assert Placement.from_json(run["cpu"]).to_json() == run["cpu"]
    assert LeverServer.from_json(run["server"]).to_json() == run["server"]
    parts = [Step.from_json(level).parts for level in run["levels"]]
    assert all(p is not None and p.queue_ms.mean is not None for p in parts)


def _committed_studies() -> list:
    """Each lever study a committed result keeps (its `study`, or each of its `studies`)."""
    found = []
    for path in sorted(RESULTS.glob("*levers*.json")):
        data = json.loads(path.read_text())
        studies = {"study": data["study"]} if "study" in data else data.get("studies") or {}
        found += [pytest.param(study, id=f"{path.stem}:{name}") for name, study in studies.items()]
    return found


@pytest.mark.parametrize("data", _committed_studies())
def test_the_committed_lever_studies_read_as_records(data):
    """Their study.json (without its runs) reads: the table, the comparison, the prefix reference;
    keys an older study did not write read as None."""
    study = LeverStudy.from_json(data)
    assert [row.lever for row in study.table] == [row["lever"] for row in data["table"]]
    written = study.to_json()
    for key in ("table",):
        for old, new in zip(data[key], written[key]):
            assert {k: new[k] for k in old} == old
    for old, new in zip(data["comparison"]["runs"], written["comparison"]["runs"]):
        assert {k: new[k] for k in old} == old
    assert written["comparison"]["matched_levels"] == data["comparison"]["matched_levels"]
    if "prefix_reference" in data:
        ref = written["prefix_reference"]["levers"]
        assert [{k: r[k] for k in old} for r, old in zip(ref, data["prefix_reference"]["levers"])] == data[
            "prefix_reference"
        ]["levers"]
    assert render_table(study).startswith("| lever | changes |")
    assert render_load_comparison(study.comparison).startswith("| run | SLO knee [95%] |")
