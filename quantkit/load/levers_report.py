"""The lever table: one row per lever from its load run (pure apart from the optional roofline probe).

lever -> knee req/s, TTFT-P99 and TPOT-P99 at the knee, goodput under the SLO, which latency
degraded first, the lightest step's TTFT-P50/TPOT-P50 (batch-1-like figures: prefix caching and
weight bytes show there first), and ratios against the baseline (the first lever).
"""

from __future__ import annotations

import torch

from quantkit.bench.probe import cached_probe
from quantkit.core.hardware import shape_config
from quantkit.core.roofline import Shape, prefill_flops
from quantkit.load.compare import compare_load_runs
from quantkit.load.study import reference_shape


def _p(step: dict, metric: str, q: str = "p50") -> float | None:
    return ((step or {}).get(metric) or {}).get(q)


def _ratio(new, old):
    return new / old if new is not None and old else None


def lever_row(run: dict) -> dict:
    analysis = run["analysis"]
    knee, peak = analysis["knee"] or {}, analysis["peak"] or {}
    first = run["steps"][0] if run["steps"] else {}
    goodputs = [s["goodput"]["qps"] for s in run["steps"] if (s.get("goodput") or {}).get("qps") is not None]
    return {
        "lever": run["label"],
        "changes": (run.get("server") or {}).get("changes"),
        "mode": run["config"]["mode"],
        "knee_offered": knee.get("offered"),
        "knee_qps": knee.get("achieved_qps"),
        "knee_ttft_p99_ms": knee.get("ttft_p99_ms"),
        "knee_tpot_p99_ms": knee.get("tpot_p99_ms"),
        "goodput_qps": max(goodputs) if goodputs else None,
        "max_qps_within_slo": (analysis["max_qps_within_slo"] or {}).get("achieved_qps"),
        "peak_offered": peak.get("offered"),
        "peak_qps": peak.get("achieved_qps"),
        "degraded_first": analysis["degraded_first"]["first"],
        "first_ttft_p50_ms": _p(first, "ttft_ms"),
        "first_tpot_p50_ms": _p(first, "tpot_ms"),
        "first_cache_hit": first.get("cache_hit_fraction"),
        "first_draft_acceptance": first.get("draft_acceptance"),  # speculative decoding: the share of drafts kept
        "errors": sum(s["error_count"] for s in run["steps"]),
        "stopped": run["stopped"],
    }


def lever_table(runs: list[dict]) -> list[dict]:
    rows = [lever_row(run) for run in runs]
    base = rows[0]
    for row in rows:
        for key in (
            "knee_qps",
            "peak_qps",
            "goodput_qps",
            "knee_tpot_p99_ms",
            "first_ttft_p50_ms",
            "first_tpot_p50_ms",
        ):
            row[f"{key}_ratio"] = _ratio(row[key], base[key])
    return rows


def prefix_reference(shape_path: str, runs: list[dict], base: int = 0) -> dict:
    """The roofline's prefill time for each run's shared prefix, next to the TTFT-P50 it saved
    against the baseline run (`base`: the prefix prefilled every time) at the lightest step:
    prefill(P+S) - prefill(S), at the probed compute."""

    shape, device = Shape.from_config(shape_config(shape_path)), cached_probe(torch.device("cpu"))
    base_ttft = _p(runs[base]["steps"][0] if runs[base]["steps"] else {}, "ttft_ms")
    rows = []
    for run in runs:
        workload = run["config"]["workload"]
        prefix, suffix = workload["shared_prefix"], workload["prompt_len"]["low"]
        if not prefix or not run["steps"]:
            continue
        estimate = 1e3 * (prefill_flops(shape, prefix + suffix) - prefill_flops(shape, suffix)) / device.compute
        total = 1e3 * prefill_flops(shape, prefix + suffix) / device.compute
        ttft = _p(run["steps"][0], "ttft_ms")
        saved = base_ttft - ttft if base_ttft is not None and ttft is not None else None
        rows.append(
            {
                "lever": run["label"],
                "prefix_tokens": prefix,
                "suffix_tokens": suffix,
                "roofline_prefix_prefill_ms": estimate,
                "roofline_prefill_ms": total,
                "prefix_share": estimate / total,
                "baseline_ttft_p50_ms": base_ttft,
                "ttft_p50_ms": ttft,
                "saved_ms": saved,
                "saved_vs_roofline": _ratio(saved, estimate),
                "ttft_ratio": _ratio(ttft, base_ttft),
                # what the ratio would be if TTFT were prefill alone and the prefix's prefill were skipped
                "roofline_ttft_ratio": 1.0 - estimate / total,
            }
        )
    return {
        "shape": shape_path,
        "baseline": runs[base]["label"],
        "device": device.name,
        "compute_tflops": device.compute / 1e12,
        "device_source": device.source,
        "levers": rows,
    }


