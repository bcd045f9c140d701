"""Where a decode step's time goes: a measured TPOT split into terms that are each measured apart
from it, as pure functions.

- weights_ms: the weights' bytes at the device's streaming read rate (the bandwidth floor).
- compute_ms: what the engine's own kernels take over those weights beyond that floor, timed on
  the device at the bench's threads (dequantization and the dot products: a CPU without native
  FP16/BF16 arithmetic spends it here).
- kv_ms: reading and attending over the KV cache: the engine's measured time per cached cell at
  the row's cache type and attention setting, times the cells a step reads.
- overhead_ms: the engine's fixed cost per step (graph launch, per-operation synchronisation, the
  sampling loop), measured on a twin of the model with its layers and attention but tiny widths.

Each term is >= 0. Their sum is the attributed prediction: within ATTRIBUTION_TOLERANCE of the
measured TPOT it explains the step; outside it the row says by how much (a disturbed run, or a
cost no term models). `bound` is the resource with the largest share; `lever` says what presses
that term down, with the figures that decide it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from quantkit.core.record_checks import RecordError, checked

ATTRIBUTION_TOLERANCE = 0.10  # |sum / measured - 1| above this: the attribution does not explain the row
TWIN_WIDTH = 64  # hidden and feed-forward width of a model's twin (a multiple of every block size up to 64)


@dataclass(frozen=True)
class KernelTime:
    """One weight format as the engine's kernels ran it over a model's weights at batch 1: the
    bytes and useful FLOPs (2 per weight) of those matrix-vector products and their measured time."""

    format: str
    bytes: float
    flops: float
    seconds: float

    @property
    def gbps(self) -> float:
        """The rate the kernel streamed this format's bytes at."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        return {**self.__dict__, "gbps": self.gbps, "gflops": self.gflops}

    @classmethod
    def from_json(cls, data: dict) -> "KernelTime":
        d = checked(cls, {k: v for k, v in data.items() if k not in ("gbps", "gflops")}, "kernel time")
        _finite_nonneg(d, ("bytes", "flops", "seconds"), "kernel time")
        return cls(**d)


@dataclass(frozen=True)
class FixedCosts:
    """The engine's own costs that do not scale with the weights, from its twin (the model's layers,
    heads and cache with tiny widths) decoding at two or more cache sizes: the cache's time per step
    (every layer: reading K and V and attending), piecewise linear between the sizes, and the fixed
    time per step."""

    overhead_ms: float
    kv_ms_per_cell: float  # the mean slope, the smallest cache size to the largest
    cells: tuple[float, ...]  # the cache sizes the twin decoded at (cells a step read, on average), ascending
    twin_tpot_ms: tuple[float, ...]
    twin_weights_ms: float  # the twin's own weights through the engine's kernels (subtracted)
    twin: str  # what the twin was

    def slopes(self) -> list[float]:
        """Time per cell between consecutive cache sizes, each clamped at 0 (a twin faster deeper in
        its cache measured noise, not a negative cost)."""
        c, t = self.cells, self.twin_tpot_ms
        return [max(0.0, (t[i + 1] - t[i]) / (c[i + 1] - c[i])) if c[i + 1] != c[i] else 0.0 for i in range(len(c) - 1)]

    def kv_ms(self, cells: float) -> float:
        """The cache's time per step at `cells`: the twin's decode time, piecewise linear between its
        cache sizes (the end segments' slopes beyond them), from none at no cell. An engine's time
        per cell need not be constant in the depth (flash attention's tiles, the cache leaving the
        last-level cache): a size measured near the row's depth follows it."""
        c, s = self.cells, self.slopes()
        if cells <= c[0]:
            return s[0] * cells
        at = s[0] * c[0]
        for i, slope in enumerate(s):
            if cells <= c[i + 1] or i == len(s) - 1:
                return at + slope * (cells - c[i])
            at += slope * (c[i + 1] - c[i])
        return at

    def to_json(self) -> dict:
        return {**self.__dict__, "cells": list(self.cells), "twin_tpot_ms": list(self.twin_tpot_ms)}

    @classmethod
    def from_json(cls, data: dict) -> "FixedCosts":
        d = checked(cls, data, "fixed costs")
        _finite_nonneg(d, ("overhead_ms", "kv_ms_per_cell", "twin_weights_ms"), "fixed costs")
        cells, tpot = d["cells"], d["twin_tpot_ms"]
        if not (isinstance(cells, list) and isinstance(tpot, list) and len(cells) == len(tpot) >= 2):
            raise RecordError("fixed costs: cells and twin_tpot_ms must be lists of one length, at least 2")
        for v in (*cells, *tpot):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise RecordError(f"fixed costs: cells and twin_tpot_ms must be finite and >= 0, got {v!r}")
        if any(b < a for a, b in zip(cells, cells[1:])):
            raise RecordError("fixed costs: cells must ascend")
        return cls(**{**d, "cells": tuple(cells), "twin_tpot_ms": tuple(tpot)})


