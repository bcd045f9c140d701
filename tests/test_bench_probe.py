"""The device probe: spread over repeats, drift between two probes, the cache size, a real run
in a child process (small buffer). No timing is asserted."""

import pytest
import torch

from quantkit.bench import probe


def test_spread_by_hand():
    # work 8 over times 1, 2, 4 s: rates 8, 4, 2
    s = probe.spread([1.0, 2.0, 4.0], 8.0, 1.0)
    assert s == {"best": 8.0, "median": 4.0, "worst": 2.0, "spread_pct": 75.0}


def test_drift_flags_the_figures_the_roofline_uses():
    before = {"read_gbps": 50.0, "copy_gbps": 25.0, "bf16_matmul_tflops": 2.0}
    d = probe.drift(before, {**before, "read_gbps": 40.0})
    assert d["flagged"] and d["worst"] == "read_gbps" and d["change"]["read_gbps"] == pytest.approx(-0.2)
    assert not probe.drift(before, {**before, "read_gbps": 45.0})["flagged"]  # 10%: within the limit
    assert not probe.drift(before, {**before, "copy_gbps": 10.0})["flagged"]  # copy is reported, not used
    assert probe.drift(before, {**before, "bf16_matmul_tflops": 2.5})["flagged"]
    assert probe.DRIFT_LIMIT == 0.15


def test_probe_runs_and_reports_spread(monkeypatch):
    p = probe.run_probe(torch.device("cpu", 0))  # QUANTKIT_PROBE_MIB=64 in tests
    assert p["read_gbps"] > 0 and p["bf16_matmul_tflops"] > 0
    for key in ("read_gbps", "copy_gbps", "bf16_matmul_tflops"):
        sp = p["spread"][key]
        assert sp["worst"] <= sp["median"] <= sp["best"] == p[key] and 0 <= sp["spread_pct"] < 100
    assert p["llc_bytes"] is None or p["llc_bytes"] > 0
    assert probe.load_probe(torch.device("cpu")) == p  # one cache file per device type for the CPU


def test_a_dtype_the_cpu_only_emulates_costs_the_probe_one_product():
    """Repeats stop once a dtype's timed products pass the budget; a warm-up slower than the budget
    is the one timing (an emulated float16 product took over 7 s: eight were a minute a probe)."""
    import time

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.03)

    assert len(probe._times(slow, lambda: None, 7, budget_s=0.01)) == 1 and len(calls) == 1
    calls.clear()
    assert len(probe._times(slow, lambda: None, 7, budget_s=0.07)) == 3 and len(calls) == 4  # warm-up + 3
    calls.clear()
    assert len(probe._times(slow, lambda: None, 2)) == 2 and len(calls) == 3  # no budget: every repeat


def test_the_cached_probe_is_measured_again_when_it_lacks_the_dtypes_or_is_another_cpus(monkeypatch):
    """A probe from before the per-dtype rates, or one another CPU wrote into a shared home, is not
    the one the dtype is chosen from."""
    from quantkit.core.atomic import write_json
    from quantkit.home import subdir

    measured = []
    fresh = {"name": probe.devices.name(torch.device("cpu")), "matmul_tflops": {"bfloat16": 0.05, "float32": 0.5}}
    monkeypatch.setattr(probe, "run_probe", lambda device, threads=None: measured.append(device) or fresh)
    cached = subdir("probe") / "cpu.json"
    for stale in ({"name": fresh["name"], "bf16_matmul_tflops": 1.0}, {**fresh, "name": "another CPU"}):
        write_json(cached, stale)
        assert probe.load_probe(torch.device("cpu")) == fresh
    write_json(cached, fresh)
    assert probe.load_probe(torch.device("cpu")) == fresh and len(measured) == 2  # a current one is read
    assert probe.compute_precision(torch.device("cpu")).dtype == "float32"  # bf16 a tenth of float32
    assert probe.compute_precision(torch.device("cpu"), "bfloat16").dtype == "bfloat16"  # unless asked


def test_cli_probe_prints_spread(cli, monkeypatch):
    fake = {
        "device": "cpu",
        "name": "fake",
        "threads": 2,
        "read_gbps": 20.0,
        "copy_gbps": 10.0,
        "bf16_matmul_tflops": 1.0,
        "llc_bytes": 32 << 20,
        "measured_at": "t",
        "method": "m",
        "spread": {
            k: {"best": v, "median": v * 0.9, "worst": v * 0.8, "spread_pct": 20.0}
            for k, v in (("read_gbps", 20.0), ("copy_gbps", 10.0), ("bf16_matmul_tflops", 1.0))
        },
    }
    monkeypatch.setattr(probe, "run_probe", lambda device, threads=None: fake)
    code, out, err, _ = cli("bench", "--probe", "--device", "cpu")
    assert code == 0, err
    assert "read 20 GB/s (median 18, spread 20%)" in out and "last-level cache 33.6 MB" in out
