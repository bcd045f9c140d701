"""A load run as its record (runfile.LoadRun, `"kind": "load-run"`), built from what the staircase
measured; terminal.py prints it, `quantkit load --out` writes its JSON."""

from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import replace
from importlib import metadata

from quantkit.load.config import LoadConfig
from quantkit.load.cpu import CpuShares
from quantkit.load.intervals import P99_NOT_MAX, slo_knee
from quantkit.load.load_stats import analyze, percentiles, summarize_step
from quantkit.load.load_steps import Progress
from quantkit.load.metrics import Scrape
from quantkit.load.runfile import KIND, SCHEMA_VERSION, LoadRun, RunClient
from quantkit.load.step_record import Step

PARTIES = ("client", "server", "machine", "others")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _client_summary(progress: Progress) -> RunClient:
    records = [r for recs in progress.step_records for r in recs]
    shares = [s.client.cpu_share for s in progress.steps if s.client.cpu_share is not None]
    lags = [r.t_send - r.t_scheduled for r in records if r.t_scheduled is not None]
    return RunClient(
        parse_ms=percentiles(r.client_s for r in records),
        send_lag_ms=percentiles(lags) if lags else None,
        cpu_share_max=max(shares) if shares else None,
        note="parse_ms: client time parsing SSE and bookkeeping per request (included in the "
        "latencies); send_lag_ms: open-loop send time minus the Poisson schedule; cpu_share: client "
        "process CPU seconds per wall second (1.0 = one core busy)",
    )


def _pooled_cpu(steps: list[Step]) -> CpuShares | None:
    shares = [(s.cpu, s.duration_s) for s in steps if s.cpu and s.duration_s]
    if not shares:
        return None
    wall = sum(d for _, d in shares)
    pooled = {}
    for party in PARTIES:
        known = [(getattr(c, party), d) for c, d in shares if getattr(c, party) is not None]
        pooled[party] = sum(v * d for v, d in known) / sum(d for _, d in known) if known else None
    return CpuShares(**pooled, disturbed=any(c.disturbed for c, _ in shares) if wall else None)


def pooled_levels(cfg: LoadConfig, progress: Progress) -> list[Step]:
    """One summary per level, its full steps' requests pooled (the repeats of a level are one
    sample; their wall times add up, and the server's /metrics changes over them are summed, so
    vLLM's TTFT parts and speculation counters pool with them); a cut-short step stays on its own."""
    by_level: dict[float, list[int]] = {}
    for i, step in enumerate(progress.steps):
        if not step.partial:
            by_level.setdefault(step.offered, []).append(i)
    levels = []
    for level, indices in by_level.items():
        if len(indices) == 1:
            levels.append(progress.steps[indices[0]])
            continue
        steps = [progress.steps[i] for i in indices]
        pooled = summarize_step(
            [r for i in indices for r in progress.step_records[i]],
            mode=cfg.mode,
            offered=level,
            t_start=0.0,
            slo=cfg.slo,
            duration=sum(s.duration_s for s in steps),
            server_delta=Scrape.total([progress.step_deltas[i] for i in indices]),
        )
        cpu = _pooled_cpu(steps)
        client = replace(pooled.client, cpu_share=cpu.client if cpu else None)
        # the steps keep the samples
        levels.append(
            replace(pooled, phase="pooled", repeat=None, steps=len(steps), cpu=cpu, samples=None, client=client)
        )
    levels += [s for s in progress.steps if s.partial]
    return sorted(levels, key=lambda s: s.offered)


def build_run(cfg: LoadConfig, progress: Progress, *, keep_requests: bool = False) -> LoadRun:
    probe = progress.probe
    levels = pooled_levels(cfg, progress)
    analysis = replace(
        analyze(levels, cfg.slo, cfg.attribution), slo_knee=slo_knee(progress.steps, cfg.slo, seed=cfg.seed)
    )
    requests = None
    if keep_requests:
        # times relative to each step's start, so summarize_step(records, t_start=0) reproduces the step
        requests = [
            [r.shifted(-start).to_dict() for r in recs]
            for recs, start in zip(progress.step_records, progress.step_starts)
        ]
    return LoadRun(
        kind=KIND,
        schema_version=SCHEMA_VERSION,
        label=cfg.label or f"{cfg.model} @ {cfg.url}",
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        config=cfg.to_dict(),
        prompt_tokens_reported=probe.prompt_tokens if probe else None,
        server_context=progress.context,
        stopped=progress.stopped,
        stop_detail=progress.stop_detail,
        interrupted=progress.stopped in ("interrupted", "terminated"),
        steps=list(progress.steps),
        levels=levels,
        discarded=list(progress.discarded),
        analysis=analysis,
        cpu=progress.placement,
        p99_requests_needed=P99_NOT_MAX,
        client_overhead=_client_summary(progress),
        tool={"quantkit": _version("quantkit"), "aiohttp": _version("aiohttp"), "python": platform.python_version()},
        requests=requests,
    )
