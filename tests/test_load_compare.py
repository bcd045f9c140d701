"""compare_load_runs / render_load_comparison: how far the knee moved between two load runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from load_fixtures.fake_server import FakeOpenAI

from quantkit.cli import cli
from quantkit.load.compare import compare_load_runs, render_load_comparison
from quantkit.load.config import LoadError, Slo
from quantkit.load.load_comparison import LoadComparison
from quantkit.load.load_stats import analyze
from quantkit.load.plot import plot_runs
from quantkit.load.runfile import LoadRun, is_load_run
from quantkit.load.step_record import Step

FIXTURES = Path(__file__).parent / "load_fixtures"


def _run(slots: int, label: str) -> dict:
    server = FakeOpenAI(slots=slots).start()
    try:
        result = CliRunner().invoke(
            cli,
            [
                "load",
                server.url,
                "--model",
                "m",
                "--gen-len",
                "8",
                "--prompt-len",
                "16",
                "--concurrency",
                "1,2,4,8",
                "--step-seconds",
                "2",
                "--max-requests",
                "12",
                "--label",
                label,
                "--json",
            ],
        )
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_more_slots_move_the_knee(tmp_path):
    one, four = _run(1, "1 slot"), _run(4, "4 slots")
    result = compare_load_runs([one, four]).to_json()
    assert result["kind"] == "load-comparison" and result["baseline"] == "1 slot"
    base, other = result["runs"]
    assert base["knee_offered"] == 1 and other["knee_offered"] == 4
    assert other["knee_qps_ratio"] > 2.5  # ideal: x4
    assert [level["offered"] for level in result["matched_levels"]] == [1, 2]  # both stopped by then
    # no SLO: the saturation knees are shown, but a move is not judged without an interval
    assert "cannot judge a move (the runs share no SLO)" in result["verdicts"][0]
    text = render_load_comparison(LoadComparison.from_json(result))
    assert text.startswith("| run | SLO knee [95%] |") and "| 4 slots | - | concurrency=4 |" in text
    assert "At matched offered load" in text
    png = plot_runs([LoadRun.from_json(r, r["label"]) for r in (one, four)], tmp_path / "both.png")
    assert png.stat().st_size > 1000


def _stub(label, knee, peak=10.0, mode="concurrency"):
    step = {
        "offered": 1,
        "requests": 4,
        "completed": 4,
        "error_count": 0,
        "achieved_qps": peak,
        "ttft_ms": {"p99": 10.0},
        "tpot_ms": {"p99": 1.0},
    }
    return {
        "kind": "load-run",
        "schema_version": 1,
        "label": label,
        "config": {"mode": mode},
        "stopped": "bounds",
        "steps": [step],
        "analysis": {
            "knee": knee
            and {
                "offered": 1,
                "achieved_qps": knee,
                "output_tokens_per_s": 1.0,
                "ttft_p99_ms": 1.0,
                "tpot_p99_ms": 1.0,
            },
            "peak": {"offered": 1, "achieved_qps": peak, "output_tokens_per_s": 100.0},
            "degraded_first": {"first": None},
            "max_qps_within_slo": None,
        },
    }


def test_runs_without_a_knee_and_mixed_modes():
    result = compare_load_runs([_stub("a", 5.0), _stub("b", None, peak=12.0, mode="rate")]).to_json()
    assert result["matched_levels"] == []
    assert "cannot judge a move" in result["verdicts"][0] and "peaks 10.00 -> 12.00" in result["verdicts"][0]
    assert result["runs"][1]["peak_qps_ratio"] == pytest.approx(1.2)
    render_load_comparison(LoadComparison.from_json(result))


def test_rejects_files_that_are_not_load_runs():
    assert is_load_run(_stub("a", 1.0)) and not is_load_run({"kind": "bench"}) and not is_load_run([])
    with pytest.raises(LoadError, match="run 2 is not a quantkit load run"):
        compare_load_runs([_stub("a", 1.0), {"kind": "bench"}])
    with pytest.raises(LoadError, match="schema_version 3"):
        compare_load_runs([_stub("a", 1.0), {**_stub("b", 1.0), "schema_version": 3}])
    bad = _stub("b", 1.0)
    bad["steps"][0]["offered"] = "lots"
    with pytest.raises(LoadError, match=r"run 2: steps\[0\]\.offered"):
        compare_load_runs([_stub("a", 1.0), bad])
    with pytest.raises(LoadError, match="at least two"):
        compare_load_runs([_stub("a", 1.0)])


def test_the_attribution_runs_in_the_docs():
    """docs/LOAD.md's figures: transformers serve on the demo model, batching off vs on."""
    runs = [json.loads((FIXTURES / f"attribution_{name}.json").read_text()) for name in ("nocb", "cb")]
    for run in runs:  # the stored analysis is what the steps give today
        again = analyze([Step.from_json(s) for s in run["steps"]], Slo(**run["config"]["slo"])).to_json()
        stored = run["analysis"]["peak"]  # recorded before the peak said whether it was a partial step
        assert again["knee"] == run["analysis"]["knee"] and {k: again["peak"][k] for k in stored} == stored
    result = compare_load_runs(runs).to_json()
    nocb, cb = result["runs"]
    assert nocb["knee_offered"] == cb["knee_offered"] == 1  # the knee rule did not move
    assert cb["peak_qps_ratio"] == pytest.approx(1.33, abs=0.01)
    assert (nocb["max_qps_within_slo"], cb["max_qps_within_slo"]) == pytest.approx((0.42, 0.69), abs=0.005)
    at_4 = result["matched_levels"][2]["runs"]
    assert at_4[0]["ttft_p99_ms"] > 5 * at_4[1]["ttft_p99_ms"]
