"""The run report: one table (report.md), the same figures (report.json), plots, filled model cards."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from quantkit.bench.bench_records import BenchRow, report_cells, report_columns
from quantkit.core.fits import RuleFit, describe_fit
from quantkit.models.sizes import checkpoint_sizes
from quantkit.pipeline.accuracy import (
    DecodeAt,
    PositionRow,
    accuracy_table,
    kl_header,
    position_table,
)
from quantkit.pipeline.depths import (
    depth_pairs,
    depth_sections,
)
from quantkit.pipeline.plots import pareto, rule_check, ttft_sweep
from quantkit.pipeline.report_content import ReportContent
from quantkit.pipeline.run_report import Fastest, ReportRow
from quantkit.pipeline.serving import EngineBench
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.recipe.schema import BenchConfig

# The table's columns around the bench's: the bench columns between them are BenchRow's own
# (bench/bench_records.py report_columns), so a new bench figure shows here without a line here.
SIZE_COLUMNS = [
    ("variant", "name", "{}"),
    ("size MB", "disk_mb", "{:.1f}"),
    ("bits/weight", "bits_per_weight", "{:.2f}"),
    ("KV B/token", "kv_bytes_per_token", "{:,}"),
]
ACCURACY_COLUMNS = [
    ("ΔPPL %", "delta_ppl_pct", "{:+.2f}"),
    ("KL", "kld_mean", "{:.4f}"),
    ("top-1", "top1_pct", "{:.1f}%"),
    ("lm-eval Δ", "tasks_delta", "{}"),
]


def table_columns() -> list[tuple[str, str, str]]:
    """The report table's columns: (header, the row's key, the format of a present value)."""
    bench = [(c.title, c.key, c.fmt) for c in report_columns()]
    return [*SIZE_COLUMNS, *bench, *ACCURACY_COLUMNS]


ACCURACY_KEYS = ("delta_ppl_pct", "kld_mean", "top1_pct")


def variant_row(rec: VariantRecord, engine: str | None = None) -> dict:
    """The variant's figures; with `engine`, its bench figures on that engine (a run's row per engine)."""
    row: dict = {"name": rec.name, "status": "failed" if rec.error else "ok", "error": rec.error}
    if rec.artifact:
        sizes = checkpoint_sizes(Path(rec.artifact))
        row.update(
            disk_mb=sizes.disk_bytes / 1e6,
            bits_per_weight=sizes.bits_per_weight,
            kv_bytes_per_token=sizes.kv_bytes_per_token,
        )
    elif (
        rec.gguf_variant
    ):  # llama-quantize's GGUF: its file, its decoder layers' bits (as sizes.py counts a checkpoint's)
        made = rec.gguf
        row.update(disk_mb=made.bytes / 1e6, bits_per_weight=made.bits_per_weight_layers, gguf_type=made.gguf_type)
    ev = rec.eval
    t = ev.primary if ev is not None else None
    if t is not None:
        row.update(
            ppl=t.ppl,
            baseline_ppl=t.baseline_ppl,
            delta_ppl_pct=t.delta_ppl_pct,
            kld_mean=t.kld.mean,
            kld_p99=t.kld.p99,
            kl_kind=t.kl_kind,
            top1_pct=t.top1_agreement * 100,
            ci95=t.ci95.to_json(),
            domain=t.label,
        )
    if ev is not None and ev.tasks:
        row["tasks"] = {n: d.to_json() for n, d in ev.tasks.items()}
        row["tasks_delta"] = ", ".join(f"{n} {d.delta:+.3f}±{d.delta_stderr:.3f}" for n, d in ev.tasks.items())
    b: BenchRow | None = rec.benches.get(engine) if engine else rec.bench
    if b is not None:
        row.update(
            ttft_ms=b.ttft_ms,
            tpot_ms=b.tpot_ms,
            predicted_tpot_ms=b.predicted_tpot_ms,
            tpot_efficiency_pct=b.tpot_efficiency * 100,
            bytes_per_token=b.bytes_per_token,
            kernel=b.kernel,
            accounting_error=b.accounting_error,
            engine=b.engine,
            threads=b.threads,
            disturbed=list(b.disturbed),
        )
        if b.attribution is not None:
            row.update(attribution=b.attribution.to_json(), lever=b.attribution.lever)
        row.update({k: v for k, v in report_cells(b).items() if k not in row})  # the table's bench columns
    if engine:
        row["engine"] = engine
        failed = rec.bench_errors.get(engine)
        if failed and not rec.error:
            row.update(status="failed", error=f"bench ({engine}): {failed}")
    return row


def position_rows(rec: VariantRecord, bench_rows) -> list[PositionRow]:
    """A row per position bucket of each of the variant's domains, beside `bench_rows` (the
    variant's bench rows on every engine) at the depths inside the bucket."""
    out = []
    for ev in rec.evaluations():
        for t in ev.texts:
            if len(t.positions) < 2:
                continue  # one bucket is the domain's own row
            for b, at in depth_pairs(t.positions, bench_rows):
                decode = tuple(DecodeAt(r.engine, r.depth, r.tpot_ms) for r in at)
                out.append(PositionRow(rec.name, ev.engine, t.label, t.kl_kind, b, decode))
    return out


