"""The run report: one table (report.md), the same figures (report.json), plots, filled model cards."""

from __future__ import annotations

import platform
import time
from pathlib import Path

from .atomic import write_json, write_text
from .errors import QuantkitError
from .progress import note
from .sizes import checkpoint_sizes

COLUMNS = [
    ("variant", "name", "{}"), ("size MB", "disk_mb", "{:.1f}"), ("bits/weight", "bits_per_weight", "{:.2f}"),
    ("KV B/token", "kv_bytes_per_token", "{:,}"), ("TTFT ms", "ttft_ms", "{:.1f}"), ("TPOT ms", "tpot_ms", "{:.2f}"),
    ("pred TPOT ms", "predicted_tpot_ms", "{:.2f}"), ("efficiency", "tpot_efficiency_pct", "{:.0f}%"),
    ("ΔPPL %", "delta_ppl_pct", "{:+.2f}"), ("KL", "kld_mean", "{:.4f}"), ("top-1", "top1_pct", "{:.1f}%"),
    ("lm-eval Δ", "tasks_delta", "{}"),
]


def variant_row(rec: dict) -> dict:
    row: dict = {"name": rec["name"], "status": "failed" if rec.get("error") else "ok", "error": rec.get("error")}
    if rec.get("artifact"):
        sizes = checkpoint_sizes(Path(rec["artifact"]))
        row.update(disk_mb=sizes["disk_bytes"] / 1e6, bits_per_weight=sizes["bits_per_weight"], kv_bytes_per_token=sizes["kv_bytes_per_token"])
    ev = rec.get("eval") or {}
    if "ppl" in ev:
        row.update(ppl=ev["ppl"], baseline_ppl=ev["baseline_ppl"], delta_ppl_pct=ev["delta_ppl_pct"], kld_mean=ev["kld"]["mean"],
                   kld_p99=ev["kld"]["p99"], top1_pct=ev["top1_agreement"] * 100, ci95=ev.get("ci95"))
    if ev.get("tasks"):
        row["tasks"] = ev["tasks"]
        row["tasks_delta"] = ", ".join(f"{n} {t['delta']:+.3f}±{t['delta_stderr']:.3f}" for n, t in ev["tasks"].items())
    b = rec.get("bench") or {}
    if b:
        row.update(ttft_ms=b["ttft_ms"], tpot_ms=b["tpot_ms"], predicted_tpot_ms=b["predicted_tpot_ms"],
                   tpot_efficiency_pct=b["tpot_efficiency"] * 100, bytes_per_token=b["bytes_per_token"], kernel=b["kernel"],
                   accounting_error=b["accounting_error"])
    return row


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = []
        for _, key, fmt in COLUMNS:
            v = r.get(key)
            cells.append("—" if v is None else fmt.format(v))
        if r.get("error"):
            cells[1:] = [f"failed: {r['error'][:80]}"] + [""] * (len(COLUMNS) - 2)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    r, fit = report, report.get("fit") or {}
    dev = r.get("device") or {}
    out = [f"# quantkit run: {r['recipe']}", "",
           f"- model: `{r['model']}` (sha256 {r['model_sha256'][:12]}…)",
           f"- date: {r['date']}, host: {r['host']}",
           f"- device: {dev.get('name', 'n/a')} — {dev.get('bandwidth_gbps', 0):.1f} GB/s read, {dev.get('compute_tflops', 0):.2f} TFLOP/s bf16 (probed in this run)",
           f"- eval: {r.get('eval_text') or 'skipped'}; bench: {r.get('bench_settings') or 'skipped'}", "",
           markdown_table(r["rows"]), ""]
    if fit.get("effective_gbps"):
        out.append(f"**Rule check** (TPOT = overhead + bytes/token ÷ bandwidth, least squares over {fit['points']} variants): "
                   f"effective {fit['effective_gbps']:.2f} GB/s, fixed overhead {fit['overhead_ms']:.2f} ms per step, R² {fit['r2']:.3f}.")
    elif fit.get("r2") is not None:
        out.append(f"**Rule check**: TPOT does not grow with bytes per token here (R² {fit['r2']:.3f}); decode is overhead-bound on this engine.")
    failed = [f"- {row['name']}: {row['error']}" for row in r["rows"] if row.get("error")]
    if failed:
        out += ["Failed:", *failed, ""]
    if any(row.get("accounting_error") for row in r["rows"]):
        out.append("\n(!) An efficiency above 100% means the byte accounting or the probed bandwidth is wrong.")
    kernels = [f"- {row['name']}: {row['kernel']}" for row in r["rows"] if row.get("kernel")]
    if kernels:
        out += ["", "Kernels that ran:", *kernels]
    out += ["", f"Plots: {', '.join(r.get('plots', [])) or 'none'}",
            f"Wall time {r['wall_seconds']:.0f} s; steps {r['steps_seconds']:.0f} s; run overhead {r['overhead_pct']:.1f}%.", ""]
    return "\n".join(out)


def finish_run(runner, bench: dict | None, total_s: float) -> dict:
    from .card import update_card_results

    rows = [variant_row(rec) for rec in runner.variants.values()]
    plots = []
    if bench and bench["rows"]:
        from .plots import pareto, rule_check, ttft_sweep

        d = runner.dir / "plots"
        d.mkdir(exist_ok=True)
        bench_rows = [{**b, "name": b["name"]} for b in bench["rows"]]
        plots.append(str(rule_check(bench_rows, bench["fit"], bench["device"]["bandwidth_gbps"], d / "rule_check.png")))
        if any(r.get("kld_mean") is not None and r.get("tpot_ms") is not None for r in rows):
            plots.append(str(pareto(rows, d / "accuracy_vs_tpot.png")))
        if any(b.get("prompt_sweep") for b in bench["rows"]):
            plots.append(str(ttft_sweep(bench_rows, d / "ttft_vs_prompt.png")))
    for rec in runner.variants.values():
        art = Path(rec.get("artifact", ""))
        made_here = art.is_relative_to(runner.dir) and art.resolve() != Path(runner.src).resolve()  # never write into the source
        if rec.get("artifact") and (art / "quantkit.json").is_file() and made_here:
            try:
                update_card_results(art, {k: rec[k] for k in ("eval", "bench") if rec.get(k)})
            except QuantkitError as exc:  # the report still gets written; the card keeps its old table
                note(f"[{rec['name']}] model card not updated: {exc}")
    steps_s = sum(runner.timings.values())
    report = {
        "kind": "quantkit-run", "schema_version": 1, "recipe": runner.recipe.name, "model": str(runner.src),
        "model_sha256": runner.src_hash, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
        "eval_text": runner.eval_text, "calibration": runner.calib,
        "bench_settings": runner.recipe.bench.model_dump(mode="json") if bench else None,
        "device": bench["device"] if bench else None, "fit": bench["fit"] if bench else None,
        "rows": rows, "variants": runner.variants, "plots": plots, "timings": runner.timings,
        "wall_seconds": total_s, "steps_seconds": steps_s, "overhead_pct": 100.0 * max(0.0, total_s - steps_s) / total_s if total_s else 0.0,
        "failed": [r["name"] for r in rows if r["status"] == "failed"],
    }
    write_json(runner.dir / "report.json", report, default=str)
    write_text(runner.dir / "report.md", render_markdown(report))
    return report
