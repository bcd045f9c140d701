"""benchmarks/lever_tables.py: a finished study's tables (the knee with its interval and its move, or
P99s per level against the baseline's), on a study.json made by hand."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import lever_tables  # noqa: E402


def _step(level, ttft_p50, ttft_p99, tpot_p50=20.0, tpot_p99=25.0, rejected=0, accepted=None):
    return {
        "offered": level,
        "requests": 34,
        "completed": 34 - rejected,
        "errors": {"rejected": rejected},
        "ttft_ms": {"p50": ttft_p50, "p99": ttft_p99},
        "tpot_ms": {"p50": tpot_p50, "p99": tpot_p99},
        "ttft_parts": {"prefill_ms": {"mean": 300.0}, "share": {"queue": 0.1}},
        "draft_acceptance": accepted,
        "goodput": {"qps": 1.0},
        "cpu": {"client": 0.02},
    }


def _row(name, knee, ci, shift=None, censored=None):
    return {
        "lever": name,
        "changes": "baseline" if shift is None else "cache_prompt=True",
        "slo_knee": knee,
        "slo_knee_ci95": ci,
        "slo_knee_censored": censored,
        "slo_knee_bound": 1 if censored else None,
        "slo_knee_qps": 0.5,
        "slo_knee_shift": shift,
        "first_queue_share": 0.02,
        "last_queue_share": 0.7,
        "first_cache_hit": 0.9,
        "cause": "scheduling",
        "class_ttft_p99_ms": None,
        "requests_per_level": [102, 34, 102],
        "client_cpu_max": 0.02,
    }


def _study(rows, steps):
    runs = [
        {"levels": s, "steps": s, "config": {"mode": "concurrency"}, "analysis": {"slo_knee": {"slo": {"class": None}}}}
        for s in steps
    ]
    return {"table": rows, "runs": runs}


def test_the_knee_table_says_moved_only_with_an_interval_off_one():
    moved = {"ratio": 2.4, "ci95": [1.9, 3.1], "moved": True}
    study = _study(
        [_row("no-cache", 1.4, [1.2, 1.6]), _row("cache", 3.4, [2.9, 3.8], moved)],
        [[_step(1, 2000, 2300), _step(2, 5000, 6000)], [_step(1, 400, 500), _step(4, 3900, 4500)]],
    )
    table = lever_tables.study_table("agent", study)
    rows = {r["lever"]: r for r in table["rows"]}
    assert rows["cache"]["knee"] == "3.40 [2.90, 3.80]" and rows["cache"]["shift"] == "×2.40 [1.90, 3.10] moved"
    assert rows["no-cache"]["shift"] == "baseline" and rows["cache"]["queue_shares"] == "2% → 70%"
    unmoved = {"ratio": 1.1, "ci95": [0.8, 1.4], "moved": False}
    study["table"][1]["slo_knee_shift"] = unmoved
    assert lever_tables.study_table("agent", study)["rows"][1]["shift"].endswith("not moved")
    study["table"][1].update(slo_knee_censored="above", slo_knee_bound=8)
    assert lever_tables.study_table("agent", study)["rows"][1]["knee"] == "> 8"


def test_the_matched_table_holds_each_levels_difference():
    study = _study(
        [_row("no-spec", None, None), _row("ngram", None, None, {})],
        [[_step(1, 200, 220), _step(4, 500, 600)], [_step(1, 180, 200, 9.0, 11.0, accepted=0.8), _step(4, 400, 500)]],
    )
    diff = {"difference_ms": -14.0, "ci95": [-15.0, -13.0], "moved": True}
    study["comparison"] = {"matched_levels": [{"offered": 1, "runs": [{}, {"tpot_p99_vs_base": diff}]}]}
    table = lever_tables.study_table("copy", study)
    ngram = [r for r in table["rows"] if r["lever"] == "ngram"]
    assert ngram[0]["tpot_diff"] == "-14 [-15, -13] moved" and ngram[0]["accepted"] == "80%"
    assert ngram[1]["tpot_diff"] is None  # level 4: not in the comparison's matched levels
    headers = [c["header"] for c in lever_tables.study_table("admission", study)["columns"]]
    assert "rejected" in headers and "goodput req/s" in headers
