"""The engine's fixed costs, measured on the model's twin: the same engine, threads, attention
setting and cache type, the model's layers, heads, head size and vocabulary, tiny widths
(gguf/gguf_twin.py for a GGUF; a twin config for the torch engines). Its decode at the engine's shallowest
cache, at each depth the rows decode at and at a deep one gives the cache's time per step between
those sizes and the fixed time per step (what is left at the smallest size once the cells and the
twin's own few weight bytes are taken off): core/attribution.fixed_costs.

Measured once per bench run for each (engine settings, model geometry, depths): a run's variants
of one model share the twin (Twins keeps them for the run; nothing is kept across runs, since the
machine's state is part of what is measured).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from quantkit.bench.engines import engine_class
from quantkit.bench.engines.engine import EngineSettings
from quantkit.bench.harness import measure_depth
from quantkit.core.attribution import fixed_costs
from quantkit.errors import QuantkitError

TWIN_DEEP = 1024  # the twin's deepest cache size is at least this many tokens
TWIN_MIN_SECONDS = 0.5  # measured per cache size


def twin_depths(engine_cls, depths: list[int], limit: int | None, gen_len: int) -> tuple[int, ...] | None:
    """The twin's cache sizes: the engine's shallowest, each depth the rows decode at, and the deepest
    of them (at least TWIN_DEEP), within the model's context; None where no two can differ. A row's
    cache time then comes from a size measured at its own depth, not a line through two."""
    lo = engine_cls.min_depth
    hi = max([*depths, TWIN_DEEP])
    if limit:
        hi = min(hi, limit - gen_len)
    if hi <= lo:
        return None
    return (lo, *sorted({d for d in depths if lo < d < hi}), hi)


def _cells(engine, depth: int, gen_len: int) -> float:
    """Cells one timed step reads on average at `depth` (the step's KV bytes over one token's)."""
    weights = engine.weight_bytes()["weight_bytes_per_token"]
    kv = engine.kv_bytes_per_token()
    steps = range(depth, depth + gen_len - 1)
    return sum((engine.step_bytes(c, depth + gen_len) - weights) / kv for c in steps) / len(steps)


def measure_twin(engine_cls, twin_source, es: EngineSettings, depths: tuple[int, ...], gen_len: int, repeats: int,
                 vocab: int):  # fmt: skip
    """The twin's decode TPOT (ms) and cells per step at each depth, and its weights' kernel time (ms)."""
    es = replace(es, max_tokens=max(depths) + gen_len, reuse_prefix=True)
    engine = engine_cls.load(twin_source, es)
    try:
        gen = torch.Generator().manual_seed(es.seed + 7)
        cells, tpot = [], []
        for d in depths:
            ids = torch.randint(0, vocab, (max(d, 1),), generator=gen).tolist()
            t = measure_depth(
                engine, ids, d, gen_len, repeats=repeats, min_seconds=TWIN_MIN_SECONDS, warmups=1 if d else 2
            )
            tpot.append(float(np.median([np.mean(s) for s in t.step_s if s])) * 1e3)
            cells.append(_cells(engine, d, gen_len))
        weights_ms = sum(k.seconds for k in engine.weight_kernels()) * 1e3
    finally:
        engine.close()
    return tuple(cells), tuple(tpot), weights_ms


@dataclass
class Twins:
    """The fixed costs measured in one bench run, by what determines them."""

    found: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)

    def fixed(self, engine, es: EngineSettings, depths: tuple[int, ...], gen_len: int, repeats: int, vocab: int):
        """The loaded `engine`'s fixed costs (its twin, of the model's `vocab`, measured now or earlier
        in this run), or (None, why)."""
        try:
            twin_source, about = engine.twin_source()
        except QuantkitError as exc:
            return None, str(exc)
        key = json.dumps(
            [engine.name, str(es.device), es.threads, es.flash_attn, getattr(es.kv_cache, "label", None), about, depths]
        )
        if key in self.found:
            return self.found[key], None
        if key in self.failed:
            return None, self.failed[key]
        t = time.perf_counter()
        try:
            cells, tpot, weights_ms = measure_twin(
                engine_class(engine.name), twin_source, es, depths, gen_len, repeats, vocab
            )
        except Exception as exc:  # the twin is a side measurement: whatever stops it, the rows go on without it
            self.failed[key] = f"the twin did not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
            return None, self.failed[key]
        if len(set(cells)) < 2:
            self.failed[key] = "the twin's cache sizes read the same cells (the engine pads its cache to one size)"
            return None, self.failed[key]
        fixed = fixed_costs(
            cells,
            tpot,
            weights_ms,
            f"{about}; decoded at depths {', '.join(map(str, depths[:-1]))} and {depths[-1]} in "
            f"{time.perf_counter() - t:.1f} s",
        )
        self.found[key] = fixed
        return fixed, None
