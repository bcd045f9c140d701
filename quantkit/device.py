"""Devices are values: `--device auto|cpu|cuda|cuda:N` becomes a `torch.device` here, once.

Code compares `device.type`, never a string, so a CPU test with `cpu:0` runs the code path a
GPU run takes; the only branches on the device's type pick a kernel or a synchronisation.
"""

from __future__ import annotations

import platform

import psutil
import torch

from quantkit.errors import QuantkitError


def resolve_device(spec=None):
    """`auto` (or None): the first CUDA GPU if there is one, else the CPU. An unavailable device is
    a one-line user error, raised before any weights load."""

    if isinstance(spec, torch.device):
        dev = spec
    else:
        text = str(spec or "auto").strip().lower()
        if text == "auto":
            return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        try:
            dev = torch.device(text)
        except (RuntimeError, ValueError):
            raise QuantkitError(f"--device {spec}: not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise QuantkitError(f"--device {spec}: no CUDA GPU is available on this machine (use --device cpu or auto)")
        index = 0 if dev.index is None else dev.index
        count = torch.cuda.device_count()
        if index >= count:
            raise QuantkitError(
                f"--device {spec}: this machine has {count} CUDA "
                f"GPU{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})"
            )
        return torch.device("cuda", index)
    raise QuantkitError(f"--device {spec}: device type {dev.type!r} is not supported; use auto, cpu, cuda or cuda:N")


def synchronize(device) -> None:
    """Wait for queued work on `device` (a no-op on the CPU, whose ops are synchronous)."""

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def name(device) -> str:
    """Human name of the device: the GPU's model, or the CPU's from /proc/cpuinfo."""

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device, dtype=None) -> dict:
    """What every report states about where it ran."""

    out = {"device": str(device), "type": device.type, "name": name(device)}
    if device.type == "cpu":
        out["threads"] = torch.get_num_threads()
    if dtype is not None:
        out["dtype"] = str(dtype).replace("torch.", "")
    return out


def free_bytes(device) -> int:
    """Memory available for new allocations on `device` (RAM for the CPU)."""

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)
