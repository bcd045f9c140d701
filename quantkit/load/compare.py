"""How far the knee moved between load runs (e.g. FP16 vs INT4, or batching off vs on).

`quantkit compare` calls these when the files it is given are load-run JSONs. The first run is
the baseline; every ratio is other / baseline. A knee "moved" only when the 95% interval of its
ratio excludes 1 (intervals.shift): the knee of the SLO (the highest load that meets it) from each
run's recorded requests. Without an SLO, or from runs that kept no requests (schema 1), the table
shows both knees and says the move cannot be judged; at matched levels a P99 "moved" only when the
interval of its difference excludes 0.
"""

from __future__ import annotations

from dataclasses import replace

from quantkit.load.config import LoadError, Slo
from quantkit.load.intervals import KneeShift, P99Difference, by_level, knee_draws, p99_difference, shift
from quantkit.load.load_comparison import CompareRow, LoadComparison, MatchedEntry, MatchedLevel
from quantkit.load.runfile import LoadRun


def _ratio(new: float | None, old: float | None) -> float | None:
    return new / old if new is not None and old else None


def _slo(run: LoadRun) -> Slo:
    return run.settings.slo


def _row(run: LoadRun) -> CompareRow:
    analysis = run.analysis
    knee, peak, best, slo_knee = analysis.knee, analysis.peak, analysis.max_qps_within_slo, analysis.slo_knee
    return CompareRow(
        label=run.label,
        mode=run.settings.mode,
        knee_offered=knee.offered if knee else None,
        knee_qps=knee.achieved_qps if knee else None,
        knee_tokens_per_s=knee.output_tokens_per_s if knee else None,
        knee_ttft_p99_ms=knee.ttft_p99_ms if knee else None,
        knee_tpot_p99_ms=knee.tpot_p99_ms if knee else None,
        peak_offered=peak.offered if peak else None,
        peak_qps=peak.achieved_qps if peak else None,
        peak_tokens_per_s=peak.output_tokens_per_s if peak else None,
        max_qps_within_slo=best.achieved_qps if best else None,
        slo_knee=slo_knee.knee if slo_knee else None,
        slo_knee_ci95=slo_knee.ci95 if slo_knee else None,
        slo_knee_censored=slo_knee.censored if slo_knee else None,
        slo_knee_bound=slo_knee.bound if slo_knee else None,
        slo_knee_qps=slo_knee.knee_qps if slo_knee else None,
        degraded_first=analysis.degraded_first.first,
        cause=analysis.degraded_first.cause,
        stopped=run.stopped,
    )


def _sampled(run: LoadRun) -> bool:
    return any(step.samples for step in run.steps)


def knee_shift(base: LoadRun, other: LoadRun, seed: int = 0) -> KneeShift:
    """The SLO knee's ratio other / base with its 95% interval; why not, when it cannot be judged."""
    if _slo(base) != _slo(other) or _slo(base).empty:
        return KneeShift(None, None, None, "the runs share no SLO")
    if base.settings.mode != other.settings.mode:
        return KneeShift(None, None, None, "closed and open loop do not compare")
    if not (_sampled(base) and _sampled(other)):
        return KneeShift(None, None, None, "a run kept no per-request samples")
    return shift(knee_draws(base.steps, _slo(base), seed=seed), knee_draws(other.steps, _slo(other), seed=seed + 7))


def _matched(runs: list[LoadRun]) -> list[MatchedLevel]:
    """P99s at each offered level every run measured (same mode only), each against the baseline's
    with the interval of the difference where the runs kept their requests."""
    if len({run.settings.mode for run in runs}) != 1:
        return []
    by_run = [{s.offered: s for s in run.levels if not s.partial} for run in runs]
    steps = [by_level(run.steps) for run in runs]
    common = sorted(set.intersection(*(set(d) for d in by_run)))
    cls = _slo(runs[0]).cls  # the class the SLO is judged on: its own TTFT-P99 against the baseline's
    out = []
    for level in common:
        entries = []
        for i, d in enumerate(by_run):
            versus = {}
            if i and level in steps[0] and level in steps[i]:
                base, mine = steps[0][level], steps[i][level]
                versus = {
                    "ttft_p99_vs_base": p99_difference(base, mine, "ttft_ms"),
                    "tpot_p99_vs_base": p99_difference(base, mine, "tpot_ms"),
                    "class_ttft_p99_vs_base": p99_difference(base, mine, "ttft_ms", cls=cls) if cls else None,
                }
            step = d[level]
            entries.append(MatchedEntry(step.achieved_qps, step.ttft_ms.p99, step.tpot_ms.p99, **versus))
        out.append(MatchedLevel(offered=level, runs=entries))
    return out


