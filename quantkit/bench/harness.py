"""The timing harness, shared by every engine (engines/base.py): warm up, then time TTFT and every
decode step, N repeats plus a minimum duration; and the TTFT sweep over prompt lengths.

Definitions (also in the README glossary):
- TTFT: from the prompt's token ids on the device to the first generated token (prefill plus
  the first greedy sample), synchronised; tokenization excluded.
- TPOT: the mean time of each decode step after the first token; per-step times are kept.
- batch 1, prompt of fixed length from random token ids, fixed output length (EOS ignored),
  KV cache cleared (and sized to prompt + output) before every repeat. Warm-up runs (which
  include compilation and graph capture) are excluded from the figures and reported separately;
  an engine that compiles always gets at least one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

SWEEP_SAMPLES = 5  # TTFT samples per sweep length, at least (a median of 2 was a coin toss)


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
    warmups: int = 0

    def summary(self, step_note: str | None = None) -> dict:
        """Statistics; with a `step_note` (an engine's per-step times are not per-token times) the
        per-step distribution is left out and the note says why. TPOT is the same either way:
        the measured decode time of a repeat divided by its tokens."""
        per_repeat_tpot = [float(np.mean(rep)) for rep in self.step_s if rep]
        out = {
            "ttft_ms": summarize_ms(self.ttft_s),
            "tpot_ms": summarize_ms(per_repeat_tpot),
            "repeats": len(self.ttft_s),
            "warmups": self.warmups,
            "warmup_s": self.warmup_s,
        }
        if step_note:
            return {**out, "step_ms": None, "step_times_ms": None, "per_step": {"measured": False, "reason": step_note}}
        steps = [t for rep in self.step_s for t in rep]
        return {
            **out,
            "step_ms": summarize_ms(steps),
            "per_step": {"measured": True},
            "step_times_ms": [[round(t * 1e3, 4) for t in rep] for rep in self.step_s],
        }


class Clock:
    """Wall clock read after the engine's synchronisation (CUDA events would also do; a sync is simpler)."""

    def __init__(self, engine):
        self._sync = engine.sync

    def now(self) -> float:
        self._sync()
        return time.perf_counter()


def run_timed(engine, prompt, prompt_len: int, gen_len: int, clock: Clock) -> tuple[float, list[float]]:
    """One repeat: an empty cache for prompt + gen_len tokens, prefill + first token, gen_len-1 timed steps."""
    if engine.times_itself:  # it runs in another process: the same repeat, timed there, with no pipe on the clock
        return engine.timed_run(prompt, prompt_len + gen_len, gen_len)
    engine.reset(prompt_len + gen_len)
    t0 = clock.now()
    tok = engine.prefill(prompt)
    t1 = clock.now()
    steps = []
    last = t1
    for i in range(gen_len - 1):
        tok = engine.decode(tok, prompt_len + i)
        t = clock.now()
        steps.append(t - last)
        last = t
    return t1 - t0, steps


def warmups_for(engine, requested: int) -> int:
    """An engine that compiles gets at least one warm-up: its first call is compilation, not decode."""
    return max(requested, 1 if engine.compiles else 0)


def measure(engine, ids: list[int], gen_len: int, *, repeats: int, min_seconds: float, warmups: int) -> Timings:
    clock = Clock(engine)
    prompt = engine.prepare(ids)
    timings = Timings(warmups=warmups_for(engine, warmups))
    t = clock.now()
    for _ in range(timings.warmups):
        run_timed(engine, prompt, len(ids), gen_len, clock)
    timings.warmup_s = clock.now() - t
    start = clock.now()
    while len(timings.ttft_s) < repeats or clock.now() - start < min_seconds:
        ttft, steps = run_timed(engine, prompt, len(ids), gen_len, clock)
        timings.ttft_s.append(ttft)
        timings.step_s.append(steps)
        if len(timings.ttft_s) >= 10 * max(1, repeats):
            break
    return timings


def time_prefill(engine, ids: list[int], capacity: int, samples: int) -> list[float]:
    """TTFT samples at one prompt length, after one untimed prefill of that length (first calls
    at a new shape allocate, pick kernels and fill caches)."""
    clock = Clock(engine)
    prompt = engine.prepare(ids)
    if engine.times_itself:
        return [engine.timed_run(prompt, capacity, 1)[0] for _ in range(samples + 1)][1:]
    engine.reset(capacity)
    engine.prefill(prompt)
    times = []
    for _ in range(samples):
        engine.reset(capacity)
        t0 = clock.now()
        engine.prefill(prompt)
        times.append(clock.now() - t0)
    return times