def fixed_costs(cells: tuple[float, ...], tpot_ms: tuple[float, ...], weights_ms: float, twin: str) -> FixedCosts:
    """The twin's decode timings at two or more cache sizes as the cache's time per step (FixedCosts.kv_ms)
    and a fixed time per step (at the smallest size, less its cells at the first slope and the twin's
    own weights), each clamped at 0."""
    by_cells: dict[float, list[float]] = {}
    for c_, t_ in zip(cells, tpot_ms):  # depths an engine pads to one cache size are one size
        by_cells.setdefault(c_, []).append(t_)
    if len(by_cells) < 2:
        raise ValueError("the twin's cache sizes read the same cells: no time per cell to take")
    pairs = sorted((c_, sum(ts) / len(ts)) for c_, ts in by_cells.items())
    c, t = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    per_cell = max(0.0, (t[-1] - t[0]) / (c[-1] - c[0])) if c[-1] != c[0] else 0.0
    f = FixedCosts(0.0, per_cell, c, t, weights_ms, twin)
    first = f.slopes()[0]
    return replace(f, overhead_ms=max(0.0, t[0] - first * c[0] - weights_ms))


@dataclass(frozen=True)
class Attribution:
    """A row's TPOT split into its causes (module docstring). `kv_read_ms` is the cache's bytes
    alone at the streaming rate (kv_ms beyond it is attention's arithmetic); `explained` the
    terms' sum over the measured TPOT."""

    measured_ms: float
    weights_ms: float
    compute_ms: float
    kv_ms: float
    overhead_ms: float
    kv_read_ms: float
    cells: float  # KV cells a step read, on average over the timed steps
    stream_gbps: float
    kernels: tuple[KernelTime, ...]
    fixed: FixedCosts | None
    explained: float
    bound: str
    lever: str
    sources: tuple[str, ...]  # where each term's rate was measured

    @property
    def total_ms(self) -> float:
        return self.weights_ms + self.compute_ms + self.kv_ms + self.overhead_ms

    @property
    def holds(self) -> bool:
        return abs(self.explained - 1.0) <= ATTRIBUTION_TOLERANCE

    def shares(self) -> dict:
        total = self.total_ms
        terms = {"weights": self.weights_ms, "compute": self.compute_ms, "kv": self.kv_ms, "overhead": self.overhead_ms}
        return {k: (v / total if total > 0 else 0.0) for k, v in terms.items()}

    def to_json(self) -> dict:
        return {
            **self.__dict__,
            "kernels": [k.to_json() for k in self.kernels],
            "fixed": self.fixed.to_json() if self.fixed else None,
            "sources": list(self.sources),
        }

    @classmethod
    def from_json(cls, data: dict) -> "Attribution":
        d = checked(cls, data, "attribution")
        _finite_nonneg(
            d, ("measured_ms", "weights_ms", "compute_ms", "kv_ms", "overhead_ms", "kv_read_ms", "cells"), "attribution"
        )
        if d["bound"] not in RESOURCES:
            raise RecordError(f"attribution: bound {d['bound']!r} is not one of {', '.join(RESOURCES)}")
        return cls(
            **{
                **d,
                "kernels": tuple(KernelTime.from_json(k) for k in d["kernels"]),
                "fixed": FixedCosts.from_json(d["fixed"]) if d["fixed"] else None,
                "sources": tuple(d["sources"]),
            }
        )


RESOURCES = ("bandwidth", "compute", "overhead")


def _finite_nonneg(d: dict, keys: tuple[str, ...], what: str) -> None:
    for k in keys:
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < float("inf")):
            raise RecordError(f"{what}: {k} must be a finite number >= 0, not {v!r}")


def resource_times(weights_ms: float, compute_ms: float, kv_ms: float, kv_read_ms: float, overhead_ms: float) -> dict:
    """The step's time by resource: bytes streamed (the weights' and the cache's reads), arithmetic
    beyond them (the kernels' excess and attention's beyond its reads), and fixed cost."""
    kv_bytes = min(kv_ms, kv_read_ms)
    return {"bandwidth": weights_ms + kv_bytes, "compute": compute_ms + kv_ms - kv_bytes, "overhead": overhead_ms}


