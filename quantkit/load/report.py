"""A load run as JSON (`"kind": "load-run"`) and as a terminal table."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata

from rich.table import Table

from quantkit.load.config import LoadConfig
from quantkit.load.runner import Progress
from quantkit.load.stats import analyze, percentiles

KIND = "load-run"
# Above this CPU share the client's asyncio loop queues work (bench_load_client.py: TTFT against an
# instant server rises from ~1 ms to tens of ms as the client nears one busy core).
BUSY_CLIENT = 0.7
SCHEMA_VERSION = 1


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _client_summary(progress: Progress) -> dict:
    records = [r for recs in progress.step_records for r in recs]
    shares = [s["client"]["cpu_share"] for s in progress.steps if s["client"]["cpu_share"] is not None]
    lags = [r.t_send - r.t_scheduled for r in records if r.t_scheduled is not None]
    return {
        "parse_ms": percentiles(r.client_s for r in records),
        "send_lag_ms": percentiles(lags) if lags else None,
        "cpu_share_max": max(shares) if shares else None,
        "note": "parse_ms: client time parsing SSE and bookkeeping per request (included in the "
        "latencies); send_lag_ms: open-loop send time minus the Poisson schedule; cpu_share: client "
        "process CPU seconds per wall second (1.0 = one core busy)",
    }


def build_run(cfg: LoadConfig, progress: Progress, *, keep_requests: bool = False) -> dict:
    probe = progress.probe
    run = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "label": cfg.label or f"{cfg.model} @ {cfg.url}",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
        "prompt_tokens_reported": probe.prompt_tokens if probe else None,
        "server_context": progress.context,
        "stopped": progress.stopped,
        "stop_detail": progress.stop_detail,
        "interrupted": progress.stopped in ("interrupted", "terminated"),
        "steps": progress.steps,
        "analysis": analyze(progress.steps, cfg.slo),
        "client_overhead": _client_summary(progress),
        "tool": {
            "quantkit": _version("quantkit"),
            "aiohttp": _version("aiohttp"),
            "python": platform.python_version(),
        },
    }
    if keep_requests:
        # times relative to each step's start, so summarize_step(records, t_start=0) reproduces the step
        run["requests"] = [
            [r.shifted(-start).to_dict() for r in recs]
            for recs, start in zip(progress.step_records, progress.step_starts)
        ]
    return run


def _ms(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _partial(step: dict) -> str:
    unfinished = step.get("unfinished") or 0
    return f"partial ({unfinished} cut)" if unfinished else "partial"


def render_table(run: dict):
    """The per-step table (a rich Table)."""

    mode = run["config"]["mode"]
    table = Table(title=f"quantkit load: {run['label']}")
    head = [
        "step",
        "conc" if mode == "concurrency" else "rate",
        "req/s",
        "out tok/s",
        "TTFT p50/p90/p99 ms",
        "TPOT p50/p90/p99 ms",
        "ITL p99",
        "E2E p99",
        "ok/sent",
        "err/timeout",
        "note",
    ]
    if run["config"]["slo"]["ttft_ms"] is not None or run["config"]["slo"]["tpot_ms"] is not None:
        head.insert(-1, "goodput req/s")
    for name in head:
        table.add_column(name, justify="right")
    notes = {i: "saturated" for i in run["analysis"]["saturated_steps"]}
    if run["analysis"]["knee"]:
        notes[run["analysis"]["knee"]["index"]] = "knee"
    for i, step in enumerate(run["steps"]):
        t, p = step["ttft_ms"], step["tpot_ms"]
        row = [
            str(i),
            f"{step['offered']:g}",
            _ms(step["achieved_qps"], 2),
            _ms(step["output_tokens_per_s"], 1),
            f"{_ms(t['p50'])}/{_ms(t['p90'])}/{_ms(t['p99'])}",
            f"{_ms(p['p50'], 1)}/{_ms(p['p90'], 1)}/{_ms(p['p99'], 1)}",
            _ms(step["itl_ms"]["p99"], 1),
            _ms(step["e2e_ms"]["p99"]),
            f"{step['completed']}/{step['requests']}",
            f"{step['error_count'] - step['timeouts']}/{step['timeouts']}",
            _partial(step) if step["partial"] else notes.get(i, ""),
        ]
        if len(head) > len(row):
            row.insert(-1, _ms((step["goodput"] or {}).get("qps"), 2))
        table.add_row(*row)
    return table


def summary_lines(run: dict) -> list[str]:
    """The knee, what degraded first, how the run ended, and the client's own overhead."""
    analysis, lines = run["analysis"], []
    knee, peak = analysis["knee"], analysis["peak"]
    if knee:
        lines.append(
            f"knee: step {knee['index']} ({run['config']['mode']}={knee['offered']:g}) at "
            f"{knee['achieved_qps']:.2f} req/s, {knee['output_tokens_per_s']:.1f} output tok/s; "
            f"TTFT-P99 {_ms(knee['ttft_p99_ms'])} ms, TPOT-P99 {_ms(knee['tpot_p99_ms'], 1)} ms"
        )
    elif peak:
        lines.append(
            f"knee: not reached within the bounds; peak {peak['achieved_qps'] or 0:.2f} req/s at "
            f"{run['config']['mode']}={peak['offered']:g}{_cut(peak)} (raise the load to find it)"
        )
    if knee and peak and peak["index"] != knee["index"]:
        lines.append(
            f"peak: {peak['achieved_qps'] or 0:.2f} req/s at {run['config']['mode']}={peak['offered']:g}{_cut(peak)}"
        )
    lines.append(analysis["degraded_first"]["meaning"])
    lines.extend(_workload_lines(run))
    slo_best = analysis["max_qps_within_slo"]
    if run["config"]["slo"]["ttft_ms"] is not None or run["config"]["slo"]["tpot_ms"] is not None:
        lines.append(
            "max req/s with P99s within the SLO: "
            + (f"{slo_best['achieved_qps']:.2f} (step {slo_best['index']}{_cut(slo_best)})" if slo_best else "none")
        )
    lines.extend(_error_lines(run["steps"]))
    client = run["client_overhead"]
    parse = client["parse_ms"]
    text = (
        f"client overhead: parse+bookkeeping P50 {_ms(parse['p50'], 2)} ms, P99 {_ms(parse['p99'], 2)} ms per request"
    )
    if client["send_lag_ms"]:
        text += f"; send lag P99 {_ms(client['send_lag_ms']['p99'], 1)} ms"
    if client["cpu_share_max"] is not None:
        text += f"; client CPU up to {client['cpu_share_max']:.2f} cores"
    lines.append(text)
    if (client["cpu_share_max"] or 0) > BUSY_CLIENT:
        lines.append(
            f"warning: the client used {client['cpu_share_max']:.2f} of its one core: its own event-loop "
            "delays are in these latencies; run it on a quieter machine or lower the load (docs/LOAD.md)"
        )
    detail = run.get("stop_detail")
    lines.append(f"stopped: {run['stopped']}" + (f" ({detail})" if detail else ""))
    return lines


