"""`quantkit bench`: batch-1 TTFT/TPOT next to the roofline, and the rule check across models."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import click

from quantkit.bench.bench_records import bench_table
from quantkit.bench.engines import ENGINES, engine_class
from quantkit.bench.llama_bench import anchor_lines
from quantkit.bench.probe import best_matmul, facts
from quantkit.cli._common import MODEL, echo_json, int_list
from quantkit.cli._options import settings_from_cli, settings_options
from quantkit.core.fits import describe_fit
from quantkit.recipe.bench_options import BenchOptions


def markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def _device_lines(d) -> list[str]:
    sp = (d.probe.get("spread") or {}).get("read_gbps")
    spread = f", spread {sp['spread_pct']:.0f}% over repeats (median {sp['median']:.1f})" if sp else ""
    dtype, _ = best_matmul(d.probe)
    lines = [
        f"device: {d.device} ({d.device_name or d.name}), dtype {d.dtype or '?'}, "
        f"{d.threads} threads: {d.bandwidth_gbps:.1f} GB/s read{spread}, "
        f"{d.compute_tflops:.2f} TFLOP/s {dtype} matmul ({d.source})"
    ]
    drift = d.drift
    if drift and drift.get("worst"):
        w = drift["worst"]
        msg = f"probe after the timings: {w} {drift['change'][w] * 100:+.0f}%"
        lines.append(
            f"warning: {msg}, beyond ±{drift['limit'] * 100:.0f}%: the device changed speed during the run; "
            "every efficiency figure is uncertain by that much"
            if drift["flagged"]
            else msg
        )
    return lines


def _fit_line(fit, n_rows: int) -> list[str]:
    line = describe_fit(fit)
    if line:
        return [line]
    return ["rule check: fewer than two undisturbed points to fit"] if n_rows > 1 else []


def render(result, fmt: str) -> str:
    rows = bench_table(result.rows)
    if fmt == "csv":
        if not rows:
            return ""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()
    lines = [*_device_lines(result.device), "", markdown(rows), "", *_fit_line(result.fit, len(rows))]
    la = result.load_average
    if la.before > 0.5 * (la.cpus or 1):
        lines.append(
            f"warning: the machine was busy before the run (load average {la.before:.1f} on "
            f"{la.cpus} CPUs): timings are unreliable"
        )
    for r in result.rows:
        label = _label(r, result)
        lines += [f"note: {label}: {n}" for n in r.notes]
        if r.fits_in_cache and r.tpot_efficiency > 1:
            lines.append(
                f"note: {label}: a decode step's {r.bytes_per_token / 1e6:.1f} MB fit in the last-level cache "
                f"({result.device.llc_bytes / 1e6:.1f} MB): it may beat "
                "the streaming-read roofline (fits in cache)"
            )
        lines += anchor_lines(r.name, r.depth, r.anchor)
        lines += _attribution_lines(r, label)
        if not r.stats.per_step.measured:
            lines.append(f"note: {label}: no per-step statistics: {r.stats.per_step.reason}")
    for f in result.failed:
        lines.append(f"not benchmarked: {f.name}: {f.error}")
    above = [f"{_label(r, result)} ({_above(r)})" for r in result.rows if r.accounting_error]
    if above:
        lines.append(
            "(!) efficiency above 100% for " + "; ".join(above) + ": the byte/FLOP accounting or the probed "
            "device figures are wrong there"
        )
    return "\n".join(lines)


def _above(r) -> str:
    return ", ".join(w for w, f in (("TPOT", "tpot_above_roofline"), ("TTFT", "ttft_above_roofline")) if f in r.flags)


def _attribution_lines(r, label: str) -> list[str]:
    """The row's attribution in words (its lever), why terms are missing, and a disturbed row's reasons."""
    out = []
    a = r.attribution
    if a is not None:
        out.append(f"where TPOT goes: {label}: {a.lever}")
        if not a.holds:
            out.append(
                f"note: {label}: the attributed terms sum to {a.total_ms:.2f} ms, {a.explained:.0%} of the measured "
                f"{a.measured_ms:.2f} ms: beyond ±10%, a cost no term models or a disturbed measurement"
            )
    out += [f"note: {label}: attribution: {m}" for m in r.attribution_missing]
    if r.disturbed:
        out.append(f"warning: {label}: disturbed ({'; '.join(r.disturbed)}): kept out of the rule check")
    if r.prefill_fit is not None:
        f = r.prefill_fit
        cross = (
            f", attention passes the weights' part at {f.crossover_tokens:,.0f} tokens" if f.crossover_tokens else ""
        )
        kept_out = (
            f"; prompt lengths {', '.join(map(str, f.excluded))} kept out: their prefills were disturbed"
            if f.excluded
            else ""
        )
        out.append(
            f"prefill: {label}: TTFT = {f.fixed_ms:.1f} ms + {f.per_token_ms:.3f} ms x P "
            f"+ {f.per_token2_ms:.2e} ms x P² (R² {f.r2:.3f}){cross}{kept_out}"
        )
    elif len({p.prompt_len for p in r.prompt_sweep}) >= 3:
        from quantkit.bench.rows import sweep_disturbed

        bad = [str(p.prompt_len) for p in r.prompt_sweep if sweep_disturbed(p)]
        out.append(
            f"warning: {label}: no prefill split: the prefills at prompt lengths {', '.join(bad)} were disturbed "
            "(their spread passed 20%), fewer than three lengths are left: run again on quiet cores"
        )
    return out


def _label(r, result) -> str:
    """A row in a note: its name, and its depth and flash-attention setting where rows differ in them."""
    fa = len({x.flash_attn for x in result.rows}) > 1
    kv = len({x.kv_cache for x in result.rows}) > 1
    return (
        r.name
        + (f" at depth {r.depth}" if r.depth is not None else "")
        + (f", flash attention {'on' if r.flash_attn else 'off'}" if fa else "")
        + (f", {r.kv_cache} KV cache" if kv else "")
    )


def _update_cards(sources: list, rows) -> None:
    """Each benchmarked artifact gets its row in its model card; other models have no card to update."""
    from quantkit.artifacts.card import is_artifact, update_card_results
    from quantkit.progress import note

    by_model = {r.model: r.to_json() for r in rows}
    for src in sources:
        label = str(src) if isinstance(src, Path) else src.label
        if not is_artifact(src):
            note(f"--update-card: skipped {label}: not a quantkit artifact (no quantkit.json)")
        elif label in by_model:
            update_card_results(src, {"bench": by_model[label]})
            note(f"--update-card: wrote {src / 'README.md'}")


def _print_probe(p: dict, as_json: bool) -> None:
    if as_json:
        echo_json(p)
        return
    sp = p.get("spread") or {}

    def fig(key, unit):
        x = sp.get(key)
        return f"{p[key]:.3g} {unit}" + (f" (median {x['median']:.3g}, spread {x['spread_pct']:.0f}%)" if x else "")

    seen = facts(p)
    llc = f", last-level cache {seen.llc_bytes / 1e6:.1f} MB" if seen.llc_bytes else ""
    click.echo(
        f"{seen.name} ({seen.device}, {seen.threads} threads): read "
        f"{fig('read_gbps', 'GB/s')}, copy {fig('copy_gbps', 'GB/s')}, "
        f"bf16 matmul {fig('bf16_matmul_tflops', 'TFLOP/s')}{llc}"
    )


def _source(ref: str, engine: str):
    """A model argument -> a checkpoint directory, or a GGUF file where the engine runs them (opened
    now: a file that is not a GGUF, or a truncated one, is one line before anything runs)."""
    from quantkit.errors import QuantkitError
    from quantkit.gguf.read import open_reader
    from quantkit.models.resolve import resolve_model

    found = resolve_model(ref, gguf=True)
    if found.gguf and not engine_class(engine).takes_gguf:
        readers = " | ".join(n for n in ENGINES if engine_class(n).takes_gguf)
        raise QuantkitError(
            f"{ref}: a file; the {engine} engine benches checkpoint directories (GGUF files: --engine {readers})"
        )
    if found.gguf:
        open_reader(found.path)
    return found.path


@click.command("bench")
@click.argument("models", nargs=-1, type=MODEL)
@settings_options(BenchOptions)  # every option of the measurement: recipe/bench_options.py
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    help="Synthetic model: a named shape or config.json (random weights), with --shape-bits.",
)
@click.option(
    "--shape-bits",
    default="16",
    show_default=True,
    help="Bit widths for --shape models, e.g. 16,8,4 (RTN-style random integers).",
)
@click.option("--probe", is_flag=True, help="Measure this device's bandwidth and matmul rate (cached) and print them.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--csv", "as_csv", is_flag=True)
@click.option("--md", "as_md", is_flag=True)
@click.option(
    "--plot",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the rule-check PNG here (and NAME-ttft.png with --sweep, NAME-depth.png with --depth).",
)
@click.option(
    "--out", "out_json", default=None, type=click.Path(dir_okay=False), help="Also save the JSON result here."
)
@click.option(
    "--force", is_flag=True, help="Replace an existing --out or --plot, only a bench result or plot quantkit wrote."
)
@click.option(
    "--update-card", is_flag=True, help="Write TTFT/TPOT into the model card of each quantkit artifact benchmarked."
)
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Print the run's memory and time from the headers, then exit without loading weights.",
)
def bench_cmd(
    models, shapes, shape_bits, probe, as_json, as_csv, as_md, plot, out_json, force, update_card, plan_only, **options
):
    """Measure batch-1 TTFT and TPOT of MODELS beside the roofline and fit TPOT against bytes/token."""
    from quantkit.bench.bench_runner import bench_many
    from quantkit.bench.bench_settings import BenchSettings, check_settings
    from quantkit.bench.synthetic import Synthetic
    from quantkit.core.atomic import sigterm_as_interrupt
    from quantkit.core.outputs import check_files, model_inputs
    from quantkit.errors import QuantkitError

    settings = settings_from_cli(BenchSettings, options)  # the one settings object of this run, passed whole
    check_settings(settings)
    if update_card and (settings.depths or len(settings.flash_attn_runs) > 1 or len(settings.kv_cache_runs) > 1):
        raise QuantkitError(
            "--update-card writes one row per model into its card; --depth, --flash-attn both and several --kv-cache "
            "types give several: bench without them to update the card"
        )
    if not models and not shapes and not probe:
        raise QuantkitError("nothing to bench: give model directories (or 'demo'), --shape NAME, or --probe")
    bits = int_list(shape_bits, "--shape-bits")
    if any(b not in (4, 8, 16) for b in bits):
        raise QuantkitError("--shape-bits: each must be 4, 8 or 16")
    sources = [_source(m, settings.engine) for m in models] + [Synthetic(s, b) for s in shapes for b in bits]
    check_files(_outputs(out_json, plot, settings), inputs=model_inputs(sources), force=force)  # before any work
    if probe:
        from quantkit.bench.probe import run_probe

        p = run_probe(settings.device, settings.threads)
        if not sources:
            _print_probe(p, as_json)
            return
    if plan_only:
        from quantkit.cli._costs import show
        from quantkit.costs.commands import plan_bench

        if any(isinstance(src, Path) and src.is_file() for src in sources):
            raise QuantkitError("--plan reads checkpoint headers; a GGUF file is not planned (bench it directly)")

        return show(plan_bench(sources, settings), as_json)
    with sigterm_as_interrupt():  # `kill` stops a bench as Ctrl-C does: one line, exit 130
        result = bench_many(sources, settings)
    result, failure = _save(result, settings, out_json, plot)
    if update_card:
        _update_cards(sources, result.rows)
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(render(result, "csv" if as_csv else "md"))
    if failure is not None:
        raise failure
    if result.failed:
        raise SystemExit(1)


def _outputs(out_json, plot, settings) -> list:
    """The files bench writes: --out, the --plot PNG and, beside it, the sweep's and the depths' PNGs."""
    from quantkit.core.outputs import Output

    outs = [Output(Path(out_json), "--out", "json", ("bench",))] if out_json else []
    if plot:
        p = Path(plot)
        outs.append(Output(p, "--plot", "png"))
        if settings.prompt_sweep:
            outs.append(Output(p.with_name(p.stem + "-ttft.png"), "--plot (with --sweep)", "png"))
        if settings.depths:
            outs.append(Output(p.with_name(p.stem + "-depth.png"), "--plot (with --depth)", "png"))
    return outs


def _save(result, settings, out_json, plot):
    """The JSON first, so a plot that fails (a full disk, a library fault) never loses the
    measurement; then the plots, and the JSON again naming them. Returns the result and the
    plots' failure (raised once the result is printed), or None."""
    from quantkit.core.atomic import write_json
    from quantkit.core.outputs import OutputError

    if out_json:
        write_json(Path(out_json), result.to_json())
    if not (plot and result.rows):
        return result, None
    try:
        result = _plots(result, settings, Path(plot))
    except Exception as exc:  # noqa: BLE001 (the measurement is kept; the failure is one line after it)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        kept = f"it is in {out_json}" if out_json else "it is printed above"
        error = OutputError(f"--plot {plot}: the plot was not written ({first}); the measurement is kept: {kept}")
        error.exit_code = getattr(exc, "exit_code", 1)
        return result, error
    if out_json:
        write_json(Path(out_json), result.to_json())
    return result, None


def _plots(result, settings, plot: Path):
    """The rule-check PNG at `plot`; beside it TTFT against prompt length with --sweep, TPOT against
    the KV depth with --depth."""
    from dataclasses import replace

    from quantkit.pipeline.plots import rule_check, tpot_depth, ttft_sweep

    rule_check(list(result.rows), result.fit, result.device.bandwidth_gbps, plot)
    result = replace(result, plot=str(plot))
    if settings.prompt_sweep:
        sp = plot.with_name(plot.stem + "-ttft.png")
        ttft_sweep(list(result.rows), sp)
        result = replace(result, ttft_plot=str(sp))
    if settings.depths:
        dp = plot.with_name(plot.stem + "-depth.png")
        tpot_depth(list(result.rows), result.fit, dp)
        result = replace(result, depth_plot=str(dp))
    return result


COMMANDS = [bench_cmd]
