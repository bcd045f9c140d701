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
    name = torch.cuda.get_device_name() if device == "cuda" else _cpu_name()
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


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _path(device: str):
    return subdir("probe") / f"{device}.json"


def run_probe(device: str = "cpu") -> dict:
    """Probe in a child process: freeing the 1 GiB buffers in this one would leave glibc's
    adaptive mmap threshold raised, and later allocations here would page-fault (measured:
    a tiny model's TTFT went from 2 ms to 58 ms after an in-process probe)."""
    import subprocess
    import sys

    from ..errors import QuantkitError

    proc = subprocess.run([sys.executable, "-m", "quantkit.bench.probe", device], capture_output=True, text=True)
    if proc.returncode != 0:
        raise QuantkitError(f"device probe failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
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


if __name__ == "__main__":
    import sys

    import os

    mib = int(os.environ.get("QUANTKIT_PROBE_MIB", "1024"))  # tests use a small buffer; real probes must exceed the LLC
    print(json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else "cpu", buffer_bytes=mib << 20)))
