"""The steps of a run: closed-loop (fixed concurrency) or open-loop (Poisson arrivals) load.

Each step ends after `step_seconds` or `max_requests` sent, whichever comes first; requests in
flight then finish (bounded by the request timeout) and count in that step. Which level comes next
is search.py's: a staircase that stops at saturation (stats.should_stop) or at its last level, then
repeats; or the search for the highest load that meets the SLO. A step that other processes
disturbed (cpu.py) is measured again, up to `rerun_disturbed` times; a step that gets no answer
at all stops the run (the server is failing). Everything measured lands in a `Progress` that lives
outside the event loop, and a request's record joins it when it is sent, so Ctrl-C, SIGTERM or a
fault keeps what was measured so far, in-flight requests included (as unfinished).
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import aiohttp

from quantkit.load import cpu
from quantkit.load.client import check_reachable, make_http, server_context, server_metrics, stream_request, warm_up
from quantkit.load.config import LoadConfig
from quantkit.load.load_stats import should_stop, summarize_step
from quantkit.load.metrics import Scrape
from quantkit.load.request_timings import RequestRecord
from quantkit.load.search import next_level
from quantkit.load.step_record import Step
from quantkit.load.workload import check_fits

# Before a disturbed step is measured again: wait, in windows of QUIET_WINDOW_S, until other
# processes use less than cpu.DISTURBED cores, or QUIET_WAIT_S have passed.
QUIET_WINDOW_S = 2.0
QUIET_WAIT_S = 120.0
# A step ends early once this many requests in a row could not connect (at least 2 per worker):
# the server is gone, and a closed loop would otherwise spin on refused connections.
DOWN_AFTER = 20


class Terminated(Exception):
    """SIGTERM arrived during the staircase (what was measured is kept, like Ctrl-C)."""


@dataclass
class Progress:
    """What has been measured so far: finished steps, plus the records of the step in progress."""

    steps: list[Step] = field(default_factory=list)
    step_records: list[list[RequestRecord]] = field(default_factory=list)
    step_deltas: list[Scrape | None] = field(default_factory=list)  # each step's /metrics change (vLLM's)
    step_starts: list[float] = field(default_factory=list)
    current: list[RequestRecord] | None = None
    current_level: float | None = None
    current_phase: str | None = None
    current_start: float = 0.0
    current_cpu: float = 0.0
    watch: cpu.Watch | None = None
    probe: RequestRecord | None = None
    context: dict | None = None  # the server's context length and where it came from
    placement: cpu.Placement | None = None  # the client's and the server's cores
    metrics: bool = False  # whether the server's /metrics has histograms to split TTFT with
    discarded: list[Step] = field(default_factory=list)  # steps others disturbed, measured again
    # "saturation", "bounds", "search", "failing", "interrupted", "terminated" or "error"
    stopped: str | None = None
    stop_detail: str | None = None

    @property
    def started(self) -> bool:
        """True once the warm-up passed: from then on there is a run to write."""
        return self.probe is not None

    def begin(self, level: float, phase: str | None = None) -> list[RequestRecord]:
        self.current, self.current_level, self.current_phase = [], level, phase
        self.current_start, self.current_cpu = time.perf_counter(), time.process_time()
        server = self.placement.server_pid if self.placement else None
        self.watch = cpu.Watch(server).start()
        return self.current

    def end(self, cfg: LoadConfig, partial: bool = False, server_delta: Scrape | None = None) -> Step:
        step = summarize_step(
            self.current,
            mode=cfg.mode,
            offered=self.current_level,
            t_start=self.current_start,
            slo=cfg.slo,
            cpu_s=time.process_time() - self.current_cpu,
            partial=partial,
            # a cut-short step ran until now, whatever was still in flight
            t_stop=time.perf_counter() if partial else None,
            server_delta=server_delta,
        )
        step = replace(
            step,
            phase=self.current_phase,
            repeat=sum(s.offered == self.current_level and not s.partial for s in self.steps),
            cpu=self.watch.shares() if self.watch else None,
        )
        self.steps.append(step)
        self.step_records.append(self.current)
        self.step_deltas.append(server_delta)
        self.step_starts.append(self.current_start)
        self.current = None
        return step

    def discard_last(self) -> Step:
        """Set the last step aside (disturbed): it is kept in the run as discarded, out of every statistic."""
        step = self.steps.pop()
        self.step_records.pop()
        self.step_deltas.pop()
        self.step_starts.pop()
        self.discarded.append(replace(step, samples=None))
        return step

    def stop(self, cfg: LoadConfig, reason: str, detail: str | None = None) -> None:
        """Ctrl-C, SIGTERM or a fault: keep the finished steps and summarize the cut one as partial."""
        if self.current:
            self.end(cfg, partial=True)
        self.current = None
        self.stopped, self.stop_detail = reason, detail


class _Step:
    """One step's shared state: its deadline (moved up when the server stops answering)."""

    def __init__(self, cfg: LoadConfig, level: float):
        self.deadline = time.perf_counter() + cfg.step_seconds
        self.limit = cfg.max_requests or math.inf
        self.refused_in_a_row = 0
        self.down_after = max(DOWN_AFTER, 2 * int(level))
        self.in_flight = 0

    def note(self, rec: RequestRecord) -> None:
        self.refused_in_a_row = self.refused_in_a_row + 1 if rec.error == "connection" else 0
        if self.refused_in_a_row >= self.down_after:
            self.deadline = 0.0


