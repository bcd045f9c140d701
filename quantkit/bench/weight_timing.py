"""The weights' share of a decode step, timed on the engine's own kernels: every weight matrix of the
model multiplied by one activation row, as a decode step does, grouped by the format that stores it.

The torch engines time the loaded model's own modules (its Linear layers and the int4/int8/FP8
kernels of bench/kernels.py, the lm_head, the embedding's one row); llama.cpp times ggml's
kernels on the GGUF's own tensors (bench/ggml_probe.py). Each group runs as one pass over all
its matrices, so the bytes streamed are the model's own, at the bench's threads.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from quantkit.core.attribution import KernelTime

MIN_SECONDS = 0.25  # per format: passes are repeated until this much was timed
MIN_PASSES = 5


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
    """The model's matrices in the model's order, one row through each, each call timed; per format
    the median over passes of its calls' sum. A pass reads every weight, as a decode step does, so a
    format's matrices are timed with the others' bytes streamed between them (timing one format
    alone would let a small one stay in the last-level cache, which a real step does not)."""
    mods = linear_modules(model)
    formats = [_format(m) for m in mods]
    with torch.inference_mode():
        xs = [torch.randn(1, 1, m.in_features, dtype=dtype, device=device) for m in mods]
        passes = interleaved_passes([lambda m=m, x=x: m(x) for m, x in zip(mods, xs)], formats, sync)
    out = []
    for fmt in dict.fromkeys(formats):
        mine = [m for m, f in zip(mods, formats) if f == fmt]
        nbytes = sum(_own_bytes(m) for m in mine)
        flops = sum(2.0 * m.in_features * m.out_features for m in mine)
        out.append(KernelTime(fmt, float(nbytes), flops, passes[fmt]))
    return tuple(out)


def interleaved_passes(calls: list, labels: list[str], sync, min_seconds: float = MIN_SECONDS) -> dict[str, float]:
    """Run `calls` in order, each timed, pass after pass (after one untimed pass) for at least
    MIN_PASSES passes and `min_seconds`; per label, the median over passes of its calls' summed time."""
    for c in calls:
        c()
    sync()
    sums: dict[str, list[float]] = {lab: [] for lab in labels}
    start, n = time.perf_counter(), 0
    while n < MIN_PASSES or time.perf_counter() - start < min_seconds:
        acc = dict.fromkeys(sums, 0.0)
        for c, lab in zip(calls, labels):
            t = time.perf_counter()
            c()
            sync()
            acc[lab] += time.perf_counter() - t
        for lab, v in acc.items():
            sums[lab].append(v)
        n += 1
        if n >= 200:
            break
    return {lab: float(np.median(v)) for lab, v in sums.items()}
