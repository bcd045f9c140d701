"""Measure this machine: memory read and copy bandwidth, bf16 matmul rate. Cached per device.

Decode reads weights, so the roofline uses the *read* bandwidth (a streaming reduction over a
buffer far larger than the last-level cache); copy bandwidth (bytes copied per second, the
figure STREAM's "copy" halves) is reported beside it.
"""

from __future__ import annotations

import json
import platform
import time

from ..hardware import Device
from ..home import subdir


def _timeit(fn, sync, repeats: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def probe(device: str = "cpu", buffer_bytes: int = 1 << 30, repeats: int = 7) -> dict:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    read = buffer_bytes / _timeit(lambda: a.sum(), sync, repeats)
    copy = buffer_bytes / _timeit(lambda: b.copy_(a), sync, repeats)
    del a, b
    n = 4096 if device == "cuda" else 1536
    x = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    y = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    mm = 2 * n**3 / _timeit(lambda: x @ y, sync, repeats)
    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    return {
        "device": device,
        "name": name,
        "threads": torch.get_num_threads(),
        "read_gbps": read / 1e9,
        "copy_gbps": copy / 1e9,
        "bf16_matmul_tflops": mm / 1e12,
        "buffer_bytes": buffer_bytes,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "method": "best of %d: fp32 sum over %d MiB (read), copy_ (bytes copied), %dx%d bf16 matmul" % (repeats, buffer_bytes >> 20, n, n),
    }


def _path(device: str):
    return subdir("probe") / f"{device}.json"


def run_probe(device: str = "cpu") -> dict:
    result = probe(device)
    _path(device).write_text(json.dumps(result, indent=2))
    return result


def load_probe(device: str = "cpu") -> dict:
    path = _path(device)
    if path.is_file():
        return json.loads(path.read_text())
    return run_probe(device)


def cached_probe(device: str = "cpu") -> Device:
    p = load_probe(device)
    return Device(
        f"this machine ({p['name']}, {device}, probed)",
        p["read_gbps"] * 1e9,
        p["bf16_matmul_tflops"] * 1e12,
        f"quantkit bench --probe, {p['measured_at']}: {p['method']}",
    )
