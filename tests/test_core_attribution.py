"""A row's TPOT split into its causes: each term from its own measurement, never negative, the
bound and the lever from the figures."""

import pytest

from quantkit.core.attribution import (
    ATTRIBUTION_TOLERANCE,
    Attribution,
    FixedCosts,
    KernelTime,
    attribute,
    fixed_costs,
)
from quantkit.core.record_checks import RecordError


def test_fixed_costs_from_the_twin():
    # the twin: 2 ms per step fixed, 1 us per cell, 0.5 ms of its own weights
    cells = (256.0, 2304.0)
    tpot = tuple(2.0 + 0.5 + 1e-3 * c for c in cells)
    f = fixed_costs(cells, tpot, 0.5, "twin")
    assert f.kv_ms_per_cell == pytest.approx(1e-3)
    assert f.overhead_ms == pytest.approx(2.0)


def test_cache_time_follows_the_twin_between_its_sizes():
    # a cache whose time per cell rises with the depth (1 us per cell to 2,304, then 3 us): a row at
    # 2,304 cells reads the twin's own figure there, not the line from the first size to the last
    cells = (256.0, 2304.0, 8448.0)
    kv = (0.256, 2.304, 2.304 + 3e-3 * 6144)
    f = fixed_costs(cells, tuple(2.5 + k for k in kv), 0.5, "twin")
    assert f.overhead_ms == pytest.approx(2.0)
    assert f.kv_ms(2304.0) == pytest.approx(2.304)
    assert f.kv_ms(1280.0) == pytest.approx(1.28)
    assert f.kv_ms(5376.0) == pytest.approx(2.304 + 3e-3 * 3072)
    assert f.kv_ms(9448.0) == pytest.approx(kv[-1] + 3e-3 * 1000)  # beyond: the last segment's slope
    assert f.kv_ms(100.0) == pytest.approx(0.1)  # below: the first's
    two = fixed_costs(cells[::2], tuple(2.5 + k for k in kv[::2]), 0.5, "twin")
    assert two.kv_ms(2304.0) > 1.5 * f.kv_ms(2304.0)  # the two-size line overstates the middle
    assert FixedCosts.from_json(f.to_json()) == f


def test_fixed_costs_records_refuse_mismatched_sizes():
    f = fixed_costs((256.0, 2304.0), (2.8, 4.8), 0.5, "twin").to_json()
    for bad in ({"cells": [256.0]}, {"twin_tpot_ms": [2.8]}, {"cells": [2304.0, 256.0]}, {"cells": [256.0, -1.0]}):
        with pytest.raises(RecordError):
            FixedCosts.from_json({**f, **bad})


def test_fixed_costs_clamp_noise_at_zero():
    f = fixed_costs((256.0, 1280.0), (3.0, 2.9), 4.0, "twin")  # faster deeper, weights above the step
    assert f.kv_ms_per_cell == 0.0 and f.overhead_ms == 0.0


def _row(measured=20.0, kernel_s=0.012, fixed=FixedCosts(2.0, 1e-3, (256, 2304), (2.756, 4.804), 0.5, "t")):
    kernels = (KernelTime("Q4_0", 80e6, 2 * 140e6, kernel_s),)
    return attribute(measured, 80e6, 20e6, 1000.0, 10e9, kernels, fixed, ("probe",), {"flash_attn": False})


def test_terms_and_sum():
    a = _row()
    assert a.weights_ms == pytest.approx(8.0)  # 80 MB at 10 GB/s
    assert a.compute_ms == pytest.approx(4.0)  # the kernels took 12 ms for 8 ms of bytes
    assert a.kv_ms == pytest.approx(1.0)  # 1000 cells at 1 us
    assert a.kv_read_ms == pytest.approx(2.0)
    assert a.overhead_ms == pytest.approx(2.0)
    assert a.total_ms == pytest.approx(15.0) and a.explained == pytest.approx(0.75)
    assert not a.holds and abs(_row(measured=15.5).explained - 1) <= ATTRIBUTION_TOLERANCE
    assert a.bound == "bandwidth"
    assert "weights" in a.lever and "quantization" in a.lever


def test_compute_bound_names_the_kernel():
    a = _row(measured=40.0, kernel_s=0.035)
    assert a.bound == "compute" and "Q4_0" in a.lever and "GFLOP/s" in a.lever


def test_kernels_faster_than_the_stream_claim_no_compute():
    assert _row(kernel_s=0.004).compute_ms == 0.0


def test_attention_arithmetic_counts_as_compute():
    fixed = FixedCosts(0.5, 0.02, (256, 8448), (5.62, 169.46), 0.0, "t")
    a = attribute(30.0, 10e6, 50e6, 1000.0, 10e9, (), fixed, (), {"flash_attn": False})
    assert a.kv_ms == pytest.approx(20.0)
    assert a.bound == "compute"  # 20 ms of attention, 5 ms of it reads
    assert "flash attention" in a.lever


def test_without_a_twin_the_cache_is_its_bytes():
    a = _row(fixed=None)
    assert a.kv_ms == a.kv_read_ms and a.overhead_ms == 0.0


def test_round_trip_and_checks():
    a = _row()
    assert Attribution.from_json(a.to_json()) == a
    bad = {**a.to_json(), "overhead_ms": -1.0}
    with pytest.raises(RecordError, match="overhead_ms"):
        Attribution.from_json(bad)
    with pytest.raises(RecordError, match="bound"):
        Attribution.from_json({**a.to_json(), "bound": "luck"})


def test_depths_padded_to_one_cache_size_are_one_size():
    # llama.cpp pads its cache to 256 cells: depths 0 and 64 read the same 257 cells
    f = fixed_costs((257.0, 257.0, 1281.0), (2.8, 2.8, 3.824), 0.5, "twin")
    assert f.cells == (257.0, 1281.0)
    assert f.kv_ms(257.0) == pytest.approx(0.257)
    with pytest.raises(ValueError, match="same cells"):
        fixed_costs((257.0, 257.0), (2.8, 2.9), 0.5, "twin")
