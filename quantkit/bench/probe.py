"""Measure this device: memory read and copy bandwidth, bf16 matmul rate, each with its spread
over repeats, and the last-level cache size. Cached per device.

Decode reads weights, so the roofline uses the *read* bandwidth (a streaming reduction over a
buffer far larger than the last-level cache); copy bandwidth (bytes copied per second, the
figure STREAM's "copy" halves) is reported beside it. On a shared machine the figure moves (this
CPU gave 34.5, 54.7 and 64.6 GB/s within 35 minutes), so `quantkit bench` probes before and after
its timings and flags a drift above DRIFT_LIMIT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quantkit import device as devices
from quantkit.core.atomic import write_json
from quantkit.core.hardware import Device
from quantkit.core.precision import Precision, choose
from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.errors import QuantkitError
from quantkit.home import subdir

DRIFT_LIMIT = 0.15  # before/after change that makes every efficiency figure of the run uncertain
MATMUL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Seconds of timed matmuls per dtype, beyond which the repeats stop: a dtype a CPU only emulates is
# known from one product (float16 on an AVX-512 CPU without FP16 ran a 1536^3 product in over 7 s,
# 8 of them a minute of every probe; bf16 without BF16/AMX, over 0.1 s).
MATMUL_BUDGET_S = 1.0
PROBE_MIB = 1024  # a real probe's read buffer (and the copy's destination): beyond any last-level cache
MATMUL_N = {"cpu": 1536, "cuda": 4096}  # the probe's square matmuls


def buffer_bytes() -> int:
    """The probe's buffer: QUANTKIT_PROBE_MIB MiB where set (tests use a small one), else PROBE_MIB."""
    return int(os.environ.get("QUANTKIT_PROBE_MIB", PROBE_MIB)) << 20


def spread(samples_s: list[float], work: float, scale: float) -> dict:
    """Rates (work / time, divided by `scale`) of repeated timings: best, median, worst and the
    spread (best - worst) / best in percent."""

    rates = np.sort(work / np.asarray(samples_s, dtype=np.float64) / scale)
    best, worst = float(rates[-1]), float(rates[0])
    return {
        "best": best,
        "median": float(np.median(rates)),
        "worst": worst,
        "spread_pct": 100.0 * (best - worst) / best,
    }


def _times(fn, sync, repeats: int, budget_s: float | None = None) -> list[float]:
    """`repeats` timings of `fn` after an untimed one; with `budget_s`, fewer once the timed ones
    passed it (at least one), and a warm-up slower than the budget is the one timing (the first
    call's own overhead is small beside a product that slow)."""
    t = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t
    if budget_s is not None and first > budget_s:
        return [first]
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
        if budget_s is not None and sum(out) > budget_s:
            break
    return out


def last_level_cache_bytes(device) -> int | None:
    """The largest cache of the device: L3 (or L2) of CPU 0 from sysfs, the GPU's L2."""

    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None

    sizes = []
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * mult)
    return max(sizes) if sizes else None


def probe(device, buffer_bytes: int = 1 << 30, repeats: int = 7) -> dict:
    def sync():
        devices.synchronize(device)

    a = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    read = spread(_times(lambda a=a: a.sum(), sync, repeats), buffer_bytes, 1e9)
    copy = spread(_times(lambda a=a, b=b: b.copy_(a), sync, repeats), buffer_bytes, 1e9)
    del a, b
    n = MATMUL_N["cuda" if device.type == "cuda" else "cpu"]
    rates = {}
    for dtype in MATMUL_DTYPES:
        x = torch.randn(n, n, dtype=dtype, device=device)
        y = torch.randn(n, n, dtype=dtype, device=device)
        times = _times(lambda x=x, y=y: x @ y, sync, repeats, MATMUL_BUDGET_S)
        rates[str(dtype).removeprefix("torch.")] = spread(times, 2 * n**3, 1e12)
        del x, y
    mm = rates["bfloat16"]
    return {
        "device": str(device),
        "name": devices.name(device),
        "threads": torch.get_num_threads(),
        "read_gbps": read["best"],
        "copy_gbps": copy["best"],
        "bf16_matmul_tflops": mm["best"],
        # each dtype's matmul: a CPU without native bf16/fp16 arithmetic runs them far below float32
        "matmul_tflops": {k: v["best"] for k, v in rates.items()},
        "spread": {"read_gbps": read, "copy_gbps": copy, "bf16_matmul_tflops": mm},
        "llc_bytes": last_level_cache_bytes(device),
        "buffer_bytes": buffer_bytes,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "method": "best of %d: fp32 sum over %d MiB (read), copy_ (bytes copied), %dx%d matmul in %s (each "
        "within %.0f s of repeats)" % (repeats, buffer_bytes >> 20, n, n, ", ".join(rates), MATMUL_BUDGET_S),
    }


