"""`quantkit compare`: runs side by side (run directories, or load-run JSON files)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from quantkit.cli._common import echo_json
from quantkit.pipeline.run_report import ReportRow, RunReport


def _read(path: str) -> tuple[Path, object]:
    """The JSON file a RUN argument names (a run directory's report.json, or the file) and its data."""
    from quantkit.errors import QuantkitError

    p = Path(path)
    f = p / "report.json" if p.is_dir() else p
    if not f.is_file():
        raise QuantkitError(f"{path}: not a run directory (no report.json) or a JSON result file")
    try:
        return f, json.loads(f.read_bytes())
    except (UnicodeDecodeError, ValueError):
        raise QuantkitError(f"{f}: not valid JSON") from None
    except RecursionError:
        raise QuantkitError(f"{f}: not a result file (JSON nested too deeply to read)") from None


def compare_runs(reports: list[RunReport], labels: list[str]) -> dict:
    # a run on several engines has a row per variant and engine: rows then match by both
    by_engine = any(len({row.engine for row in r.rows}) > 1 for r in reports)

    def key(row: ReportRow) -> str:
        return f"{row.name} ({row.engine})" if by_engine else row.name

    names = list(dict.fromkeys(key(row) for r in reports for row in r.rows))
    table = []
    for n in names:
        entry = {"variant": n}
        for label, r in zip(labels, reports):
            row = next((x for x in r.rows if key(x) == n), None)
            entry[label] = None if row is None else row.figures()
        table.append(entry)
    runs = [
        {"label": lab, "recipe": r.recipe, "date": r.date, "host": r.host, "device": r.device_name, "fit": r.fit}
        for lab, r in zip(labels, reports)
    ]
    return {"kind": "compare", "runs": runs, "variants": table}


def _kl(result: dict, label: str) -> str:
    """The KL column of a run, named by the kind its rows hold: runs of different kinds do not compare."""
    kinds = {(v[label] or {}).get("kl_kind") for v in result["variants"]} - {None}
    return "KL" if not kinds else "KL (" + ", ".join(sorted(k.replace("topk-", "top-") for k in kinds)) + ")"


def render(result: dict, reports: list[RunReport], labels: list[str]) -> str:
    """compare_runs' table as Markdown, under a line per run (`reports`, named by `labels`)."""
    out = []
    for label, r in zip(labels, reports):
        fit = r.fit or {}
        fit_s = (
            f"{fit['effective_gbps']:.2f} GB/s + {fit['overhead_ms']:.2f} ms (R² {fit['r2']:.3f})"
            if fit.get("effective_gbps")
            else "n/a"
        )
        out.append(f"- {label}: {r.recipe} on {r.device_name} ({r.host}, {r.date}); rule fit {fit_s}")
    head = ["variant"] + [f"{lab} {m}" for lab in labels for m in ("TPOT ms", "ΔPPL %", _kl(result, lab))]
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in result["variants"]:
        cells = [v["variant"]]
        for lab in labels:
            row = v[lab] or {}
            for key, fmt in (("tpot_ms", "{:.2f}"), ("delta_ppl_pct", "{:+.2f}"), ("kld_mean", "{:.4f}")):
                cells.append("—" if row.get(key) is None else fmt.format(row[key]))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot_tpot(result: dict, labels: list[str], path: Path) -> None:
    from quantkit.core.outputs import save_png
    from quantkit.pipeline.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    variants = [v["variant"] for v in result["variants"]]
    width = 0.8 / max(1, len(labels))
    for i, lab in enumerate(labels):
        ys = [ReportRow(v["variant"], **(v[lab] or {})).tpot_ms or 0 for v in result["variants"]]
        ax.bar([j + i * width for j in range(len(variants))], ys, width, label=lab)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(variants))], variants, rotation=20, fontsize=8)
    ax.set_ylabel("TPOT (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)


@click.command("compare")
@click.argument("runs", nargs=-1, required=True)
@click.option("--md", "as_md", is_flag=True, help="Markdown table (the default).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--plot", default=None, type=click.Path(dir_okay=False), help="Write a PNG of TPOT per variant here.")
@click.option("--force", is_flag=True, help="Replace an existing --plot, only a plot quantkit wrote.")
def compare_cmd(runs, as_md, as_json, plot, force):
    """Compare run directories (or `quantkit load --out` JSON files) side by side."""
    from quantkit.core.outputs import Output, check_files, resolved
    from quantkit.errors import QuantkitError
    from quantkit.load.compare import compare_load_runs, render_load_comparison
    from quantkit.load.runfile import LoadRun, is_load_run
    from quantkit.pipeline.run_report import KIND, is_run_report, read_report

    inputs = [(resolved(Path(r)), "a run this command compares") for r in runs]
    check_files([Output(Path(plot), "--plot", "png")] if plot else [], inputs=inputs, force=force)
    files = [_read(r) for r in runs]
    data = [d for _, d in files]
    odd = next((f for f, d in files if not is_load_run(d) and not is_run_report(d)), None)
    if odd is not None:
        raise QuantkitError(f"{odd}: not a run report (kind {KIND}) or a load run (quantkit load --out)")
    loads = [is_load_run(d) for d in data]
    if all(loads):
        loaded = [LoadRun.from_json(d, str(f)) for f, d in files]  # checked where read: one line naming the file
        result = compare_load_runs(loaded)
        if plot:
            from quantkit.load.plot import plot_runs

            plot_runs(loaded, Path(plot))
        echo_json(result.to_json()) if as_json else click.echo(render_load_comparison(result))
        return
    if any(loads):
        raise QuantkitError(
            "compare takes run directories (quantkit run) or load-run JSON files (quantkit load --out), not a mix"
        )
    data = [read_report(d, str(f)) for f, d in files]
    labels = [Path(r).name if Path(r).name != "report.json" else Path(r).parent.name for r in runs]
    if len(set(labels)) != len(labels):
        labels = [f"{i + 1}:{lab}" for i, lab in enumerate(labels)]
    result = compare_runs(data, labels)
    if plot:
        plot_tpot(result, labels, Path(plot))
    echo_json(result) if as_json else click.echo(render(result, data, labels))


COMMANDS = [compare_cmd]
