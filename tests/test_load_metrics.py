"""quantkit.load.metrics: Prometheus histograms parsed, subtracted over a step, read as quantiles."""

from __future__ import annotations

import math

import pytest

from quantkit.load.metrics import Histogram, Scrape, parse_counters, parse_histograms

PAGE = """# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 2.5
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 6.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 8.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 8.0
vllm:request_queue_time_seconds_bucket{engine="1",le="0.3",model_name="m"} 2.0
vllm:request_queue_time_seconds_bucket{engine="1",le="0.5",model_name="m"} 2.0
vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.1
vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:odd_bucket{le="not a number"} 3
garbage line without a value
vllm:label_with_space_bucket{model_name="a b}c",le="1"} 1
vllm:label_with_space_count{model_name="a b}c"} 1
vllm:label_with_space_sum{model_name="a b}c"} 0.5
"""


def test_histograms_are_summed_over_label_sets_and_odd_lines_skipped():
    found = parse_histograms(PAGE)
    queue = found["vllm:request_queue_time_seconds"]
    assert queue.buckets == ((0.3, 6.0), (0.5, 8.0), (math.inf, 10.0))
    assert queue.sum == pytest.approx(2.6) and queue.count == 10.0 and queue.mean == pytest.approx(0.26)
    assert "vllm:num_requests_running" not in found and "vllm:odd" not in found
    assert found["vllm:label_with_space"].count == 1  # a quoted label value may hold } and spaces


def test_quantiles_within_their_bucket():
    h = Histogram(((0.3, 6.0), (0.5, 8.0), (math.inf, 10.0)), sum=2.6, count=10.0)
    assert h.quantile(0.3) == pytest.approx((0.15, 0.0, 0.3))  # rank 3 of 6 in [0, 0.3]
    assert h.quantile(0.7) == pytest.approx((0.4, 0.3, 0.5))  # rank 7: halfway through (0.3, 0.5]
    value, low, high = h.quantile(0.99)  # in the +Inf bucket: the last finite bound, open above
    assert (value, low, high) == (0.5, 0.5, math.inf)
    assert Histogram(((1.0, 0.0), (math.inf, 0.0)), 0.0, 0.0).quantile(0.5) is None


def test_a_step_is_the_difference_of_two_scrapes():
    before = {"q": Histogram(((0.3, 4.0), (math.inf, 5.0)), 1.0, 5.0)}
    after = {
        "q": Histogram(((0.3, 6.0), (math.inf, 9.0)), 3.0, 9.0),
        "new": Histogram(((1.0, 1.0), (math.inf, 1.0)), 0.5, 1.0),
    }
    step = Scrape(after, {"drafts_total": 30.0}).minus(Scrape(before, {"drafts_total": 10.0}))
    assert (
        step.histograms["q"] == Histogram(((0.3, 2.0), (math.inf, 4.0)), 2.0, 4.0) and step.histograms["q"].mean == 0.5
    )
    assert step.histograms["new"] == after["new"] and step.counters == {"drafts_total": 20.0}
    restarted = {"q": Histogram(((0.1, 1.0), (math.inf, 1.0)), 0.05, 1.0)}  # other buckets: taken whole
    assert Scrape(restarted, {}).minus(Scrape(before, {})).histograms["q"] == restarted["q"]


def test_counters_are_summed_over_label_sets():
    page = (
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 8.0\n'
        "vllm:spec_decode_num_accepted_tokens_total 30\n"
        "# TYPE x counter\nvllm:num_requests_running 2\nbad_total nan\n"
    )
    assert parse_counters(page) == {
        "vllm:spec_decode_num_draft_tokens_total": 48.0,
        "vllm:spec_decode_num_accepted_tokens_total": 30.0,
    }