def markdown_table(rows: list[dict], domain: str | None = None) -> str:
    """The main table; with several evaluation domains its accuracy columns are the first domain's
    (named in their headers) and accuracy_table has them all. The KL column names its kind."""
    # several engines: a row per variant and engine, the engine named beside the variant
    typed = [ReportRow.from_json(r) for r in rows]
    many = len({t.engine for t in typed if t.engine}) > 1
    kl = kl_header(t.kl_kind for t in typed if t.kl_kind)
    named = [(kl if key == "kld_mean" else h, key, fmt) for h, key, fmt in table_columns()]
    base = [(f"{h} ({domain})" if domain and key in ACCURACY_KEYS else h, key, fmt) for h, key, fmt in named]
    columns = [base[0], ("engine", "engine", "{}"), *base[1:]] if many else base
    first = 2 if many else 1
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for r, t in zip(rows, typed):
        cells = []
        for _, key, fmt in columns:  # the table's columns, by the names report_columns gives them
            v = r.get(key)
            cells.append("—" if v is None else fmt.format(v))
        if t.error:
            cells[first:] = [f"failed: {t.error[:80]}"] + [""] * (len(columns) - first - 1)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fastest(rows: list[dict]) -> dict[str, Fastest]:
    """variant -> the engine with the lowest TPOT and the one with the lowest TTFT, with each
    engine's figures, among the engines that benched it."""
    by_variant: dict[str, list[ReportRow]] = {}
    for r in map(ReportRow.from_json, rows):
        if r.tpot_ms is not None and r.engine:
            by_variant.setdefault(r.name, []).append(r)
    out = {}
    for name, rs in by_variant.items():
        if len(rs) < 2:
            continue
        tpot, ttft = min(rs, key=lambda r: r.tpot_ms), min(rs, key=lambda r: r.ttft_ms)
        slowest = max(r.tpot_ms for r in rs)
        out[name] = Fastest(
            tpot=tpot.engine,
            ttft=ttft.engine,
            tpot_speedup=slowest / tpot.tpot_ms,
            tpot_ms={r.engine: r.tpot_ms for r in rs},
            ttft_ms={r.engine: r.ttft_ms for r in rs},
        )
    return out


def _fit_text(fit: RuleFit | None, what: str) -> str | None:
    """The rule check's line (core/fits.describe_fit) of a report's fit, prefixed by `what`."""
    line = describe_fit(fit) if fit else None
    return f"{what}: {line.removeprefix('rule check ')}" if line else None


def lever_lines(rows: list[dict]) -> list[str]:
    """Where each variant's decode time goes and what presses its largest term down."""
    out = []
    for r in map(ReportRow.from_json, rows):
        if r.lever:
            engine = f" ({r.engine})" if r.engine else ""
            out.append(f"- {r.name}{engine}: {r.lever}")
        if r.disturbed:
            out.append(f"- {r.name}: disturbed ({'; '.join(r.disturbed)}): kept out of the rule check")
    return (
        ["**Where TPOT goes** (each row's attribution, and the lever for its largest term):", *out, ""] if out else []
    )