def _verdict(base: CompareRow, row: CompareRow, moved: KneeShift) -> str:
    name = row.label
    if moved.ci95:
        low, high = moved.ci95
        word = "moved" if moved.moved else "did not move (the interval includes no change)"
        return (
            f"{name}: the SLO knee {word}: {row.mode} {base.slo_knee:.2f} -> {row.slo_knee:.2f}, "
            f"x{moved.ratio:.2f} [{low:.2f}, {high:.2f}] (95%)"
        )
    if base.slo_knee_censored or row.slo_knee_censored:
        where = {"below": "below", "above": "above", None: "at"}
        return (
            f"{name}: SLO knee {where[row.slo_knee_censored]} {row.mode} "
            f"{row.slo_knee or row.slo_knee_bound:g}, baseline {where[base.slo_knee_censored]} "
            f"{base.slo_knee or base.slo_knee_bound:g}: a knee outside the levels measured; widen them"
        )
    knee, base_knee = row.knee_qps, base.knee_qps
    head = f"{name}: cannot judge a move ({moved.why})"
    if knee is not None and base_knee is not None:
        return f"{head}; saturation knee {base_knee:.2f} -> {knee:.2f} req/s (x{knee / base_knee:.2f}, no interval)"
    return f"{head}; peaks {base.peak_qps or 0:.2f} -> {row.peak_qps or 0:.2f} req/s"


def compare_load_runs(runs: list[dict | LoadRun]) -> LoadComparison:
    if len(runs) < 2:
        raise LoadError("compare needs at least two load runs")
    runs = [r if isinstance(r, LoadRun) else LoadRun.from_json(r, f"run {i + 1}") for i, r in enumerate(runs)]
    base = _row(runs[0])
    moves = [None] + [knee_shift(runs[0], run) for run in runs[1:]]
    rows = [
        replace(
            row,
            knee_qps_ratio=_ratio(row.knee_qps, base.knee_qps),
            peak_qps_ratio=_ratio(row.peak_qps, base.peak_qps),
            peak_tokens_ratio=_ratio(row.peak_tokens_per_s, base.peak_tokens_per_s),
            slo_knee_shift=move,
        )
        for row, move in zip([base] + [_row(run) for run in runs[1:]], moves)
    ]
    return LoadComparison(
        baseline=base.label,
        runs=rows,
        matched_levels=_matched(runs),
        verdicts=[_verdict(rows[0], row, move) for row, move in zip(rows[1:], moves[1:])],
    )


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def _knee_cell(row: CompareRow) -> str:
    if row.slo_knee_censored:
        return f"{'<' if row.slo_knee_censored == 'below' else '>'} {row.slo_knee_bound:g}"
    if row.slo_knee is None:
        return "-"
    ci = row.slo_knee_ci95 or [None, None]
    return f"{row.slo_knee:.2f} [{_f(ci[0])}, {_f(ci[1])}]"


def _diff_cell(diff: P99Difference | None) -> str:
    if diff is None or diff.difference_ms is None:
        return ""
    low, high = diff.ci95
    return f" ({diff.difference_ms:+.0f} [{low:+.0f}, {high:+.0f}]{' moved' if diff.moved else ''})"


def _entry_cell(r: MatchedEntry) -> str:
    text = (
        f"{_f(r.achieved_qps)}, {_f(r.ttft_p99_ms, 0)}{_diff_cell(r.ttft_p99_vs_base)}, "
        f"{_f(r.tpot_p99_ms, 1)}{_diff_cell(r.tpot_p99_vs_base)}"
    )
    if r.class_ttft_p99_vs_base:
        text += f"; {r.class_ttft_p99_vs_base.cls} TTFT-P99{_diff_cell(r.class_ttft_p99_vs_base)}"
    return text


def render_load_comparison(result: LoadComparison) -> str:
    """Markdown: one row per run, the P99s at matched load levels, then one verdict per run."""
    lines = [
        "| run | SLO knee [95%] | knee (saturation) | knee req/s | peak req/s | peak out tok/s "
        "| req/s in SLO | degraded first | knee vs baseline | peak vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result.runs:
        knee_at = "-" if row.knee_offered is None else f"{row.mode}={row.knee_offered:g}"
        first = row.degraded_first or "-"
        if row.cause:
            first += f" ({row.cause})"
        lines.append(
            f"| {row.label} | {_knee_cell(row)} | {knee_at} | {_f(row.knee_qps)} | {_f(row.peak_qps)} "
            f"| {_f(row.peak_tokens_per_s, 1)} | {_f(row.max_qps_within_slo)} | {first} "
            f"| {_x(row.knee_qps_ratio)} | {_x(row.peak_qps_ratio)} |"
        )
    if result.matched_levels:
        labels = [row.label for row in result.runs]
        lines += [
            "",
            "At matched offered load (req/s, TTFT-P99 ms, TPOT-P99 ms; against the baseline: the P99 "
            "difference and its 95% interval):",
            "",
            "| offered | " + " | ".join(labels) + " |",
            "|---|" + "---|" * len(labels),
        ]
        for level in result.matched_levels:
            lines.append(f"| {level.offered:g} | " + " | ".join(_entry_cell(r) for r in level.runs) + " |")
    lines += [""] + [f"- {verdict}" for verdict in result.verdicts]
    return "\n".join(lines) + "\n"