def drift(before: dict, after: dict, limit: float = DRIFT_LIMIT) -> dict:
    """Relative change of each probed figure from before the timings to after. Flagged when a
    figure the roofline uses (read bandwidth, matmul rate) moved by more than `limit`."""
    keys = ("read_gbps", "copy_gbps", "bf16_matmul_tflops")
    change = {k: (after[k] - before[k]) / before[k] for k in keys if before.get(k) and after.get(k) is not None}
    used = [k for k in ("read_gbps", "bf16_matmul_tflops") if k in change]
    worst = max(used, key=lambda k: abs(change[k])) if used else None
    return {
        "change": change,
        "limit": limit,
        "worst": worst,
        "flagged": bool(worst is not None and abs(change[worst]) > limit),
    }


def _key(device) -> str:
    return device.type if device.type == "cpu" else f"{device.type}{device.index or 0}"


def run_probe(device, threads: int | None = None) -> dict:
    """Probe in a child process: freeing the 1 GiB buffers in this one would leave glibc's
    adaptive mmap threshold raised, and later allocations here would page-fault (measured:
    a tiny model's TTFT went from 2 ms to 58 ms after an in-process probe). `threads`: the CPU
    threads the engine will use (the probe must measure what they can reach)."""

    argv = [sys.executable, "-m", "quantkit.bench.probe", str(device), *([str(threads)] if threads else [])]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        if signal_name(proc.returncode):  # the probe's child died of a signal: a fault, one line (exit 1)
            raise EngineCrash(crash_line(f"the device probe ({device})", proc.returncode))
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}, no message"])[-1]
        raise QuantkitError(f"device probe failed: {last}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    write_json(subdir("probe") / f"{_key(device)}.json", result)
    return result


def load_probe(device) -> dict:
    """This device's last probe, or a new one where there is none, it is damaged, it lacks the
    per-dtype matmul rates (a probe from before they were kept) or another device made it (a home
    shared between machines)."""
    path = subdir("probe") / f"{_key(device)}.json"
    if path.is_file():
        try:
            p = json.loads(path.read_text())
        except json.JSONDecodeError:
            p = None  # a damaged cache is probed again
        if isinstance(p, dict) and isinstance(p.get("matmul_tflops"), dict) and p.get("name") == devices.name(device):
            return p
    return run_probe(device)


def compute_precision(device, asked: str | None = None, p: dict | None = None) -> Precision:
    """The dtype torch computes in on `device` (core/precision.py's rule): `asked` where given, else
    from `p`'s matmul rates (default: this device's cached probe, probed once where there is none)."""
    if asked is not None:
        return choose(None, asked)
    return choose((p if p is not None else load_probe(device)).get("matmul_tflops"))


def best_matmul(p: dict) -> tuple[str, float]:
    """The dtype whose matmul ran fastest and its TFLOP/s: the compute floor of a prefill is the
    device's fastest arithmetic (probes before the dtypes were measured: bf16)."""
    rates = p.get("matmul_tflops") or {"bfloat16": p["bf16_matmul_tflops"]}
    dtype = max(rates, key=rates.get)
    return dtype, rates[dtype]


@dataclass(frozen=True)
class ProbeFacts:
    """What a bench result takes from a probe besides its rates (as_device): the device's name and
    its torch name, the CPU threads it ran with and the last-level cache's size, where the probe
    found them."""

    name: str | None
    device: str | None
    threads: int | None
    llc_bytes: int | None


def facts(p: dict) -> ProbeFacts:
    return ProbeFacts(p.get("name"), p.get("device"), p.get("threads"), p.get("llc_bytes"))


def as_device(p: dict, dtype: str | None = None) -> Device:
    """A probe's figures in the shape of a datasheet entry (hardware.Device): the read bandwidth and
    the matmul rate of `dtype` (what the engine computes in), else the fastest the probe measured."""
    rates = p.get("matmul_tflops") or {}
    _, tflops = (dtype, rates[dtype]) if dtype in rates else best_matmul(p)
    return Device(
        f"this machine ({p['name']}, {p['device']}, probed)",
        p["read_gbps"] * 1e9,
        tflops * 1e12,
        f"quantkit bench --probe, {p['measured_at']}: {p['method']}",
    )


def cached_probe(device) -> Device:
    return as_device(load_probe(device))


if __name__ == "__main__":
    import sys

    import torch

    if len(sys.argv) > 2:
        torch.set_num_threads(int(sys.argv[2]))
    print(json.dumps(probe(torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu"), buffer_bytes=buffer_bytes())))
