"""A load run on the terminal: the per-step table, the levels with their intervals, the summary lines."""

from __future__ import annotations

from rich.table import Table

from quantkit.load.parts import PARTS
from quantkit.load.runfile import LoadRun
from quantkit.load.step_record import Step

# Above this CPU share the client's asyncio loop queues work (benchmarks/load_client.py: TTFT against
# an instant server rises from ~1 ms to tens of ms as the client nears one busy core).
BUSY_CLIENT = 0.7


def _ms(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(pair: list | None, digits: int = 0) -> str:
    if not pair:
        return "-"
    low, high = ("…" if v is None else f"{v:.{digits}f}" for v in pair)
    return f"[{low}, {high}]"


def _partial(step: Step) -> str:
    unfinished = step.unfinished or 0
    return f"partial ({unfinished} cut)" if unfinished else "partial"


def _parts_cell(step: Step) -> str:
    found = step.parts
    if found is None:
        return "-"
    return "/".join(_ms(found.part(name).mean) for name in PARTS)


def _cpu_cell(step: Step) -> str:
    shares = step.cpu
    if shares is None or shares.client is None:
        return "-"
    cells = [f"{shares.client:.2f}"]
    if shares.server is not None:
        cells += [f"{shares.server:.2f}", f"{shares.others:.2f}" + ("!" if shares.disturbed else "")]
    return "/".join(cells)


def render_table(run: LoadRun):
    """The per-step table (a rich Table)."""
    mode = run.settings.mode
    table = Table(title=f"quantkit load: {run.label}")
    slo = run.settings.has_slo
    head = [
        "step",
        "conc" if mode == "concurrency" else "rate",
        "req/s",
        "out tok/s",
        "TTFT p50/p90/p99 ms",
        "TPOT p50/p90/p99 ms",
        "ITL p99",
        "E2E p99",
        "queue/prefill/other ms",
        "CPU client/server/others",
        "ok/sent",
        "err/timeout",
        *(["goodput req/s"] if slo else []),
        "note",
    ]
    for name in head:
        table.add_column(name, justify="right")
    for i, step in enumerate(run.steps):
        t, p = step.ttft_ms, step.tpot_ms
        note = _partial(step) if step.partial else (step.phase or "")
        row = [
            str(i),
            f"{step.offered:g}",
            _ms(step.achieved_qps, 2),
            _ms(step.output_tokens_per_s, 1),
            f"{_ms(t.p50)}/{_ms(t.p90)}/{_ms(t.p99)}",
            f"{_ms(p.p50, 1)}/{_ms(p.p90, 1)}/{_ms(p.p99, 1)}",
            _ms(step.itl_ms.p99, 1),
            _ms(step.e2e_ms.p99),
            _parts_cell(step),
            _cpu_cell(step),
            f"{step.completed}/{step.requests}",
            f"{step.error_count - step.timeouts}/{step.timeouts}",
            *([_ms(step.goodput.qps if step.goodput else None, 2)] if slo else []),
            note,
        ]
        table.add_row(*row)
    return table


def summary_lines(run: LoadRun) -> list[str]:
    """The knees, what degraded first, how the run ended, the TTFT parts, and the client's overhead."""
    analysis, lines = run.analysis, []
    knee, peak, mode = analysis.knee, analysis.peak, run.settings.mode
    if knee:
        lines.append(
            f"knee (saturation): {mode}={knee.offered:g} at {knee.achieved_qps:.2f} req/s, "
            f"{knee.output_tokens_per_s:.1f} output tok/s; TTFT-P99 {_ms(knee.ttft_p99_ms)} ms, "
            f"TPOT-P99 {_ms(knee.tpot_p99_ms, 1)} ms"
        )
    elif peak and not run.settings.search:
        lines.append(
            f"knee (saturation): not reached within the bounds; peak {peak.achieved_qps or 0:.2f} req/s at "
            f"{mode}={peak.offered:g}{_cut(peak.partial)} (raise the load to find it)"
        )
    if knee and peak and peak.offered != knee.offered:
        lines.append(f"peak: {peak.achieved_qps or 0:.2f} req/s at {mode}={peak.offered:g}{_cut(peak.partial)}")
    lines.extend(_slo_knee_lines(run))
    lines.append(analysis.degraded_first.meaning)
    lines.extend(_parts_lines(run))
    lines.extend(_workload_lines(run))
    slo_best = analysis.max_qps_within_slo
    if run.settings.has_slo:
        lines.append(
            "max req/s with P99s within the SLO: "
            + (
                f"{slo_best.achieved_qps:.2f} ({mode}={slo_best.offered:g}{_cut(slo_best.partial)})"
                if slo_best
                else "none"
            )
        )
    lines.extend(_error_lines(run.steps))
    lines.extend(_client_lines(run))
    detail = run.stop_detail
    lines.append(f"stopped: {run.stopped}" + (f" ({detail})" if detail else ""))
    return lines


def _slo_knee_lines(run: LoadRun) -> list[str]:
    found = run.analysis.slo_knee
    if not found:
        return []
    mode = run.settings.mode
    if found.censored:
        side = "below the lowest" if found.censored == "below" else "above the highest"
        head = f"knee (SLO): {side} level measured ({mode} {found.bound:g})"
    else:
        head = (
            f"knee (SLO): {mode} {found.knee:.2f} {_ci(found.ci95, 2)}, "
            f"{_ms(found.knee_qps, 2)} req/s {_ci(found.knee_qps_ci95, 2)} (95% intervals)"
        )
    lines = [head]
    for level in found.levels:
        warn = f", P99 within the top {level.completed} requests (fewer than {run.p99_requests_needed})"
        lines.append(
            f"  {mode}={level.offered:g}: {level.steps} step(s), {level.completed} answered; "
            f"TTFT-P99 {_ms(level.ttft_p99_ms)} ms {_ci(level.ttft_p99_ci95)}, "
            f"TPOT-P99 {_ms(level.tpot_p99_ms, 1)} ms {_ci(level.tpot_p99_ci95, 1)}, "
            f"{'meets' if level.meets_slo else 'misses'} the SLO" + (warn if level.p99_is_near_max else "")
        )
    return lines


def _parts_lines(run: LoadRun) -> list[str]:
    levels = run.levels or run.steps
    found = [s for s in levels if s.parts is not None]
    if not found:
        absent = levels[0].ttft_parts.absent if levels and levels[0].ttft_parts else None
        return [f"TTFT parts: none ({absent})"] if absent else []
    lines = []
    for step in found:
        p = step.parts
        lines.append(
            f"TTFT parts at {step.mode}={step.offered:g}: queue {_ms(p.queue_ms.mean)} ms "
            f"({100 * p.share.queue:.0f}%), prefill {_ms(p.prefill_ms.mean)} ms "
            f"({100 * p.share.prefill:.0f}%), other {_ms(p.other_ms.mean)} ms (means"
            + (f"; {p.check.mismatched} of {p.n} requests off by more than 5%" if p.check.mismatched else "")
            + ")"
        )
    first = found[0].parts
    lines.append(f"TTFT parts from: queue {first.source_of('queue_ms')}; prefill {first.source_of('prefill_ms')}")
    return lines


def _workload_lines(run: LoadRun) -> list[str]:
    """The workload's shape, and what the server said it cached of it."""
    workload = run.settings.workload
    lines = []
    if workload.name != "synthetic":
        lines.append(f"workload: {workload.spec}")
    elif workload.shared_prefix or workload.turns > 1 or "," in workload.prompt_len_spec:
        lines.append(
            f"workload: prompt-len {workload.prompt_len_spec}, shared prefix "
            f"{workload.shared_prefix} tokens, {workload.turns} turn(s) per conversation"
        )
    cached = [
        (s.cached_tokens_mean, s.prompt_tokens_mean, s.cache_hit_fraction)
        for s in run.steps
        if s.cache_hit_fraction is not None
    ]
    if cached:
        hit = sum(c[2] for c in cached) / len(cached)
        lines.append(
            f"prefix cache: {100 * hit:.0f}% of prompt tokens served from the server's cache "
            f"(per request {cached[0][0]:.0f} of {cached[0][1]:.0f} tokens in step 0)"
        )
    drafts = [s.draft_acceptance for s in run.steps if s.draft_acceptance is not None]
    if drafts:
        lines.append(f"speculative decoding: {100 * drafts[0]:.0f}% of drafted tokens accepted in step 0")
    for step in run.levels:
        for name, cls in (step.classes or {}).items():
            lines.append(
                f"class {name} at {step.mode}={step.offered:g}: {cls.completed}/{cls.requests} ok, "
                f"TTFT-P50/P99 {_ms(cls.ttft_ms.p50)}/{_ms(cls.ttft_ms.p99)} ms, "
                f"TPOT-P99 {_ms(cls.tpot_ms.p99, 1)} ms"
            )
    return lines


def _client_lines(run: LoadRun) -> list[str]:
    client = run.client_overhead
    parse = client.parse_ms
    text = f"client overhead: parse+bookkeeping P50 {_ms(parse.p50, 2)} ms, P99 {_ms(parse.p99, 2)} ms per request"
    if client.send_lag_ms:
        text += f"; send lag P99 {_ms(client.send_lag_ms.p99, 1)} ms"
    if client.cpu_share_max is not None:
        text += f"; client CPU up to {client.cpu_share_max:.2f} cores"
    lines = [text]
    if (client.cpu_share_max or 0) > BUSY_CLIENT:
        lines.append(
            f"warning: the client used {client.cpu_share_max:.2f} of its one core: its own event-loop "
            "delays are in these latencies; run it on a quieter machine or lower the load (docs/LOAD.md)"
        )
    placement = run.cpu
    if placement is not None and placement.client_cores is not None:
        lines.append(f"cores: client {_cores(placement.client_cores)}, server {_cores(placement.server_cores)}")
    if placement is not None and placement.warning:
        lines.append(f"warning: {placement.warning}")
    disturbed = [i for i, s in enumerate(run.steps) if s.cpu and s.cpu.disturbed]
    if disturbed:
        lines.append(
            f"warning: other processes used the cores during step(s) {', '.join(map(str, disturbed))}: "
            "measure again before reading them (--rerun-disturbed)"
        )
    if run.discarded:
        lines.append(f"{len(run.discarded)} disturbed step(s) measured again (kept under `discarded`)")
    return lines


def _cores(cores: list[int] | None) -> str:
    return "unknown" if cores is None else ",".join(map(str, cores))


def _cut(partial: bool) -> str:
    return ", cut short" if partial else ""


def _error_lines(steps: list[Step]) -> list[str]:
    """One line per error kind seen in the run: how many, and the first message."""
    totals: dict[str, int] = {}
    examples: dict[str, str] = {}
    for step in steps:
        for kind, n in (step.errors or {}).items():
            if n:
                totals[kind] = totals.get(kind, 0) + n
        for kind, text in (step.error_examples or {}).items():
            examples.setdefault(kind, text)
    return [f"errors: {n} {kind}, e.g. {examples.get(kind) or '-'}" for kind, n in totals.items()]
