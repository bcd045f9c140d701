"""The lever table: one row per lever from its load run (pure apart from the optional roofline probe).

lever -> knee req/s, TTFT-P99 and TPOT-P99 at the knee, goodput under the SLO, which latency
degraded first, the lightest step's TTFT-P50/TPOT-P50 (batch-1-like figures: prefix caching and
weight bytes show there first), and ratios against the baseline (the first lever).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from quantkit.bench.probe import cached_probe
from quantkit.core.hardware import shape_config
from quantkit.core.roofline import Shape, prefill_flops
from quantkit.load.compare import compare_load_runs
from quantkit.load.lever_records import RATIOS, LeverRow, LeverStudy, PrefixReference, PrefixRow
from quantkit.load.load_comparison import LoadComparison
from quantkit.load.runfile import LoadRun
from quantkit.load.step_record import Latency, Step
from quantkit.load.study import reference_shape


def _p(step: Step | None, metric: str, q: str = "p50") -> float | None:
    """A step's percentile of one metric, None where it was not measured."""
    return getattr(step.latency(metric) if step else Latency(), q)


def _ratio(new, old):
    return new / old if new is not None and old else None


def _share(step: Step | None, part: str) -> float | None:
    found = step.parts if step else None
    return getattr(found.share, part) if found else None


def _prefill_ms(step: Step | None) -> float | None:
    found = step.parts if step else None
    return found.prefill_ms.mean if found else None


def _classes(levels: list[Step], metric: str = "ttft_ms") -> dict | None:
    """Each class's P99 of `metric` per level (long-short: the short prompts' TTFT-P99 is the lever's)."""
    out: dict = {}
    for level in levels:
        for name, cls in (level.classes or {}).items():
            out.setdefault(name, {})[f"{level.offered:g}"] = getattr(cls, metric).p99
    return out or None


def _cpu_max(run: LoadRun, who: str) -> float | None:
    values = [getattr(s.cpu, who) for s in run.steps if s.cpu is not None]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def lever_row(run: LoadRun) -> LeverRow:
    analysis = run.analysis
    knee, peak, best, slo_knee = analysis.knee, analysis.peak, analysis.max_qps_within_slo, analysis.slo_knee
    levels = run.full_levels
    first, last = (levels[0], levels[-1]) if levels else (None, None)
    goodputs = [s.goodput.qps for s in levels if s.goodput and s.goodput.qps is not None]
    return LeverRow(
        **{
            "lever": run.label,
            "changes": run.server.changes if run.server else None,
            "mode": run.settings.mode,
            "knee_offered": knee.offered if knee else None,
            "knee_qps": knee.achieved_qps if knee else None,
            "knee_ttft_p99_ms": knee.ttft_p99_ms if knee else None,
            "knee_tpot_p99_ms": knee.tpot_p99_ms if knee else None,
            "goodput_qps": max(goodputs) if goodputs else None,
            "max_qps_within_slo": best.achieved_qps if best else None,
            "peak_offered": peak.offered if peak else None,
            "peak_qps": peak.achieved_qps if peak else None,
            "degraded_first": analysis.degraded_first.first,
            "first_ttft_p50_ms": _p(first, "ttft_ms"),
            "first_tpot_p50_ms": _p(first, "tpot_ms"),
            "first_cache_hit": first.cache_hit_fraction if first else None,
            "first_draft_acceptance": first.draft_acceptance if first else None,  # speculative decoding: drafts kept
            "last_offered": last.offered if last else None,
            "last_tpot_p50_ms": _p(last, "tpot_ms"),
            "last_ttft_p99_ms": _p(last, "ttft_ms", "p99"),
            "last_draft_acceptance": last.draft_acceptance if last else None,
            "first_queue_share": _share(first, "queue"),
            "last_queue_share": _share(last, "queue"),
            "first_prefill_ms": _prefill_ms(first),
            "last_prefill_ms": _prefill_ms(last),
            "cause": analysis.degraded_first.cause,
            "slo_knee": slo_knee.knee if slo_knee else None,
            "slo_knee_ci95": slo_knee.ci95 if slo_knee else None,
            "slo_knee_censored": slo_knee.censored if slo_knee else None,
            "slo_knee_bound": slo_knee.bound if slo_knee else None,
            "slo_knee_qps": slo_knee.knee_qps if slo_knee else None,
            "slo_knee_qps_ci95": slo_knee.knee_qps_ci95 if slo_knee else None,
            "class_ttft_p99_ms": _classes(levels),
            "requests_per_level": [s.requests for s in levels],
            "rejected": sum(s.errors_of("rejected") for s in run.steps),
            "client_cpu_max": _cpu_max(run, "client"),
            "others_cpu_max": _cpu_max(run, "others"),
            "discarded_steps": len(run.discarded),
            "errors": sum(s.error_count for s in run.steps),
            "stopped": run.stopped,
        }
    )


def lever_table(runs: list[LoadRun], comparison: LoadComparison | None = None) -> list[LeverRow]:
    rows = [lever_row(run) for run in runs]
    shifts = [compared.slo_knee_shift for compared in comparison.runs] if comparison else [None] * len(rows)
    base = rows[0]
    return [
        replace(
            row,
            slo_knee_shift=shift,
            ratios={name: _ratio(getattr(row, name), getattr(base, name)) for name in RATIOS},
        )
        for row, shift in zip(rows, shifts)
    ]


def _lightest(run: LoadRun) -> Step | None:
    levels = run.full_levels
    return levels[0] if levels else None