def summarize(study, runs: list[dict]) -> dict:
    out = {"table": lever_table(runs)}
    if len(runs) > 1:
        out["comparison"] = compare_load_runs(runs)
    labels = [run["label"] for run in runs]
    base = study.reference.baseline if study.reference else None
    if study.reference and runs and (base is None or base in labels):  # not before the baseline has run
        out["prefix_reference"] = prefix_reference(reference_shape(study), runs, labels.index(base) if base else 0)
    return out


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _x(value) -> str:
    return "-" if value is None else f"x{value:.2f}"


def render_table(result: dict) -> str:
    """Markdown: the lever table, then the prefix-cache reference when the study asked for it."""
    lines = [
        "| lever | changes | knee at | knee req/s | TTFT-P99 @knee ms | TPOT-P99 @knee ms | goodput req/s "
        "| peak req/s | degraded first | TTFT-P50 step 0 ms | TPOT-P50 step 0 ms | cached | drafts kept | knee vs base "
        "| peak vs base | TPOT-P99 @knee vs base | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("table", []):
        knee_at = "-" if r["knee_offered"] is None else f"{r['mode']}={r['knee_offered']:g}"
        cached, kept = _pct(r["first_cache_hit"]), _pct(r.get("first_draft_acceptance"))
        lines.append(
            f"| {r['lever']} | {r['changes'] or '-'} | {knee_at} | "
            f"{_f(r['knee_qps'])} | {_f(r['knee_ttft_p99_ms'], 0)} "
            f"| {_f(r['knee_tpot_p99_ms'], 1)} | {_f(r['goodput_qps'])} | {_f(r['peak_qps'])} "
            f"| {r['degraded_first'] or '-'} | {_f(r['first_ttft_p50_ms'], 0)} | {_f(r['first_tpot_p50_ms'], 1)} "
            f"| {cached} | {kept} | {_x(r['knee_qps_ratio'])} | {_x(r['peak_qps_ratio'])} "
            f"| {_x(r.get('knee_tpot_p99_ms_ratio'))} "
            f"| {r['errors']} |"
        )
    ref = result.get("prefix_reference")
    if ref and ref["levers"]:
        lines += [
            "",
            f"Prefix prefill against the roofline ({ref['shape']}, {ref['compute_tflops']:.2f} TFLOPS "
            f"probed on {ref['device']}; saved against {ref.get('baseline') or 'the first lever'}):",
            "",
            "| lever | prefix + suffix tokens | roofline prefill of the prefix ms (share) | TTFT-P50 baseline -> "
            "lever ms | TTFT ratio measured | TTFT ratio roofline | saved ms | saved / roofline |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in ref["levers"]:
            lines.append(
                f"| {r['lever']} | {r['prefix_tokens']} + {r['suffix_tokens']} | "
                f"{_f(r['roofline_prefix_prefill_ms'], 1)} "
                f"({100 * r['prefix_share']:.0f}%) | {_f(r['baseline_ttft_p50_ms'], 0)} -> {_f(r['ttft_p50_ms'], 0)} "
                f"| {_x(r['ttft_ratio'])} | {_x(r.get('roofline_ttft_ratio'))} "
                f"| {_f(r['saved_ms'], 0)} | {_x(r['saved_vs_roofline'])} |"
            )
    return "\n".join(lines) + "\n"
