"""The run report says where each variant's TPOT goes and the lever for its largest term, from the
bench rows' attribution; its rule check line never shows a negative time per step."""

import json
from pathlib import Path

import pytest

from quantkit.bench.bench_records import BenchResult
from quantkit.core.attribution import FixedCosts, KernelTime, attribute
from quantkit.core.fits import RuleFit, fit_rule
from quantkit.core.record_checks import RecordError
from quantkit.pipeline.report import _fit_text, lever_lines, variant_row
from quantkit.pipeline.variant_record import VariantRecord

V2 = Path(__file__).with_name("bench_v2.json")


def _bench_row(measured_ms: float, kernel_s: float):
    from dataclasses import replace

    row = BenchResult.from_json(json.loads(V2.read_text())).rows[0]
    a = attribute(
        measured_ms,
        80e6,
        20e6,
        1000.0,
        10e9,
        (KernelTime("Q4_0", 80e6, 160e6, kernel_s),),
        FixedCosts(1.0, 1e-3, (256.0, 1280.0), (2.0, 3.0), 0.5, "twin"),
    )
    return replace(row, tpot_ms=measured_ms, attribution=a, disturbed=())


def test_each_variant_says_where_its_time_goes():
    fast = variant_row(VariantRecord("int4", bench=_bench_row(10.5, 0.0085)))
    slow = variant_row(VariantRecord("fp16", bench=_bench_row(40.0, 0.037)))
    assert fast["bound"] == "bandwidth" and "quantization" in fast["lever"]
    assert slow["bound"] == "compute" and "Q4_0" in slow["lever"]
    assert "weights" in fast["time_split"] and "overhead" in fast["time_split"]
    lines = lever_lines([fast, slow])
    assert lines[0].startswith("**Where TPOT goes**") and any(
        line.startswith("- fp16 (eager): compute") for line in lines
    )


def test_a_disturbed_row_is_named_in_the_report():
    from dataclasses import replace

    row = variant_row(VariantRecord("x", bench=replace(_bench_row(10.5, 0.0085), disturbed=("its repeats spread",))))
    assert any("disturbed (its repeats spread)" in line for line in lever_lines([row]))


def test_the_rule_check_line_has_no_negative_overhead():
    # points a bytes-only line fits with a negative intercept
    pts = [{"weight_bytes": w, "kv_bytes": 1e6, "compute_s": (w / 1e8) ** 2 * 0.004} for w in (1e8, 2e8, 3e8, 4e8)]
    tpots = [p["weight_bytes"] / 20e9 + p["compute_s"] for p in pts]
    text = _fit_text(fit_rule(pts, tpots), "**Rule check**")
    assert "**Rule check**" in text and "= -" not in text and " -0." not in text.split("bytes-only")[0]
    with pytest.raises(RecordError, match="rule-check fit: missing key 'points'"):  # the old one-term line
        RuleFit.from_json({"effective_gbps": 5.4, "overhead_ms": -9.4, "r2": 0.95})
