"""The weights' share of a decode step, timed on the engine's own kernels: every weight matrix of the
model multiplied by one activation row, as a decode step does, grouped by the format that stores it.

The torch engines time the loaded model's own modules (its Linear layers and the int4/int8/FP8
kernels of bench/kernels.py, the lm_head, the embedding's one row); llama.cpp times ggml's
kernels on the GGUF's own tensors (bench/ggml_probe.py). Each group runs as one pass over all
its matrices, so the bytes streamed are the model's own, at the bench's threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from quantkit.core.attribution import KernelTime

MIN_SECONDS = 0.25  # per format: passes are repeated until this much was timed
MIN_PASSES = 5


def median_seconds(run: Callable[[], None], sync: Callable[[], None], min_seconds: float = MIN_SECONDS) -> float:
    """The median time of `run` after one untimed call, over at least MIN_PASSES calls and `min_seconds`."""
    run()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MIN_PASSES or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t)
        if len(times) >= 200:
            break
    return float(np.median(times))


def _own_bytes(module: torch.nn.Module) -> int:
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return sum(t.numel() * t.element_size() for t in tensors if t is not None and t.device.type != "meta")


def _format(module: torch.nn.Module) -> str:
    """A module's storage format as the report names it: the kernel it runs and the weight's dtype."""
    kernel = getattr(module, "kernel", None)
    weight = next((t for t in module.buffers(recurse=False)), None) if kernel else getattr(module, "weight", None)
    dtype = str(weight.dtype).removeprefix("torch.") if isinstance(weight, torch.Tensor) else "?"
    return f"{kernel or 'F.linear'} ({dtype})" if kernel else f"F.linear ({dtype})"


def linear_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module a decode step multiplies an activation row by: leaves with in_features and
    out_features (torch Linear, quantkit's kernels, bitsandbytes' layers), each once (a tied lm_head
    is its own module)."""
    seen, out = set(), []
    for module in model.modules():
        if any(True for _ in module.children()):
            continue
        if isinstance(getattr(module, "in_features", None), int) and isinstance(
            getattr(module, "out_features", None), int
        ):
            if id(module) not in seen:
                seen.add(id(module))
                out.append(module)
    return out


def time_torch_weights(model: torch.nn.Module, dtype: torch.dtype, device, sync) -> tuple[KernelTime, ...]:
    """Each format's matrices of `model`, one row through each, timed as one pass per format."""
    groups: dict[str, list[torch.nn.Module]] = {}
    for m in linear_modules(model):
        groups.setdefault(_format(m), []).append(m)
    out = []
    with torch.inference_mode():
        for fmt, mods in groups.items():
            xs = [torch.randn(1, 1, m.in_features, dtype=dtype, device=device) for m in mods]

            def run(mods=mods, xs=xs):
                for m, x in zip(mods, xs):
                    m(x)

            seconds = median_seconds(run, sync)
            nbytes = sum(_own_bytes(m) for m in mods)
            flops = sum(2.0 * m.in_features * m.out_features for m in mods)
            out.append(KernelTime(fmt, float(nbytes), flops, seconds))
    return tuple(out)
