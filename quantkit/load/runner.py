"""The staircase: closed-loop (fixed concurrency) or open-loop (Poisson arrivals) steps of rising load.

Each step ends after `step_seconds` or `max_requests` sent, whichever comes first; requests in
flight then finish (bounded by the request timeout) and count in that step. The staircase stops at
saturation (stats.should_stop) or at its last level. Everything measured lands in a `Progress`
that lives outside the event loop, so Ctrl-C keeps what was measured so far.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from .client import make_http, probe, stream_request
from .config import LoadConfig
from .prompts import make_prompt
from .records import RequestRecord
from .stats import should_stop, summarize_step


class PromptSource:
    """A fresh prompt per request, reproducible from the seed."""

    def __init__(self, cfg: LoadConfig):
        self._rng = random.Random(cfg.seed)
        self._len = cfg.prompt_len
        self._count = 0

    def next(self) -> str:
        self._count += 1
        return make_prompt(self._len, self._rng, self._count)


@dataclass
class Progress:
    """What has been measured so far: finished steps, plus the records of the step in progress."""

    steps: list[dict] = field(default_factory=list)
    step_records: list[list[RequestRecord]] = field(default_factory=list)
    step_starts: list[float] = field(default_factory=list)
    current: list[RequestRecord] | None = None
    current_level: float | None = None
    current_start: float = 0.0
    current_cpu: float = 0.0
    probe: RequestRecord | None = None
    stopped: str | None = None  # "saturation", "bounds" or "interrupted"

    def begin(self, level: float) -> list[RequestRecord]:
        self.current, self.current_level = [], level
        self.current_start, self.current_cpu = time.perf_counter(), time.process_time()
        return self.current

    def end(self, cfg: LoadConfig, partial: bool = False) -> dict:
        step = summarize_step(
            self.current,
            mode=cfg.mode,
            offered=self.current_level,
            t_start=self.current_start,
            slo=cfg.slo,
            cpu_s=time.process_time() - self.current_cpu,
            partial=partial,
        )
        self.steps.append(step)
        self.step_records.append(self.current)
        self.step_starts.append(self.current_start)
        self.current = None
        return step

    def interrupt(self, cfg: LoadConfig) -> None:
        """Ctrl-C: keep the finished steps and summarize the interrupted one as partial."""
        if self.current:
            self.end(cfg, partial=True)
        self.current = None
        self.stopped = "interrupted"


async def _closed_step(
    http: httpx.AsyncClient, cfg: LoadConfig, level: float, prompts: PromptSource, sink: list
) -> None:
    deadline = time.perf_counter() + cfg.step_seconds
    limit = cfg.max_requests or math.inf
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while time.perf_counter() < deadline and issued < limit:
            issued += 1
            sink.append(await stream_request(http, cfg, prompts.next()))

    await asyncio.gather(*(worker() for _ in range(int(level))))


async def _open_step(
    http: httpx.AsyncClient, cfg: LoadConfig, level: float, prompts: PromptSource, sink: list
) -> None:
    # Poisson arrivals: exponential gaps with mean 1/rate, seeded per step for reproducibility.
    rng = random.Random(f"{cfg.seed}:{level}")
    start = time.perf_counter()
    deadline, limit = start + cfg.step_seconds, cfg.max_requests or math.inf
    tasks: list[asyncio.Task] = []
    t_next = start

    async def one(t_scheduled: float) -> None:
        sink.append(await stream_request(http, cfg, prompts.next(), t_scheduled=t_scheduled))

    while len(tasks) < limit:
        t_next += rng.expovariate(level)
        if t_next > deadline:
            break
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        tasks.append(asyncio.create_task(one(t_next)))
    await asyncio.gather(*tasks)


STEP_RUNNERS: dict[str, Callable] = {"concurrency": _closed_step, "rate": _open_step}


def _describe(step: dict) -> str:
    ttft, tpot = step["ttft_ms"]["p99"], step["tpot_ms"]["p99"]
    qps = step["achieved_qps"]
    return (
        f"{step['mode']}={step['offered']:g}: {step['completed']}/{step['requests']} ok, "
        f"{qps or 0:.2f} req/s, TTFT-P99 {ttft or float('nan'):.0f} ms, TPOT-P99 {tpot or float('nan'):.1f} ms, "
        f"{step['error_count']} errors"
    )


def _quiet(line: str) -> None:
    pass


async def run_staircase(cfg: LoadConfig, progress: Progress, log: Callable[[str], None] = _quiet) -> None:
    """Warm up with one request, then climb the levels until saturation or the last level."""
    prompts = PromptSource(cfg)
    async with make_http(cfg) as http:
        progress.probe = await probe(http, cfg, prompts.next())
        warm = progress.probe
        log(f"warm-up ok: {warm.output_tokens} tokens in {warm.t_end - warm.t_send:.2f} s")
        for level in cfg.levels:
            sink = progress.begin(level)
            await STEP_RUNNERS[cfg.mode](http, cfg, level, prompts, sink)
            log(_describe(progress.end(cfg)))
            if cfg.stop_at_saturation and should_stop(progress.steps, cfg.patience):
                progress.stopped = "saturation"
                log("saturated: throughput flat while TTFT-P99 rose; stopping")
                return
    progress.stopped = "bounds"


def run(cfg: LoadConfig, progress: Progress, log: Callable[[str], None] = _quiet) -> Progress:
    """Run the staircase; on Ctrl-C, mark the progress interrupted and re-raise."""
    try:
        asyncio.run(run_staircase(cfg, progress, log))
    except KeyboardInterrupt:
        progress.interrupt(cfg)
        raise
    return progress