def attribute(
    measured_ms: float,
    weight_bytes: float,
    kv_step_bytes: float,
    cells: float,
    stream_bps: float,
    kernels: tuple[KernelTime, ...],
    fixed: FixedCosts | None,
    sources: tuple[str, ...] = (),
    context: dict | None = None,
) -> Attribution:
    """A row's attribution from its bytes, the device's streaming rate, its weights' kernel times
    and its engine's fixed costs (None: not measured, then kv_ms is the cache's bytes alone and no
    overhead is claimed). `context` (flash_attn, kv_cache, engine) only shapes the lever's words.

    The streaming rate is the device probe's read rate, or a kernel's where one streamed its bytes
    faster: then the probe's read was not the device's limit, and bytes at the probe's rate would
    claim more time than the kernel took."""
    stream_bps = max([stream_bps, *(k.bytes / k.seconds for k in kernels if k.seconds > 0)])
    weights_ms = weight_bytes / stream_bps * 1e3
    kernel_ms = sum(k.seconds for k in kernels) * 1e3
    kernel_bytes_ms = sum(k.bytes for k in kernels) / stream_bps * 1e3
    compute_ms = max(0.0, kernel_ms - kernel_bytes_ms)
    kv_read_ms = kv_step_bytes / stream_bps * 1e3
    kv_ms = fixed.kv_ms(cells) if fixed else kv_read_ms
    overhead_ms = fixed.overhead_ms if fixed else 0.0
    total = weights_ms + compute_ms + kv_ms + overhead_ms
    by = resource_times(weights_ms, compute_ms, kv_ms, kv_read_ms, overhead_ms)
    bound = max(by, key=by.get)
    terms = dict(weights_ms=weights_ms, compute_ms=compute_ms, kv_ms=kv_ms, overhead_ms=overhead_ms)
    return Attribution(
        measured_ms=measured_ms,
        **terms,
        kv_read_ms=kv_read_ms,
        cells=cells,
        stream_gbps=stream_bps / 1e9,
        kernels=tuple(kernels),
        fixed=fixed,
        explained=total / measured_ms if measured_ms > 0 else float("inf"),
        bound=bound,
        lever=lever(terms, kv_read_ms, tuple(kernels), stream_bps, cells, context or {}),
        sources=tuple(sources),
    )


def lever(terms: dict, kv_read_ms: float, kernels: tuple[KernelTime, ...], stream_bps: float, cells: float, ctx: dict):
    """What presses the largest term down, in the attribution's own figures."""
    total = sum(terms.values()) or 1.0
    name = max(terms, key=terms.get)
    ms, share = terms[name], terms[name] / total
    head = f"{name.removesuffix('_ms')} {ms:.2f} ms ({share:.0%} of the attributed step)"
    if name == "weights_ms":
        return (
            f"{head}: the weights' bytes at {stream_bps / 1e9:.1f} GB/s; fewer bits per weight "
            "(quantization) shrink it in proportion"
        )
    if name == "kv_ms":
        arith = terms["kv_ms"] - min(terms["kv_ms"], kv_read_ms)
        if arith > kv_read_ms:
            fa = ctx.get("flash_attn")
            fused = "" if fa or fa is None else "; flash attention fuses it (it is off here)"
            return (
                f"{head}: attention over {cells:,.0f} cells, {arith:.2f} ms of it arithmetic beyond the "
                f"{kv_read_ms:.2f} ms its bytes take{fused}; a shorter context or fewer query heads per step shrink it"
            )
        return (
            f"{head}: reading {cells:,.0f} cached cells ({ctx.get('kv_cache') or 'the cache'}); GQA (fewer KV heads) "
            "or a quantized KV cache shrink it"
        )
    if name == "compute_ms":
        slow = min(kernels, key=lambda k: k.gbps) if kernels else None
        which = (
            f"{slow.format} runs at {slow.gflops:.1f} GFLOP/s, streaming {slow.gbps:.1f} GB/s against the "
            f"device's {stream_bps / 1e9:.1f}"
            if slow
            else "the kernels run below the streaming rate"
        )
        return (
            f"{head}: {which}; more threads, or a format whose kernel computes natively on this device "
            "(8-bit or 4-bit integer dot products where FP16/BF16 arithmetic is emulated), move it"
        )
    return (
        f"{head}: fixed per step whatever the bytes (graph launch, per-operation synchronisation, the token "
        "loop); a compiled or captured graph, fewer layers, or batching several sequences amortizes it"
    )
