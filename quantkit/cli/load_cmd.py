"""`quantkit load`: a staircase of rising load against an OpenAI-compatible server."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from quantkit.cli._common import console, echo_json, json_option
from quantkit.cli._options import settings_from_cli, settings_options
from quantkit.load.config import LoadError
from quantkit.load.load_options import LoadOptions


def _write_json(path: str, data: dict) -> None:
    from quantkit.core.atomic import json_safe, write_json

    try:
        write_json(Path(path), json_safe(data))  # temp file beside it, fsync, rename: never half-written
    except OSError as exc:
        raise LoadError(f"--out: cannot write {path}: {exc.strerror or exc}") from None


def check_writable(out: str | None, plot: str | None, force: bool) -> None:
    """--out and --plot by the one rule of every output (core/outputs.py), before the run, not after it."""
    from quantkit.core.outputs import Output, check_files

    outs = [Output(Path(out), "--out", "json", ("load-run",))] if out else []
    check_files(outs + ([Output(Path(plot), "--plot", "png")] if plot else []), force=force)


def _emit(run, *, as_json: bool, out: str | None, plot: str | None) -> None:
    from quantkit.load.plot import plot_runs
    from quantkit.load.terminal import render_table, summary_lines

    if out:
        _write_json(out, run.to_json())
    if plot and run.steps:
        plot_runs([run], plot)
    if as_json:
        echo_json(run.to_json())
        return
    screen = console(stderr=False)
    if not screen.is_terminal:
        screen.width = 200  # piped or captured: keep the table on one line per step
    screen.print(render_table(run))
    for line in summary_lines(run):
        screen.print(line, highlight=False)
    for path, what in ((out, "run JSON"), (plot, "plot")):
        if path:
            screen.print(f"{what}: {path}", highlight=False)


@click.command("load")
@click.argument("url")
@click.option("--model", required=True, help="Model name the server expects in requests.")
@settings_options(LoadOptions)  # the run's options: load/load_options.py
@click.option("--out", help="Save the run JSON here (input to `quantkit compare`).")
@click.option("--keep-requests", is_flag=True, help="Include every request's timings in the run JSON.")
@click.option("--plot", help="Write a PNG of TTFT-P99 and TPOT-P99 against achieved req/s.")
@click.option(
    "--force", is_flag=True, help="Replace an existing --out or --plot, only a load run or plot quantkit wrote."
)
@json_option
def load_cmd(url, model, out, keep_requests, plot, force, as_json, **options) -> None:
    """Raise load step by step against an OpenAI-compatible server at URL; find the knee.

    Per step: achieved req/s and output tokens/s; TTFT, TPOT, ITL and end-to-end latency at
    P50/P90/P99; TTFT split into queue, prefill and the rest where the server reports them;
    errors and timeouts; goodput under --slo; the client's and the server's CPU. Stops when
    throughput flattens while TTFT-P99 keeps rising (or, with --search, finds the highest load that
    meets --slo), gives the knee with a 95% interval, and says which latency degraded first and
    why. Ctrl-C keeps what was measured so far.
    """
    from quantkit.load.bench_bound import read_attribution
    from quantkit.load.config import build_config

    o = settings_from_cli(LoadOptions, options)
    attribution = read_attribution(o.attribution) if o.attribution else None
    cfg = build_config(o, url=url, model=model, attribution=attribution)
    check_writable(out, plot, force)
    execute(cfg, as_json=as_json, out=out, plot=plot, keep_requests=keep_requests)


def execute(cfg, *, as_json: bool, out: str | None, plot: str | None, keep_requests: bool):
    """Run the staircase and report it. Once the warm-up passed, what was measured is always
    written: after every step (so a kill -9 loses at most one step), and on Ctrl-C, SIGTERM or a
    fault, before the error is raised."""
    from quantkit.load.load_run import build_run
    from quantkit.load.load_steps import Progress, Terminated, run

    progress, failure = Progress(), None

    def checkpoint(progress: Progress) -> None:
        _write_json(out, build_run(cfg, progress, keep_requests=keep_requests).to_json())

    try:
        run(cfg, progress, log=lambda line: click.echo(line, err=True), checkpoint=checkpoint if out else None)
    except (KeyboardInterrupt, Terminated) as exc:
        failure = exc
    except Exception as exc:
        if not progress.started:
            raise
        failure = exc
    result = build_run(cfg, progress, keep_requests=keep_requests)
    _emit(result, as_json=as_json, out=out, plot=plot)
    if isinstance(failure, Terminated):
        click.echo("terminated", err=True)
        sys.exit(143)  # 128 + SIGTERM, as a shell reports a process ended by it
    if failure is not None:
        raise failure  # Ctrl-C: "interrupted", exit 130; a fault: one line, exit 1
    return result


COMMANDS = [load_cmd]