async def _send(
    http: aiohttp.ClientSession,
    cfg: LoadConfig,
    source,
    sink: list,
    state: _Step,
    t_scheduled: float | None = None,
) -> None:
    """One request of the workload; its record joins the step when it is sent. Past the admission
    gate's limit of requests in flight it is rejected at once, never sent."""
    turn = source.next()
    rec = RequestRecord(
        t_send=time.perf_counter(),
        t_scheduled=t_scheduled,
        conversation=turn.conversation.index,
        turn=turn.turn,
        prompt_words=turn.words,
        cls=turn.cls,
    )
    sink.append(rec)
    if cfg.admission is not None and state.in_flight >= cfg.admission:
        rec.t_end, rec.error = rec.t_send, "rejected"
        rec.detail = f"admission gate: {state.in_flight} requests already in flight (--admission {cfg.admission})"
        source.answered(turn, False, None)
        return
    # session affinity: a router that pins a session to a replica keeps its prefix cache warm
    headers = {cfg.session_header: f"{cfg.seed}-{turn.conversation.index}"} if cfg.session_header else None
    state.in_flight += 1
    try:
        await stream_request(http, cfg, turn.messages, rec, keep_text=source.keep_text, headers=headers)
    finally:
        state.in_flight -= 1
    source.answered(turn, rec.ok, rec.text)
    rec.text = None
    state.note(rec)


async def _closed_step(http: aiohttp.ClientSession, cfg: LoadConfig, level: float, source, sink: list) -> None:
    state, issued = _Step(cfg, level), 0

    async def worker() -> None:
        nonlocal issued
        while time.perf_counter() < state.deadline and issued < state.limit:
            issued += 1
            await _send(http, cfg, source, sink, state)

    await asyncio.gather(*(worker() for _ in range(int(level))))


async def _open_step(http: aiohttp.ClientSession, cfg: LoadConfig, level: float, source, sink: list) -> None:
    # Poisson arrivals: exponential gaps with mean 1/rate, seeded per step for reproducibility.
    rng = random.Random(f"{cfg.seed}:{level}")
    state = _Step(cfg, level)
    tasks: list[asyncio.Task] = []
    t_next = time.perf_counter()
    while len(tasks) < state.limit:
        t_next += rng.expovariate(level)
        if t_next > state.deadline:
            break
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        tasks.append(asyncio.create_task(_send(http, cfg, source, sink, state, t_scheduled=t_next)))
    await asyncio.gather(*tasks)


STEP_RUNNERS: dict[str, Callable] = {"concurrency": _closed_step, "rate": _open_step}


def _describe(step: Step) -> str:
    ttft, tpot = step.ttft_ms.p99, step.tpot_ms.p99
    qps = step.achieved_qps
    text = (
        f"{step.mode}={step.offered:g}: {step.completed}/{step.requests} ok, "
        f"{qps or 0:.2f} req/s, TTFT-P99 {ttft or float('nan'):.0f} ms, TPOT-P99 {tpot or float('nan'):.1f} ms, "
        f"{step.error_count} errors ({step.phase})"
    )
    shares = step.cpu or cpu.CpuShares()
    if shares.client is not None:
        text += f"; CPU client {shares.client:.2f}"
        if shares.server is not None:
            text += f", server {shares.server:.2f}, others {shares.others:.2f}"
    return text


def _quiet(line: str) -> None:
    pass


