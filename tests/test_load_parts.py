"""TTFT under load split into queue, prefill and the rest, from the server's own timings: per request
(llama.cpp's `timings`), per step (vLLM's /metrics histograms), or absent with the reason."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from load_fixtures.fake_server import FakeOpenAI

from quantkit.cli import cli
from quantkit.load import parts
from quantkit.load.metrics import Histogram
from quantkit.load.request_timings import RequestRecord

# one slot: requests past the first wait for it; 60 ms of prefill, 8 tokens 5 ms apart
ONE_SLOT = {"slots": 1, "prefill_s": 0.06, "token_s": 0.005}
ARGS = ["--model", "m", "--gen-len", "8", "--prompt-len", "16", "--max-requests", "16", "--step-seconds", "20"]


def _load(server: FakeOpenAI, *extra: str) -> dict:
    result = CliRunner().invoke(
        cli, ["load", server.url, *ARGS, "--concurrency", "1,2,4", "--no-stop", *extra, "--json"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_parts_of_one_request_by_hand():
    # sent at 0, first token at 300 ms, end at 500 ms; the server: 100 ms of prompt, 195 ms of decode
    rec = RequestRecord(t_send=0.0, t_first=0.3, t_end=0.5, chunk_times=[0.3, 0.5], output_tokens=2)
    rec.server_prompt_ms, rec.server_predicted_ms = 100.0, 195.0
    queue, prefill, other = parts.request_parts(rec)
    assert (queue, prefill, other) == pytest.approx((205.0, 100.0, -5.0))  # 500 - 100 - 195; 300 - 205 - 100
    assert queue + prefill + other == pytest.approx(300.0)
    step = parts.from_records([rec]).to_json()
    assert step["check"]["mismatched"] == 0 and step["check"]["worst_pct"] == pytest.approx(100 * 5 / 300)
    # a decode the server timed 30 ms shorter than the client saw it: the parts miss TTFT by 10%
    rec.server_predicted_ms = 170.0
    assert parts.from_records([rec]).check.mismatched == 1
    assert parts.request_parts(RequestRecord(t_send=0.0, t_first=0.1, t_end=0.2)) is None  # no timings


def test_parts_from_histograms_by_hand():
    queue = Histogram(((0.1, 2.0), (0.5, 6.0), (float("inf"), 8.0)), sum=1.6, count=8.0)
    prefill = Histogram(((0.1, 8.0), (float("inf"), 8.0)), sum=0.4, count=8.0)
    found = parts.from_histograms({parts.VLLM_QUEUE: queue, parts.VLLM_PREFILL: prefill}, 300.0, 8).to_json()
    assert found["queue_ms"]["mean"] == pytest.approx(200.0) and found["prefill_ms"]["mean"] == pytest.approx(50.0)
    assert found["other_ms"]["mean"] == pytest.approx(50.0) and found["check"]["requests_match"]
    # P50: rank 4 of 8 falls in (0.1, 0.5] holding ranks 3..6: 0.1 + 0.4 * (4 - 2) / 4
    assert found["queue_ms"]["p50"] == pytest.approx(300.0) and found["queue_ms"]["p50_bucket_ms"] == [100.0, 500.0]
    assert found["share"] == pytest.approx({"queue": 2 / 3, "prefill": 1 / 6, "other": 1 / 6})


def test_vllms_queue_runs_from_its_arrival_not_from_its_schedulers_stamp():
    """vLLM stamps a request QUEUED only when its engine loop next takes requests in, between
    steps: a request that arrives during another's 400 ms prefill waits about 200 ms that its
    scheduler's queue (0 here) does not hold, but its own TTFT (from arrival) does. That wait is
    queue, not the front end; other is the client's TTFT beyond vLLM's."""
    queue = Histogram(((0.01, 4.0), (float("inf"), 4.0)), sum=0.0, count=4.0)
    prefill = Histogram(((0.5, 4.0), (float("inf"), 4.0)), sum=1.6, count=4.0)  # 400 ms each
    ttft = Histogram(((1.0, 4.0), (float("inf"), 4.0)), sum=2.4, count=4.0)  # 600 ms from arrival
    found = parts.from_histograms(
        {parts.VLLM_QUEUE: queue, parts.VLLM_PREFILL: prefill, parts.VLLM_TTFT: ttft}, 610.0, 4
    )
    assert found.queue_ms.mean == pytest.approx(200.0) and found.prefill_ms.mean == pytest.approx(400.0)
    assert found.other_ms.mean == pytest.approx(10.0) and found.check.more["scheduler_queue_mean_ms"] == 0.0
    assert parts.VLLM_TTFT in found.source["queue_ms"] and found.check.more["server_ttft_mean_ms"] == pytest.approx(
        600.0
    )


def test_a_server_with_timings_one_slot_queue_grows_prefill_stays():
    server = FakeOpenAI(timings=True, **ONE_SLOT).start()
    try:
        run = _load(server)
    finally:
        server.stop()
    steps = run["steps"]
    found = [s["ttft_parts"] for s in steps]
    assert all(p["per_request"] and p["n"] == p["of"] == 16 for p in found)
    assert "timings.prompt_ms" in found[0]["source"]["prefill_ms"]
    queue = [p["queue_ms"]["p50"] for p in found]
    prefill = [p["prefill_ms"]["p50"] for p in found]
    assert queue[0] < 20 and queue[1] > 40 and queue[2] > 2 * queue[1]  # waits for the one slot
    assert max(prefill) < 1.5 * min(prefill) and min(prefill) >= 55  # the prefill itself does not move
    # the parts add up to each TTFT within 5% (one request a step may lose a few ms to the stub's
    # thread, which shares this process with the client; on a loaded machine, ms of jitter)
    assert all(p["check"]["mismatched"] <= 2 and abs(p["other_ms"]["p50"]) < 10 for p in found)
    assert found[2]["share"]["queue"] > 0.5 > found[0]["share"]["queue"]
    first = run["analysis"]["degraded_first"]
    assert first["first"] == "ttft" and first["cause"] == "scheduling" and "queue" in first["evidence"]


def test_a_server_without_timings_leaves_the_parts_absent_and_says_why():
    server = FakeOpenAI(**ONE_SLOT).start()
    try:
        run = _load(server)
    finally:
        server.stop()
    assert all(set(s["ttft_parts"]) == {"absent"} for s in run["steps"])
    assert "neither per-request timings" in run["steps"][0]["ttft_parts"]["absent"]
    first = run["analysis"]["degraded_first"]
    assert first["first"] == "ttft" and first["cause"] == "unknown" and "not split" in first["meaning"]


def test_a_server_with_vllm_histograms_splits_each_step():
    server = FakeOpenAI(metrics=True, drafts=(8, 6), **ONE_SLOT).start()
    try:
        run = _load(server)
    finally:
        server.stop()
    found = [s["ttft_parts"] for s in run["steps"]]
    assert all(not p["per_request"] and "vllm:request_queue_time_seconds" in p["source"]["queue_ms"] for p in found)
    assert all(p["check"]["requests_match"] and p["n"] == 16 for p in found)  # the warm-up is not in a step
    assert found[0]["queue_ms"]["mean"] < 20 < found[1]["queue_ms"]["mean"] < found[2]["queue_ms"]["mean"]
    assert all(p["prefill_ms"]["mean"] == pytest.approx(60, abs=15) for p in found)
    assert all(p["prefill_ms"]["p99_bucket_ms"] == [50.0, 100.0] for p in found)  # 60 ms: the (50, 100] bucket
    assert run["analysis"]["degraded_first"]["cause"] == "scheduling"
    # speculative decoding from the server's counters over each step (vLLM reports none per answer)
    assert all(s["draft_acceptance"] == pytest.approx(0.75) and s["draft_tokens_mean"] == 8 for s in run["steps"])


def test_a_levels_repeats_pool_the_servers_speculation_counters():
    """vLLM counts drafts over a step (/metrics), not per answer: a level measured twice keeps the
    share of drafts kept, its drafted and accepted tokens summed over the repeats (weighted by
    how many each step drafted, not a mean of the shares)."""
    from quantkit.load.load_stats import VLLM_ACCEPTED, VLLM_DRAFTED, speculation
    from quantkit.load.metrics import Scrape

    server = FakeOpenAI(metrics=True, drafts=(8, 6), **ONE_SLOT).start()
    try:
        run = _load(server, "--repeats", "2")
    finally:
        server.stop()
    assert all(lv["draft_acceptance"] == pytest.approx(0.75) and lv["draft_tokens_mean"] == 8 for lv in run["levels"])
    # the TTFT parts pool the same way: both repeats' histograms summed, the server's count the client's
    assert all(lv["ttft_parts"]["n"] == 32 and lv["ttft_parts"]["check"]["requests_match"] for lv in run["levels"])
    records = [RequestRecord(t_send=0.0, t_first=0.1, t_end=0.2)] * 20
    a = Scrape({}, {VLLM_DRAFTED: 100.0, VLLM_ACCEPTED: 50.0})  # 100 drafted, 50 kept
    b = Scrape({}, {VLLM_DRAFTED: 300.0, VLLM_ACCEPTED: 270.0})  # 300 drafted, 270 kept
    pooled = speculation(records, Scrape.total([a, b]).counters)
    assert pooled == {"draft_tokens_mean": 20.0, "draft_acceptance": pytest.approx(0.8)}
    assert Scrape.total([a, None]) is None  # a step the server did not report: no pooled counters
