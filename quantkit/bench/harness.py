"""The timing harness, shared by every engine (engines/engine.py): warm up, then time TTFT and every
decode step, N repeats plus a minimum duration; the TTFT sweep over prompt lengths; and decode at
a KV depth (measure_depth: one prefill of the depth, then every repeat decodes from it).

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

import math
import time
from dataclasses import dataclass, field

import numpy as np

from quantkit.bench.row_parts import Distribution, PerStep, TimingStats

SWEEP_SAMPLES = 5  # TTFT samples per sweep length, at least (a median of 2 was a coin toss)


def summarize_ms(samples_s: list[float]) -> Distribution:
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    return Distribution(
        median=float(np.median(a)),
        mean=float(a.mean()),
        p90=float(np.percentile(a, 90)),
        p99=float(np.percentile(a, 99)),
        std=float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        min=float(a.min()),
        n=int(len(a)),
    )


@dataclass
class Timings:
    ttft_s: list[float] = field(default_factory=list)
    step_s: list[list[float]] = field(default_factory=list)  # per repeat, per decode step
    warmup_s: float = 0.0
    warmups: int = 0

    def summary(self, step_note: str | None = None) -> TimingStats:
        """Statistics; with a `step_note` (an engine's per-step times are not per-token times) the
        per-step distribution is left out and the note says why. TPOT is the same either way:
        the measured decode time of a repeat divided by its tokens."""
        per_repeat_tpot = [float(np.mean(rep)) for rep in self.step_s if rep]
        measured = step_note is None
        return TimingStats(
            ttft_ms=summarize_ms(self.ttft_s) if self.ttft_s else None,  # none at depth 0: no prompt
            tpot_ms=summarize_ms(per_repeat_tpot),
            repeats=len(self.step_s),
            warmups=self.warmups,
            step_ms=summarize_ms([t for rep in self.step_s for t in rep]) if measured else None,
            per_step=PerStep(measured, step_note),
            step_times_ms=tuple(tuple(round(t * 1e3, 4) for t in rep) for rep in self.step_s) if measured else None,
        )


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
    return t1 - t0, decode_steps(engine, tok, prompt_len, gen_len - 1, clock)


def decode_steps(engine, tok, start: int, n: int, clock: Clock) -> list[float]:
    """`n` timed decode steps, the first feeding `tok` at position `start`."""
    steps = []
    last = clock.now()
    for i in range(n):
        tok = engine.decode(tok, start + i)
        t = clock.now()
        steps.append(t - last)
        last = t
    return steps


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


def prefill_samples(first_s: float, min_seconds: float, most: int) -> int:
    """TTFT samples measure_depth takes at a depth whose prefill takes `first_s`: prefills are added
    while they sum to under `min_seconds`, at most `most` (a deep one is timed once: its prefill
    is the cache the repeats decode from). For --plan; measure_depth follows the same rule."""
    if min_seconds <= 0:
        return 1
    if first_s <= 0:
        return most
    return max(1, min(most, math.ceil(min_seconds / first_s)))


def measure_depth(
    engine, ids: list[int], depth: int, gen_len: int, *, repeats: int, min_seconds: float, warmups: int
) -> Timings:
    """Decode with `depth` tokens in the KV cache. ids[:depth] are prefilled once (timed: TTFT; a
    shallow depth is prefilled again while its prefills sum to under `min_seconds`, the last one
    kept), then warm-ups and repeats of gen_len - 1 decode steps, each from that cache: the engine
    rewinds it to the depth after every run, and the harness checks it holds exactly `depth`
    tokens before each. At depth 0 nothing is prefilled: the first step feeds ids[0]."""
    timings = Timings(warmups=warmups_for(engine, warmups))
    if engine.times_itself:
        return _remote_depth(engine, ids, depth, gen_len, timings, repeats, min_seconds)
    clock = Clock(engine)
    engine.reset(depth + gen_len)
    tok = engine.as_token(ids[0])
    if depth:
        prompt, most = engine.prepare(ids[:depth]), max(SWEEP_SAMPLES, repeats)
        while True:
            t0 = clock.now()
            tok = engine.prefill(prompt)
            timings.ttft_s.append(clock.now() - t0)
            if len(timings.ttft_s) >= most or sum(timings.ttft_s) >= min_seconds:
                break
            engine.reset(depth + gen_len)

    def run() -> list[float]:
        held = engine.cache_depth()
        if held != depth:
            raise RuntimeError(f"{engine.name}: the cache holds {held} tokens before a run at depth {depth}")
        steps = decode_steps(engine, tok, depth, gen_len - 1, clock)
        engine.rewind(depth)
        return steps

    t = clock.now()
    for _ in range(timings.warmups):
        run()
    timings.warmup_s = clock.now() - t
    start = clock.now()
    while len(timings.step_s) < repeats or clock.now() - start < min_seconds:
        timings.step_s.append(run())
        if len(timings.step_s) >= 10 * max(1, repeats):
            break
    return timings


def _remote_depth(engine, ids, depth, gen_len, timings: Timings, repeats: int, min_seconds: float) -> Timings:
    """measure_depth for an engine that times itself (vLLM): every run is a request with the same
    `depth`-token prompt; the first prefills it (TTFT, and the first warm-up), the later ones reuse
    its cached blocks (the engine loaded with EngineSettings.reuse_prefix)."""
    prompt, capacity = engine.prepare(ids[:depth]), depth + gen_len
    t = time.perf_counter()
    ttft, _ = engine.timed_run(prompt, capacity, gen_len)
    timings.ttft_s.append(ttft)
    for _ in range(timings.warmups - 1):
        engine.timed_run(prompt, capacity, gen_len)
    timings.warmup_s = time.perf_counter() - t
    start = time.perf_counter()
    while len(timings.step_s) < repeats or time.perf_counter() - start < min_seconds:
        timings.step_s.append(engine.timed_run(prompt, capacity, gen_len)[1])
        if len(timings.step_s) >= 10 * max(1, repeats):
            break
    return timings