def _cached_tokens(run: LoadRun) -> tuple[int, int, str] | None:
    """(cached, the rest of the prompt, how counted) at the lightest level: the server's own count of
    prompt tokens served from its cache where it reports one, else the workload's shared prefix."""
    first = _lightest(run)
    cached, prompt = (first.cached_tokens_mean, first.prompt_tokens_mean) if first else (None, None)
    if cached and prompt:
        return round(cached), round(prompt - cached), "the server's cached tokens"
    workload = run.settings.workload
    if workload.shared_prefix and first:
        return workload.shared_prefix, workload.prompt_len_low, "the workload's shared prefix"
    return None


def prefix_reference(shape_path: str, runs: list[LoadRun], base: int = 0) -> PrefixReference:
    """The roofline's prefill time for each run's shared prefix, next to the TTFT-P50 it saved
    against the baseline run (`base`: the prefix prefilled every time) at the lightest step:
    prefill(P+S) - prefill(S), at the probed compute."""

    shape, device = Shape.from_config(shape_config(shape_path)), cached_probe(torch.device("cpu"))
    base_ttft = _p(_lightest(runs[base]), "ttft_ms")
    rows = []
    for run in runs:
        found = _cached_tokens(run)
        if found is None:
            continue
        prefix, suffix, counted = found
        estimate = 1e3 * (prefill_flops(shape, prefix + suffix) - prefill_flops(shape, suffix)) / device.compute
        total = 1e3 * prefill_flops(shape, prefix + suffix) / device.compute
        ttft = _p(_lightest(run), "ttft_ms")
        saved = base_ttft - ttft if base_ttft is not None and ttft is not None else None
        rows.append(
            PrefixRow(
                lever=run.label,
                prefix_tokens=prefix,
                suffix_tokens=suffix,
                counted=counted,
                roofline_prefix_prefill_ms=estimate,
                roofline_prefill_ms=total,
                prefix_share=estimate / total,
                baseline_ttft_p50_ms=base_ttft,
                ttft_p50_ms=ttft,
                saved_ms=saved,
                saved_vs_roofline=_ratio(saved, estimate),
                ttft_ratio=_ratio(ttft, base_ttft),
                # what the ratio would be if TTFT were prefill alone and the prefix's prefill were skipped
                roofline_ttft_ratio=1.0 - estimate / total,
            )
        )
    return PrefixReference(
        shape=shape_path,
        baseline=runs[base].label,
        device=device.name,
        compute_tflops=device.compute / 1e12,
        device_source=device.source,
        levers=rows,
    )


def summarize(study, result: LeverStudy) -> None:
    """The lever table, the comparison of the runs (from two on), and the prefix-cache reference
    where the study asks for it, into the study's result."""
    runs = result.runs
    comparison = compare_load_runs(runs) if len(runs) > 1 else None
    result.table = lever_table(runs, comparison)
    if comparison:
        result.comparison = comparison
    labels = [run.label for run in runs]
    base = study.reference.baseline if study.reference else None
    if study.reference and runs and (base is None or base in labels):  # not before the baseline has run
        result.prefix_reference = prefix_reference(reference_shape(study), runs, labels.index(base) if base else 0)


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _x(value) -> str:
    return "-" if value is None else f"x{value:.2f}"


def render_table(result: LeverStudy) -> str:
    """Markdown: the lever table, then the prefix-cache reference when the study asked for it."""
    lines = [
        "| lever | changes | knee at | knee req/s | TTFT-P99 @knee ms | TPOT-P99 @knee ms | goodput req/s "
        "| peak req/s | degraded first | TTFT-P50 step 0 ms | TPOT-P50 step 0 ms | cached | drafts kept | knee vs base "
        "| peak vs base | TPOT-P99 @knee vs base | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.table or []:
        knee_at = "-" if r.knee_offered is None else f"{r.mode}={r.knee_offered:g}"
        cached, kept = _pct(r.first_cache_hit), _pct(r.first_draft_acceptance)
        lines.append(
            f"| {r.lever} | {r.changes or '-'} | {knee_at} | "
            f"{_f(r.knee_qps)} | {_f(r.knee_ttft_p99_ms, 0)} "
            f"| {_f(r.knee_tpot_p99_ms, 1)} | {_f(r.goodput_qps)} | {_f(r.peak_qps)} "
            f"| {r.degraded_first or '-'} | {_f(r.first_ttft_p50_ms, 0)} | {_f(r.first_tpot_p50_ms, 1)} "
            f"| {cached} | {kept} | {_x(r.ratio('knee_qps'))} | {_x(r.ratio('peak_qps'))} "
            f"| {_x(r.ratio('knee_tpot_p99_ms'))} "
            f"| {r.errors} |"
        )
    ref = result.prefix_reference
    if ref and ref.levers:
        lines += [
            "",
            f"Prefix prefill against the roofline ({ref.shape}, {ref.compute_tflops:.2f} TFLOPS "
            f"probed on {ref.device}; saved against {ref.baseline or 'the first lever'}):",
            "",
            "| lever | prefix + suffix tokens | roofline prefill of the prefix ms (share) | TTFT-P50 baseline -> "
            "lever ms | TTFT ratio measured | TTFT ratio roofline | saved ms | saved / roofline |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in ref.levers:
            lines.append(
                f"| {r.lever} | {r.prefix_tokens} + {r.suffix_tokens} | "
                f"{_f(r.roofline_prefix_prefill_ms, 1)} "
                f"({100 * r.prefix_share:.0f}%) | {_f(r.baseline_ttft_p50_ms, 0)} -> {_f(r.ttft_p50_ms, 0)} "
                f"| {_x(r.ttft_ratio)} | {_x(r.roofline_ttft_ratio)} "
                f"| {_f(r.saved_ms, 0)} | {_x(r.saved_vs_roofline)} |"
            )
    return "\n".join(lines) + "\n"
