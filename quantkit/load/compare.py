"""How far the knee moved between load runs (e.g. FP16 vs INT4, or batching off vs on).

`quantkit compare` calls these when the files it is given are load-run JSONs. The first run is
the baseline; every ratio is other / baseline.
"""

from __future__ import annotations

from quantkit.load.config import LoadError
from quantkit.load.report import KIND, SCHEMA_VERSION


def is_load_run(data: object) -> bool:
    """True for the JSON that `quantkit load --out` writes (how `quantkit compare` tells them apart)."""
    return isinstance(data, dict) and data.get("kind") == KIND


def _check(run: dict, position: int) -> None:
    if not is_load_run(run):
        raise LoadError(f'run {position + 1} is not a quantkit load run (no "kind": "{KIND}")')
    if run.get("schema_version") != SCHEMA_VERSION:
        raise LoadError(
            f"run {position + 1} ({run.get('label')}): schema_version {run.get('schema_version')!r}, "
            f"this quantkit reads {SCHEMA_VERSION}"
        )


def _ratio(new: float | None, old: float | None) -> float | None:
    return new / old if new is not None and old else None


def _row(run: dict) -> dict:
    analysis = run["analysis"]
    knee, peak, slo = analysis["knee"] or {}, analysis["peak"] or {}, analysis["max_qps_within_slo"] or {}
    return {
        "label": run["label"],
        "mode": run["config"]["mode"],
        "knee_offered": knee.get("offered"),
        "knee_qps": knee.get("achieved_qps"),
        "knee_tokens_per_s": knee.get("output_tokens_per_s"),
        "knee_ttft_p99_ms": knee.get("ttft_p99_ms"),
        "knee_tpot_p99_ms": knee.get("tpot_p99_ms"),
        "peak_offered": peak.get("offered"),
        "peak_qps": peak.get("achieved_qps"),
        "peak_tokens_per_s": peak.get("output_tokens_per_s"),
        "max_qps_within_slo": slo.get("achieved_qps"),
        "degraded_first": analysis["degraded_first"]["first"],
        "stopped": run["stopped"],
    }


def _matched(runs: list[dict]) -> list[dict]:
    """P99s at each offered level every run measured (same mode only)."""
    if len({run["config"]["mode"] for run in runs}) != 1:
        return []
    by_run = [{s["offered"]: s for s in run["steps"] if not s.get("partial")} for run in runs]
    common = sorted(set.intersection(*(set(d) for d in by_run)))
    return [
        {
            "offered": level,
            "runs": [
                {
                    "achieved_qps": d[level]["achieved_qps"],
                    "ttft_p99_ms": d[level]["ttft_ms"]["p99"],
                    "tpot_p99_ms": d[level]["tpot_ms"]["p99"],
                }
                for d in by_run
            ],
        }
        for level in common
    ]


def _verdict(base: dict, row: dict) -> str:
    name, knee, base_knee, peak = row["label"], row["knee_qps"], base["knee_qps"], row["peak_qps"] or 0.0
    if knee is not None and base_knee is not None:
        return (
            f"{name}: knee moved from {base_knee:.2f} req/s ({base['mode']}={base['knee_offered']:g}) "
            f"to {knee:.2f} req/s ({row['mode']}={row['knee_offered']:g}), x{knee / base_knee:.2f}"
        )
    if knee is None and base_knee is not None:
        return (
            f"{name}: no knee within its bounds, so the knee moved past {peak:.2f} req/s "
            f"(baseline knee {base_knee:.2f} req/s, x{peak / base_knee:.2f} or more)"
        )
    if knee is not None:
        return f"{name}: knee at {knee:.2f} req/s; the baseline found no knee within its bounds"
    return f"{name}: neither run reached its knee; compare peaks ({peak:.2f} vs {base['peak_qps'] or 0:.2f} req/s)"


def compare_load_runs(runs: list[dict]) -> dict:
    if len(runs) < 2:
        raise LoadError("compare needs at least two load runs")
    for i, run in enumerate(runs):
        _check(run, i)
    rows = [_row(run) for run in runs]
    base = rows[0]
    for row in rows:
        row["knee_qps_ratio"] = _ratio(row["knee_qps"], base["knee_qps"])
        row["peak_qps_ratio"] = _ratio(row["peak_qps"], base["peak_qps"])
        row["peak_tokens_ratio"] = _ratio(row["peak_tokens_per_s"], base["peak_tokens_per_s"])
    return {
        "kind": "load-comparison",
        "schema_version": SCHEMA_VERSION,
        "baseline": base["label"],
        "runs": rows,
        "matched_levels": _matched(runs),
        "verdicts": [_verdict(base, row) for row in rows[1:]],
    }


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def render_load_comparison(result: dict) -> str:
    """Markdown: one row per run, the P99s at matched load levels, then one verdict per run."""
    lines = [
        "| run | knee at | knee req/s | knee TTFT-P99 ms | knee TPOT-P99 ms | peak req/s | peak out tok/s "
        "| req/s in SLO | degraded first | knee vs baseline | peak vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["runs"]:
        knee_at = "-" if row["knee_offered"] is None else f"{row['mode']}={row['knee_offered']:g}"
        lines.append(
            f"| {row['label']} | {knee_at} | {_f(row['knee_qps'])} | {_f(row['knee_ttft_p99_ms'], 0)} "
            f"| {_f(row['knee_tpot_p99_ms'], 1)} | {_f(row['peak_qps'])} | {_f(row['peak_tokens_per_s'], 1)} "
            f"| {_f(row['max_qps_within_slo'])} | {row['degraded_first'] or '-'} "
            f"| {_x(row['knee_qps_ratio'])} | {_x(row['peak_qps_ratio'])} |"
        )
    if result["matched_levels"]:
        labels = [row["label"] for row in result["runs"]]
        lines += [
            "",
            "At matched offered load (req/s, TTFT-P99 ms, TPOT-P99 ms):",
            "",
            "| offered | " + " | ".join(labels) + " |",
            "|---|" + "---|" * len(labels),
        ]
        for level in result["matched_levels"]:
            cells = [
                f"{_f(r['achieved_qps'])}, {_f(r['ttft_p99_ms'], 0)}, {_f(r['tpot_p99_ms'], 1)}" for r in level["runs"]
            ]
            lines.append(f"| {level['offered']:g} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {verdict}" for verdict in result["verdicts"]]
    return "\n".join(lines) + "\n"
