"""The rule check and the prefill split: non-negative terms, recovered from points made by known
coefficients, and never a negative time per step whatever the points."""

import math

import numpy as np
import pytest

from quantkit.core.fits import GOOD_FIT, PrefillFit, RuleFit, describe_fit, fit_prefill, fit_rule
from quantkit.core.record_checks import RecordError


def _points(n=12, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.uniform(50e6, 300e6, n)
    kv = rng.uniform(0, 200e6, n)
    c = rng.uniform(0, 0.02, n)
    return [{"weight_bytes": a, "kv_bytes": b, "compute_s": d} for a, b, d in zip(w, kv, c)]


def test_recovers_known_terms():
    pts = _points()
    y = [0.003 + p["weight_bytes"] / 10e9 + p["kv_bytes"] / 5e9 + 1.0 * p["compute_s"] for p in pts]
    fit = fit_rule(pts, y)
    assert fit.overhead_ms == pytest.approx(3.0, rel=1e-6)
    assert fit.effective_gbps == pytest.approx(10.0, rel=1e-6)
    assert fit.kv_gbps == pytest.approx(5.0, rel=1e-6)
    assert fit.coef["compute_s"] == pytest.approx(1.0, rel=1e-6)
    assert fit.holds and fit.worst_deviation < 1e-9 and fit.r2 == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(6))
def test_never_a_negative_term(seed):
    """Points a bytes-only line fits with a negative intercept (compute-bound at the big end):
    every coefficient stays >= 0, the bytes-only intercept is reported and named."""
    rng = np.random.default_rng(seed)
    pts = _points(10, seed)
    # the time grows faster than the bytes: compute that tracks the bytes superlinearly
    y = [p["weight_bytes"] / 20e9 + (p["weight_bytes"] / 1e8) ** 2 * 0.004 + rng.normal(0, 1e-4) for p in pts]
    for p in pts:
        p["kv_bytes"] = 1e6  # no KV variation: that term is left out
        p["compute_s"] = (p["weight_bytes"] / 1e8) ** 2 * 0.004
    fit = fit_rule(pts, y)
    assert all(v >= 0 for v in fit.coef.values())
    assert fit.overhead_ms is None or fit.overhead_ms >= 0
    assert "kv_bytes" not in fit.coef
    only = fit_rule([{"weight_bytes": p["weight_bytes"]} for p in pts], y)
    assert only.overhead_ms is None or only.overhead_ms >= 0
    if only.bytes_only_overhead_ms is not None and only.bytes_only_overhead_ms < 0:
        assert "no step can take" in describe_fit(only)


def test_a_term_that_does_not_vary_is_left_out():
    pts = [{"weight_bytes": w, "kv_bytes": 5e6, "compute_s": 0.0} for w in (1e8, 2e8, 3e8)]
    fit = fit_rule(pts, [0.002 + w / 1e10 for w in (1e8, 2e8, 3e8)])
    assert set(fit.coef) == {"overhead", "weight_bytes"}
    assert "did not vary" in describe_fit(fit)


def test_too_few_points():
    assert fit_rule([{"weight_bytes": 1e8}], [0.01]).coef == {}
    assert describe_fit(fit_rule([], [])) is None


def test_round_trip_and_refusal():
    fit = fit_rule(_points(5), [0.01, 0.02, 0.015, 0.03, 0.02])
    data = fit.to_json()
    assert data["overhead_ms"] == fit.overhead_ms  # derived figures for readers
    assert RuleFit.from_json(data) == fit
    bad = {**data, "coef": {"overhead": -0.001}}
    with pytest.raises(RecordError, match=">= 0"):
        RuleFit.from_json(bad)
    with pytest.raises(RecordError):
        RuleFit.from_json({**data, "coef": {"overhead": float("nan")}})


def test_deviation_flag():
    pts = [{"weight_bytes": w} for w in (1e8, 2e8, 3e8, 4e8)]
    y = [0.01, 0.02, 0.06, 0.04]  # one point far off any line
    fit = fit_rule(pts, y)
    assert fit.worst_deviation > GOOD_FIT and fit.holds is False
    assert "(!)" in describe_fit(fit)


def test_prefill_split():
    ps = [128, 256, 512, 1024, 2048, 4096]
    y = [5.0 + 0.4 * p + 2e-4 * p * p for p in ps]
    f = fit_prefill(ps, y)
    assert f.fixed_ms == pytest.approx(5.0, rel=1e-5)
    assert f.per_token_ms == pytest.approx(0.4, rel=1e-6)
    assert f.per_token2_ms == pytest.approx(2e-4, rel=1e-5)
    assert f.crossover_tokens == pytest.approx(2000.0, rel=1e-4)
    assert PrefillFit.from_json(f.to_json()) == f


def test_prefill_never_negative_and_needs_three_lengths():
    assert fit_prefill([128, 256], [1.0, 2.0]) is None
    f = fit_prefill([128, 256, 512, 1024], [100.0, 90.0, 200.0, 420.0])
    assert min(f.fixed_ms, f.per_token_ms, f.per_token2_ms) >= 0
    linear = fit_prefill([100, 200, 300], [10.0, 20.0, 30.0])
    assert linear.crossover_tokens is None or math.isinf(linear.crossover_tokens) or linear.per_token2_ms < 1e-9


def test_prefill_fits_short_prompts_as_well_as_long_ones():
    # noise of a few percent on every length: an absolute fit lets the 8k prompt's error decide the
    # fixed part of the 128-token one; each point weighs by its relative error instead
    ps = [128, 256, 512, 1024, 2048, 4096, 8064]
    noise = [1.03, 0.97, 1.02, 0.98, 1.03, 0.97, 1.02]
    y = [(20.0 + 1.8 * p + 6e-4 * p * p) * e for p, e in zip(ps, noise)]
    f = fit_prefill(ps, y)
    assert all(abs(r - 1) < 0.06 for r in f.measured_over_model)


def test_prefill_keeps_disturbed_lengths_out():
    ps = [128, 256, 512, 1024, 2048]
    y = [5.0 + 0.4 * p for p in ps]
    y[2] *= 3  # another process took the cores during this length's prefills
    f = fit_prefill(ps, y, [False, False, True, False, False])
    assert f.excluded == (512,) and f.points == 4
    assert f.per_token_ms == pytest.approx(0.4, rel=1e-5)
    assert fit_prefill(ps, y, [True, True, True, False, False]) is None  # fewer than three left
    old = {k: v for k, v in f.to_json().items() if k != "excluded"}  # a file written before the field
    assert PrefillFit.from_json(old).excluded == ()