def engine_lines(report: ReportContent) -> list[str]:
    """A run on several engines: each engine's probe and rule check, and the fastest engine per variant."""
    out = []
    rows = report.typed_rows()
    for name, e in report.engines.items():
        if e.error:
            out.append(f"- **{name}**: not benchmarked: {e.error}")
            continue
        dev = e.device
        probe = f"{dev.threads} threads, probed {dev.bandwidth_gbps:.1f} GB/s read" if dev else "no probe"
        effs = [row.tpot_efficiency_pct for row in rows if row.engine == name and row.tpot_efficiency_pct is not None]
        eff = f"; TPOT efficiency {min(effs):.0f}–{max(effs):.0f}% of the roofline" if effs else ""
        fit = _fit_text(e.fit, "rule check")
        out.append(f"- **{name}** ({probe}{eff}): {fit or 'rule check: not enough variants to fit'}.")
    if report.fastest:
        out += ["", "**Fastest engine per variant** (batch-1 TPOT):"]
        for name, f in report.fastest.items():
            ms = ", ".join(f"{e} {t:.2f} ms" for e, t in sorted(f.tpot_ms.items(), key=lambda kv: kv[1]))
            ttft = ", ".join(f"{e} {t:.1f} ms" for e, t in sorted(f.ttft_ms.items(), key=lambda kv: kv[1]))
            out.append(
                f"- {name}: **{f.tpot}**, {f.tpot_speedup:.2f}x faster per token "
                f"than the slowest (TPOT {ms}; TTFT {ttft})"
            )
    return out


def render_markdown(r: ReportContent) -> str:
    dev = r.device
    out = [
        f"# quantkit run: {r.recipe}",
        "",
        f"- model: `{r.model}` (sha256 {r.model_sha256[:12]}…)",
        f"- date: {r.date}, host: {r.host}",
        (
            f"- device: {dev.name} — {dev.bandwidth_gbps:.1f} GB/s read, "
            f"{dev.compute_tflops:.2f} TFLOP/s bf16 (probed in this run)"
            if dev
            else "- device: not probed (no bench in this run)"
        ),
        f"- eval: {r.eval_text or 'skipped'}{_eval_device(r)}; bench: {_bench_settings(r.bench_settings)}",
        "",
        markdown_table(list(r.rows), domain=_first_domain(r)),
        "",
    ]
    acc = r.accuracy
    if len({a.domain for a in acc}) > 1 or len({a.engine for a in acc}) > 1:
        out += [
            "**Accuracy per domain** (each text's held-out windows; the 95% intervals resample whole windows"
            + (
                "; llamacpp scores each variant's exact GGUF in llama.cpp against the same baseline pass"
                if len({a.engine for a in acc}) > 1
                else ""
            )
            + "):",
            "",
            accuracy_table(list(acc)),
            "",
        ]
    if r.positions:
        out += [
            "**Accuracy by position in the window** (row i predicts token i + 1 from the i + 1 tokens before it: the"
            " KV cache's depth; whole windows resampled"
            + (
                "; TPOT where the bench decoded at a depth inside the bucket"
                if any(p.decode for p in r.positions)
                else ""
            )
            + "):",
            "",
            position_table(list(r.positions)),
            "",
        ]
    out += lever_lines(list(r.rows))
    out += depth_sections(r.long_context, r.depths)
    variants = list(r.variants.values())
    eval_failed = [f"- {v.name}: eval ({e}): {msg}" for v in variants for e, msg in v.eval_errors.items()]
    if eval_failed:
        out += ["Evaluation failed on an engine:", *eval_failed, ""]
    fit = _fit_text(r.fit, "**Rule check**")
    if len(r.engines) > 1:
        out += [
            "**Rule check per engine**, each against its own probe of the device in this run:",
            *engine_lines(r),
            "",
        ]
    elif fit:
        out.append(fit + ".")
    export_failed = [f"- {v.name}: export {fmt}: {msg}" for v in variants for fmt, msg in v.export_errors.items()]
    if export_failed:
        out += ["Export failed:", *export_failed, ""]
    rows = r.typed_rows()
    failed = [f"- {row.name}: {row.error}" for row in rows if row.error]
    if failed:
        out += ["Failed:", *failed, ""]
    above = [row.name for row in rows if row.accounting_error]
    if above:
        out.append(
            f"\n(!) {', '.join(above)}: an efficiency above 100% (TPOT or TTFT against its floor) means the byte or "
            "FLOP accounting, or the probed device figures, are wrong there."
        )
    many = len(r.engines) > 1
    kernels = [f"- {row.name}{' (' + row.engine + ')' if many else ''}: {row.kernel}" for row in rows if row.kernel]
    if kernels:
        out += ["", "Kernels that ran:", *kernels]
    out += [
        "",
        f"Plots: {', '.join(r.plots) or 'none'}",
        f"Wall time {r.wall_seconds:.0f} s; steps {r.steps_seconds:.0f} s; run overhead {r.overhead_pct:.1f}%.",
        "",
    ]
    return "\n".join(out)


