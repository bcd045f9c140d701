"""quantkit.load.load_stats on hand-made timings (values computed by hand) and on recorded ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.load.config import Slo
from quantkit.load.degrade import degraded_first
from quantkit.load.load_stats import (
    analyze,
    find_knee,
    is_saturated,
    max_qps_within_slo,
    percentiles,
    should_stop,
    summarize_step,
)
from quantkit.load.request_timings import RequestRecord
from quantkit.load.step_record import Latency, Step

RECORDED = Path(__file__).parent / "load_fixtures" / "recorded_transformers_serve.json"


def _records() -> list[RequestRecord]:
    ok1 = RequestRecord(
        t_send=0.0,
        t_first=0.1,
        t_end=0.4,
        chunk_times=[0.1, 0.2, 0.3, 0.4],
        output_tokens=4,
        prompt_tokens=10,
        tokens_from_usage=True,
        client_s=0.001,
    )
    ok2 = RequestRecord(
        t_send=0.0,
        t_first=0.3,
        t_end=0.35,
        chunk_times=[0.3, 0.35],
        output_tokens=2,
        prompt_tokens=12,
        tokens_from_usage=True,
        client_s=0.003,
    )
    failed = RequestRecord(t_send=0.1, t_end=0.12, error="http_5xx", status=500)
    timed_out = RequestRecord(t_send=0.2, t_end=1.0, error="timeout")
    return [ok1, ok2, failed, timed_out]


def test_percentiles_hand_computed():
    out = percentiles([0.001 * v for v in range(1, 101)]).to_json()  # 1..100 ms
    assert out["n"] == 100
    assert out["p50"] == pytest.approx(50.5)
    assert out["p90"] == pytest.approx(90.1)
    assert out["p99"] == pytest.approx(99.01)
    assert out["mean"] == pytest.approx(50.5)
    assert percentiles([]).to_json() == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_step_summary_hand_computed():
    step = summarize_step(_records(), mode="concurrency", offered=2, t_start=0.0, slo=Slo()).to_json()
    assert step["requests"] == 4 and step["completed"] == 2
    assert step["duration_s"] == pytest.approx(1.0)  # first send to the last end, failures included
    assert step["achieved_qps"] == pytest.approx(2.0)
    assert step["output_tokens_per_s"] == pytest.approx(6.0)
    assert step["prompt_tokens_mean"] == pytest.approx(11.0)
    assert step["tokens_from_usage"] is True
    assert step["ttft_ms"]["p50"] == pytest.approx(200) and step["ttft_ms"]["p99"] == pytest.approx(298)
    # TPOT = (end - first) / (tokens - 1): 300 ms / 3 = 100 ms and 50 ms / 1 = 50 ms
    assert step["tpot_ms"]["p50"] == pytest.approx(75) and step["tpot_ms"]["p99"] == pytest.approx(99.5)
    assert step["itl_ms"]["n"] == 4 and step["itl_ms"]["p50"] == pytest.approx(100)
    assert step["e2e_ms"]["p50"] == pytest.approx(375)
    assert step["errors"]["http_5xx"] == 1 and step["timeouts"] == 1 and step["error_count"] == 2
    assert step["goodput"] is None
    assert step["client"]["parse_ms"]["p50"] == pytest.approx(0.5)  # 1, 3, 0, 0 ms


@pytest.mark.parametrize(
    "slo, good",
    [(Slo(ttft_ms=200), 1), (Slo(tpot_ms=60), 1), (Slo(ttft_ms=500, tpot_ms=200), 2), (Slo(ttft_ms=50), 0)],
)
def test_goodput_counts_requests_within_every_slo(slo, good):
    step = summarize_step(_records(), mode="concurrency", offered=2, t_start=0.0, slo=slo).to_json()
    assert step["goodput"]["qps"] == pytest.approx(good / 1.0)
    assert step["goodput"]["fraction"] == pytest.approx(good / 4)


def _step(offered, qps, ttft, tpot, partial=False):
    return Step(
        offered=offered,
        achieved_qps=qps,
        output_tokens_per_s=qps * 10,
        ttft_ms=Latency(p99=ttft),
        tpot_ms=Latency(p99=tpot),
        partial=partial,
    )


SATURATING = [_step(1, 10, 30, 7.0), _step(2, 19, 35, 7.2), _step(4, 21, 120, 7.5), _step(8, 21, 250, 7.6)]


def test_saturation_needs_flat_throughput_and_rising_ttft():
    assert not is_saturated(SATURATING[0], SATURATING[1])  # 90% more req/s for 100% more load
    assert is_saturated(SATURATING[1], SATURATING[2])  # +10% req/s, TTFT x3.4
    assert not is_saturated(_step(2, 19, 35, 7), _step(4, 20, 36, 7))  # flat but TTFT steady
    assert not is_saturated(_step(2, 19, 35, 7), _step(4, 36, 90, 7))  # TTFT up but still scaling
    assert is_saturated(_step(2, 19, 35, 7), _step(4, 0.0, None, None))  # everything failed


def test_knee_is_the_last_step_that_still_scaled():
    knee = find_knee(SATURATING).to_json()
    assert knee["index"] == 1 and knee["offered"] == 2 and knee["saturated_step"] == 2
    assert knee["achieved_qps"] == 19 and knee["ttft_p99_ms"] == 35
    assert find_knee([_step(1, 10, 30, 7), _step(2, 19, 31, 7), _step(4, 36, 33, 7)]) is None


def test_stop_after_patience_saturated_steps():
    assert not should_stop(SATURATING[:2], 1)
    assert should_stop(SATURATING[:3], 1)
    assert not should_stop(SATURATING[:3], 2)
    assert should_stop(SATURATING, 2)


def test_which_latency_degraded_first():
    first = degraded_first(SATURATING).to_json()
    assert first["first"] == "ttft" and first["ttft_step"] == 2 and first["tpot_step"] is None
    assert first["cause"] == "unknown" and "not split" in first["meaning"]  # hand-made steps carry no parts
    tpot_first = [_step(1, 10, 50, 10), _step(2, 19, 55, 16), _step(4, 30, 90, 30)]
    first = degraded_first(tpot_first).to_json()
    assert first["first"] == "tpot" and first["tpot_step"] == 1 and first["ttft_step"] == 2
    assert first["cause"] == "unknown" and "bandwidth" not in first["meaning"]  # never by default
    same_step = [_step(1, 10, 50, 10), _step(2, 12, 200, 16)]
    assert degraded_first(same_step).first == "ttft"  # x4 beats x1.6
    assert degraded_first([_step(1, 10, 50, 10), _step(2, 20, 52, 11)]).first is None


def test_max_qps_within_slo_and_analysis():
    assert max_qps_within_slo(SATURATING, Slo(ttft_ms=100)).index == 1
    assert max_qps_within_slo(SATURATING, Slo(tpot_ms=7.1)).index == 0
    assert max_qps_within_slo(SATURATING, Slo()) is None
    analysis = analyze(SATURATING + [_step(16, 5, 900, 8, partial=True)], Slo(ttft_ms=100)).to_json()
    assert analysis["knee"]["index"] == 1 and analysis["saturated_steps"] == [2, 3]
    assert analysis["peak"]["achieved_qps"] == 21 and not analysis["peak"]["partial"]
    assert analysis["degraded_first"]["first"] == "ttft"
    # a cut-short last step that ran faster than any full one is the peak ...
    cut = analyze(SATURATING[:2] + [_step(4, 30, 60, 8, partial=True)], Slo(ttft_ms=100)).to_json()
    assert cut["peak"] == {"index": 2, "offered": 4, "achieved_qps": 30, "output_tokens_per_s": 300, "partial": True}
    assert cut["max_qps_within_slo"]["index"] == 2 and cut["max_qps_within_slo"]["partial"]
    assert cut["knee"] is None and cut["saturated_steps"] == []  # ... but is never judged saturated


def test_a_cut_step_runs_until_it_was_cut():
    """Throughput of an interrupted step: completed requests over start -> cut, in-flight ones unfinished."""
    done = [
        RequestRecord(t_send=0.0, t_first=0.1, t_end=0.5, chunk_times=[0.1], output_tokens=1, done=True)
        for _ in range(3)
    ]
    in_flight = RequestRecord(t_send=0.6)
    step = summarize_step(
        done + [in_flight], mode="concurrency", offered=4, t_start=0.0, slo=Slo(), partial=True, t_stop=2.0
    ).to_json()
    assert step["duration_s"] == 2.0 and step["achieved_qps"] == pytest.approx(1.5)
    assert step["requests"] == 4 and step["completed"] == 3 and step["unfinished"] == 1
    assert step["error_count"] == 0


def test_recorded_timings_reproduce_the_reported_step():
    """Requests recorded from a live `transformers serve` run give back the step that run reported."""
    run = json.loads(RECORDED.read_text())
    slo = Slo(**run["config"]["slo"])
    for reported, raw in zip(run["steps"], run["requests"]):
        records = [RequestRecord.from_dict(r) for r in raw]
        # kept requests are stored with times relative to their step's start
        again = summarize_step(
            records, mode=reported["mode"], offered=reported["offered"], t_start=0.0, slo=slo
        ).to_json()
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert again[metric] == pytest.approx(reported[metric])
            assert again[metric]["p50"] <= again[metric]["p90"] <= again[metric]["p99"]
        assert again["completed"] == reported["completed"] and again["tokens_from_usage"]
        assert again["achieved_qps"] == pytest.approx(reported["achieved_qps"])
