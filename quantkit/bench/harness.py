"""The timing harness: warm up, then time TTFT and every decode step, N repeats plus a minimum duration.

Definitions (also in the README glossary):
- TTFT: from the prompt's token ids on the device to the first generated token (prefill plus
  the first greedy sample), synchronised; tokenization excluded.
- TPOT: the mean time of each decode step after the first token; per-step times are kept.
- batch 1, prompt of fixed length from random token ids, fixed output length (EOS ignored),
  KV cache cleared before every repeat. Warm-up runs (which include compilation and graph
  capture) are excluded from the figures and reported separately.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


def summarize_ms(samples_s: list[float]) -> dict:
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {
        "median": float(np.median(a)),
        "mean": float(a.mean()),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "min": float(a.min()),
        "n": int(len(a)),
    }


@dataclass
class Timings:
    ttft_s: list[float] = field(default_factory=list)
    step_s: list[list[float]] = field(default_factory=list)  # per repeat, per decode step
    warmup_s: float = 0.0

    def summary(self) -> dict:
        steps = [t for rep in self.step_s for t in rep]
        per_repeat_tpot = [float(np.mean(rep)) for rep in self.step_s if rep]
        return {
            "ttft_ms": summarize_ms(self.ttft_s),
            "tpot_ms": summarize_ms(per_repeat_tpot),
            "step_ms": summarize_ms(steps),
            "repeats": len(self.ttft_s),
            "warmup_s": self.warmup_s,
            "step_times_ms": [[round(t * 1e3, 4) for t in rep] for rep in self.step_s],
        }


class Clock:
    """Wall clock with device synchronisation (CUDA events would also do; a sync is simpler)."""

    def __init__(self, device: str):
        import torch

        self._sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def now(self) -> float:
        self._sync()
        return time.perf_counter()


def run_timed(engine, prompt, gen_len: int, clock: Clock) -> tuple[float, list[float]]:
    """One repeat: cleared cache, prefill + first token, then gen_len-1 timed decode steps."""
    engine.reset()
    t0 = clock.now()
    tok = engine.prefill(prompt)
    t1 = clock.now()
    steps = []
    pos = prompt.shape[1]
    last = t1
    for i in range(gen_len - 1):
        tok = engine.decode(tok, pos + i)
        t = clock.now()
        steps.append(t - last)
        last = t
    return t1 - t0, steps


def measure(engine, prompt, gen_len: int, *, repeats: int, min_seconds: float, warmups: int, device: str) -> Timings:
    clock = Clock(device)
    timings = Timings()
    t = clock.now()
    for _ in range(warmups):
        run_timed(engine, prompt, gen_len, clock)
    timings.warmup_s = clock.now() - t
    start = clock.now()
    while len(timings.ttft_s) < repeats or clock.now() - start < min_seconds:
        ttft, steps = run_timed(engine, prompt, gen_len, clock)
        timings.ttft_s.append(ttft)
        timings.step_s.append(steps)
        if len(timings.ttft_s) >= 10 * max(1, repeats):
            break
    return timings