def _on_sigterm(progress: Progress) -> None:
    """Turn SIGTERM into a cancellation of the staircase (main thread only; a no-op elsewhere)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()

    def handler() -> None:
        progress.stopped = "terminated"
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, handler)
    except (NotImplementedError, RuntimeError, ValueError):
        pass


async def _context(http: aiohttp.ClientSession, cfg: LoadConfig) -> dict:
    if cfg.context_len:
        return {"tokens": cfg.context_len, "source": "--context-len"}
    tokens, source = await server_context(http, cfg)
    return {"tokens": tokens, "source": source}


def _failing(step: Step) -> str | None:
    """Why the staircase cannot learn more by climbing, or None."""
    if step.completed or not step.requests:
        return None
    kinds = ", ".join(f"{n} {kind}" for kind, n in (step.errors or {}).items() if n)
    return f"no request succeeded at {step.mode}={step.offered:g} ({kinds})"


async def _scrape(http: aiohttp.ClientSession, cfg: LoadConfig, on: bool) -> Scrape | None:
    return await server_metrics(http, cfg) if on else None


async def _step(http, cfg: LoadConfig, progress: Progress, level: float, phase: str, source) -> Step:
    """One step at `level`: its requests, and the server's histograms' change over it."""
    before = await _scrape(http, cfg, progress.metrics)
    sink = progress.begin(level, phase)
    await STEP_RUNNERS[cfg.mode](http, cfg, level, source, sink)
    after = await _scrape(http, cfg, progress.metrics)
    return progress.end(cfg, server_delta=after.minus(before) if after and before else None)


async def _wait_quiet(progress: Progress, log: Callable[[str], None]) -> None:
    """Let what disturbed a step pass before it is measured again (others' CPU below cpu.DISTURBED)."""
    server = progress.placement.server_pid if progress.placement else None
    deadline = time.perf_counter() + QUIET_WAIT_S
    while time.perf_counter() < deadline:
        watch = cpu.Watch(server).start()
        await asyncio.sleep(QUIET_WINDOW_S)
        others = watch.shares().others
        if others is None or others <= cpu.DISTURBED:
            return
    log(f"other processes still busy after {QUIET_WAIT_S:g} s; measuring anyway")


def _stopped(cfg: LoadConfig, progress: Progress) -> str:
    if cfg.search:
        return "search"
    first = [s for s in progress.steps if s.repeat == 0 and not s.partial]
    return "saturation" if cfg.stop_at_saturation and should_stop(first, cfg.patience) else "bounds"


async def run_staircase(
    cfg: LoadConfig,
    progress: Progress,
    log: Callable[[str], None] = _quiet,
    checkpoint: Callable[[Progress], None] | None = None,
) -> None:
    """Warm up with one request, then measure the levels search.py names until it names none, a
    step fails entirely, or the run is stopped."""
    _on_sigterm(progress)
    source = cfg.workload.source(cfg.seed)
    async with make_http(cfg) as http:
        await check_reachable(http, cfg)
        progress.context = await _context(http, cfg)
        check_fits(cfg.workload, cfg.gen_len, progress.context["tokens"], progress.context["source"])
        progress.placement = cpu.placement(cfg.server_pid or cpu.listening_pid(cfg.url))
        if progress.placement.warning:
            log(f"warning: {progress.placement.warning}")
        # The warm-up has the workload's shape (its shared prefix too: steady state for a prefix cache).
        progress.probe = await warm_up(http, cfg, source.warm_up())
        progress.metrics = bool(await server_metrics(http, cfg))
        warm = progress.probe
        log(f"warm-up ok: {warm.output_tokens} tokens in {warm.t_end - warm.t_send:.2f} s")
        reruns = cfg.rerun_disturbed
        while (planned := next_level(cfg, progress.steps)) is not None:
            step = await _step(http, cfg, progress, *planned, source)
            log(_describe(step))
            if step.cpu and step.cpu.disturbed and reruns > 0:
                reruns -= 1
                progress.discard_last()
                log(f"disturbed: other processes used {step.cpu.others:.2f} cores; measuring it again")
                await _wait_quiet(progress, log)
                continue
            reruns = cfg.rerun_disturbed
            if checkpoint:
                checkpoint(progress)
            failing = _failing(step)
            if failing:
                progress.stopped, progress.stop_detail = "failing", failing
                log(f"stopping: {failing}")
                return
    progress.stopped = _stopped(cfg, progress)
    if progress.stopped == "saturation":
        log("saturated: throughput flat while TTFT-P99 rose")


def run(
    cfg: LoadConfig,
    progress: Progress,
    log: Callable[[str], None] = _quiet,
    checkpoint: Callable[[Progress], None] | None = None,
) -> Progress:
    """Run the staircase. Ctrl-C re-raises KeyboardInterrupt, SIGTERM raises Terminated, a fault
    re-raises; in every case `progress` holds what was measured, the cut step summarized as partial."""
    try:
        asyncio.run(run_staircase(cfg, progress, log, checkpoint))
    except KeyboardInterrupt:
        progress.stop(cfg, "interrupted")
        raise
    except asyncio.CancelledError:
        if progress.stopped != "terminated":
            raise
        progress.stop(cfg, "terminated")
        raise Terminated("terminated (SIGTERM)") from None
    except Exception as exc:
        progress.stop(cfg, "error", f"{type(exc).__name__}: {exc}"[:300])
        raise
    return progress