def _workload_lines(run: dict) -> list[str]:
    """The workload's shape, and what the server said it cached of it."""
    workload = run["config"].get("workload") or {}
    lines = []
    if workload.get("shared_prefix") or workload.get("turns", 1) > 1 or "," in workload.get("prompt_len_spec", ""):
        lines.append(
            f"workload: prompt-len {workload['prompt_len_spec']}, shared prefix "
            f"{workload['shared_prefix']} tokens, {workload['turns']} turn(s) per conversation"
        )
    cached = [
        (s["cached_tokens_mean"], s["prompt_tokens_mean"], s["cache_hit_fraction"])
        for s in run["steps"]
        if s.get("cache_hit_fraction") is not None
    ]
    if cached:
        hit = sum(c[2] for c in cached) / len(cached)
        lines.append(
            f"prefix cache: {100 * hit:.0f}% of prompt tokens served from the server's cache "
            f"(per request {cached[0][0]:.0f} of {cached[0][1]:.0f} tokens in step 0)"
        )
    return lines


def _cut(entry: dict) -> str:
    return ", cut short" if entry.get("partial") else ""


def _error_lines(steps: list[dict]) -> list[str]:
    """One line per error kind seen in the run: how many, and the first message."""
    totals: dict[str, int] = {}
    examples: dict[str, str] = {}
    for step in steps:
        for kind, n in step["errors"].items():
            if n:
                totals[kind] = totals.get(kind, 0) + n
        for kind, text in (step.get("error_examples") or {}).items():
            examples.setdefault(kind, text)
    return [f"errors: {n} {kind}, e.g. {examples.get(kind) or '-'}" for kind, n in totals.items()]
