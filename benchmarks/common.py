"""What every benchmark shares: the machine it ran on, the command, the date, and one JSON result file.

A result file is `benchmarks/results/NAME.json`: {"benchmark", "command", "machine", "date", ...the
benchmark's own keys}. docs/ tables are rendered from these files by `benchmarks/render.py`, so a
figure in the docs always has the command and machine that produced it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
QUANTKIT = [sys.executable, "-m", "quantkit"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    """The SIMD levels that decide which kernels run (AVX2, AVX-512 and its BF16/VNNI, AMX)."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        ).split()
    except (OSError, StopIteration):
        return []
    want = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16")
    return [f for f in want if f in flags]


def machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "ram_gb": round(mem / 2**30, 1),
        "gpu": gpu,
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": _commit(),
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def command() -> str:
    """The command line that ran this benchmark, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def portable(text: str) -> str:
    """A result as any machine would write it: paths in the repository relative to its root, in
    the home directory under ~ (the records quantkit writes name the files they read)."""
    return text.replace(f"{REPO}/", "").replace(str(REPO), ".").replace(f"{Path.home()}/", "~/")


def write_result(name: str, body: dict, results: Path = RESULTS) -> Path:
    """Write results/NAME.json atomically, with the command, the machine and the date."""
    record = {
        "benchmark": name,
        "command": command(),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **body,
    }
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    tmp = path.with_suffix(f".json.tmp-{os.getpid()}")
    tmp.write_text(portable(json.dumps(record, indent=1, default=str)) + "\n")
    os.replace(tmp, path)
    return path


def quantkit_json(args: list[str], env: dict | None = None) -> dict:
    """Run `quantkit ARGS --json` in its own process; its parsed output, or RuntimeError with the error line."""
    proc = subprocess.run(
        QUANTKIT + args + ["--json"], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(proc.stdout)
