"""quantkit.load.degrade: which latency degraded first, and the cause the parts or the device name."""

from __future__ import annotations

from quantkit.load.degrade import DeviceBound
from quantkit.load.degrade import degraded_first as _degraded_first
from quantkit.load.step_record import Step


def degraded_first(steps, bound=None) -> dict:
    return _degraded_first([Step.from_json(s) for s in steps], bound).to_json()


def _step(ttft_p99, tpot_p99, queue=None, prefill=None, other=1.0):
    step = {"offered": 1, "ttft_ms": {"p99": ttft_p99}, "tpot_ms": {"p99": tpot_p99}}
    if queue is None:
        step["ttft_parts"] = {"absent": "no timings"}
    else:
        total = queue + prefill + other
        step["ttft_parts"] = {
            "queue_ms": {"mean": queue},
            "prefill_ms": {"mean": prefill},
            "other_ms": {"mean": other},
            "share": {"queue": queue / total, "prefill": prefill / total, "other": other / total},
        }
    return step


def test_a_growing_queue_is_scheduling():
    steps = [_step(100, 10, 2, 97), _step(120, 10, 22, 97), _step(400, 11, 300, 99)]
    found = degraded_first(steps)
    assert found["first"] == "ttft" and found["ttft_step"] == 2 and found["cause"] == "scheduling"
    assert found["part_growth_ms"]["queue_ms"] == 298 and "queue share 2% -> 75%" in found["evidence"]
    assert "scheduling" in found["meaning"] and "slots, priority" in found["meaning"]


def test_a_growing_prefill_is_compute_contention():
    steps = [_step(100, 10, 2, 97), _step(300, 10, 20, 279)]
    found = degraded_first(steps)
    assert found["cause"] == "compute contention" and "chunked prefill" in found["meaning"]


def test_tpot_first_names_the_devices_bound_or_says_unknown():
    steps = [_step(100, 10, 2, 97), _step(110, 20, 4, 105)]
    assert degraded_first(steps)["cause"] == "unknown"
    assert "bandwidth" not in degraded_first(steps)["meaning"]
    bound = DeviceBound("compute", "bench.json row demo (attribution.bound)")
    found = degraded_first(steps, bound)
    assert found["first"] == "tpot" and found["cause"] == "compute" and "bench.json row demo" in found["meaning"]
    assert degraded_first(steps, DeviceBound("bandwidth", "gpu.json"))["cause"] == "bandwidth"


def test_without_parts_the_cause_of_ttft_is_unknown_and_why():
    found = degraded_first([_step(100, 10), _step(300, 10)])
    assert found["cause"] == "unknown" and "no timings" in found["meaning"]
    assert degraded_first([_step(100, 10), _step(110, 11)])["first"] is None