def _bench_settings(b: BenchConfig | None) -> str:
    """The bench settings in words: engines, device, prompt and generated tokens, repeats, threads."""
    if b is None:
        return "skipped"
    engines = ", ".join(b.engines or [b.engine])
    threads = f", {b.threads} threads" if b.threads else ""
    sweep = f", TTFT sweep {','.join(map(str, b.prompt_sweep))}" if b.prompt_sweep else ""
    depths = f", KV depths {','.join(map(str, b.depths))}" if b.depths else ""
    fa = f", flash attention {b.flash_attn} (llama.cpp)" if b.flash_attn != "default" else ""
    return (
        f"{engines} on {b.device}, {b.prompt_len}-token prompt, {b.gen_len} generated, "
        f"{b.repeats} repeats after {b.warmups} warm-ups{threads}{sweep}{depths}{fa}"
    )


def _first_domain(report: ReportContent) -> str | None:
    domains = list(dict.fromkeys(a.domain for a in report.accuracy))
    return domains[0] if len(domains) > 1 else None


def _eval_device(report: ReportContent) -> str:
    """Where the evaluation ran, from the first variant evaluated: device, its name, dtype."""
    evals = [v.eval for v in report.variants.values() if v.eval is not None]
    ev = next((e for e in evals if e.device), None)
    if ev is None:
        return ""
    return f" (on {ev.device_id}, {ev.device_name}, {ev.dtype})"


def has_plots(benches: dict[str, EngineBench]) -> bool:
    """Whether a run's report has plots (an engine that benched a variant): then it gets RUN_DIR/plots."""
    return any(eb.rows for eb in benches.values())


def make_plots(folder: Path, benches: dict[str, EngineBench], rows: list[dict]) -> list[str]:
    """The rule check (one series and fit per engine), accuracy against TPOT, TTFT against prompt
    length, drawn into `folder`."""

    ran = {e: eb.result for e, eb in benches.items() if eb.rows}
    if not ran:
        return []
    many = len(benches) > 1
    bench_rows = [replace(b, name=f"{b.name} ({e})") if many else b for e, res in ran.items() for b in res.rows]
    d = folder
    first = next(iter(ran.values()))
    fits = {e: res.fit for e, res in ran.items()} if many else None
    bandwidths = {e: res.device.bandwidth_gbps for e, res in ran.items()}
    plots = [
        str(
            rule_check(
                bench_rows,
                first.fit,
                first.device.bandwidth_gbps,
                d / "rule_check.png",
                fits=fits,
                bandwidths=bandwidths,
            )
        )
    ]
    typed = [ReportRow.from_json(r) for r in rows]
    points = [replace(r, name=f"{r.name} ({r.engine})") for r in typed] if many else typed
    if any(r.kld_mean is not None and r.tpot_ms is not None for r in points):
        plots.append(str(pareto(points, d / "accuracy_vs_tpot.png")))
    if any(b.prompt_sweep for b in bench_rows):
        plots.append(str(ttft_sweep(bench_rows, d / "ttft_vs_prompt.png")))
    return plots
