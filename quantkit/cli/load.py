"""`quantkit load`: a staircase of rising load against an OpenAI-compatible server."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..load.config import DEFAULT_CONCURRENCY, LoadError
from ._common import _clean, console, echo_json, json_option


def _write_json(path: str, data: dict) -> None:
    try:
        Path(path).write_text(json.dumps(_clean(data), indent=2) + "\n")
    except OSError as exc:
        raise LoadError(f"--out: cannot write {path}: {exc.strerror or exc}") from None


def _emit(run: dict, *, as_json: bool, out: str | None, plot: str | None) -> None:
    from ..load.plot import plot_runs
    from ..load.report import render_table, summary_lines

    if out:
        _write_json(out, run)
    if plot:
        plot_runs([run], plot)
    if as_json:
        echo_json(run)
        return
    screen = console(stderr=False)
    if not screen.is_terminal:
        screen.width = 170  # piped or captured: keep the table on one line per step
    screen.print(render_table(run))
    for line in summary_lines(run):
        screen.print(line, highlight=False)
    for path, what in ((out, "run JSON"), (plot, "plot")):
        if path:
            screen.print(f"{what}: {path}", highlight=False)


@click.command("load")
@click.argument("url")
@click.option("--model", required=True, help="Model name the server expects in requests.")
@click.option("--concurrency", metavar="N,N,...",
              help=f"Closed loop: concurrent requests per step [default: {DEFAULT_CONCURRENCY}].")
@click.option("--rate", metavar="R,R,...",
              help="Open loop: Poisson arrivals per second per step (instead of --concurrency).")
@click.option("--prompt-len", default=128, show_default=True,
              help="Prompt length in tokens (approximate: common words).")
@click.option("--gen-len", default=64, show_default=True,
              help="max_tokens per request (EOS ignored where --engine allows).")
@click.option("--step-seconds", default=30.0, show_default=True, help="Seconds of sending per step.")
@click.option("--max-requests", type=int, help="At most this many requests per step.")
@click.option("--slo", metavar="ttft=MS,tpot=MS", help="Latency objectives for goodput, in milliseconds.")
@click.option("--api", default="completions", show_default=True,
              help="completions (/v1/completions) or chat (/v1/chat/completions).")
@click.option("--engine", default="openai", show_default=True,
              help="Server kind, for fixed-length output: openai, vllm, sglang, llamacpp, transformers.")
@click.option("--timeout", "timeout_s", default=60.0, show_default=True,
              help="Seconds before one request counts as a timeout.")
@click.option("--patience", default=1, show_default=True, help="Stop after this many saturated steps in a row.")
@click.option("--no-stop", is_flag=True, help="Climb every level even past saturation.")
@click.option("--seed", default=0, show_default=True, help="Seed for prompts and arrival times.")
@click.option("--label", help="Name of this run in tables, plots and comparisons.")
@click.option("--out", type=click.Path(dir_okay=False),
              help="Save the run JSON here (input to `quantkit compare`).")
@click.option("--keep-requests", is_flag=True, help="Include every request's timings in the run JSON.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a PNG of TTFT-P99 and TPOT-P99 against achieved req/s.")
@json_option
def load_cmd(url, model, concurrency, rate, slo, no_stop, out, keep_requests, plot, as_json, **options) -> None:
    """Raise load step by step against an OpenAI-compatible server at URL; find the knee.

    Per step: achieved req/s and output tokens/s; TTFT, TPOT, ITL and end-to-end latency at
    P50/P90/P99; errors and timeouts; goodput under --slo. Stops when throughput flattens while
    TTFT-P99 keeps rising, marks the knee, and says whether TTFT (queueing) or TPOT (bandwidth)
    degraded first. Ctrl-C keeps what was measured so far.
    """
    from ..load.config import build_config
    from ..load.report import build_run
    from ..load.runner import Progress, run

    cfg = build_config(
        url=url, model=model, concurrency=concurrency, rate=rate, slo=slo,
        stop_at_saturation=not no_stop, **options,
    )
    progress, interrupted = Progress(), False
    try:
        run(cfg, progress, log=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        interrupted = True
    result = build_run(cfg, progress, keep_requests=keep_requests)
    _emit(result, as_json=as_json, out=out, plot=plot)
    if interrupted:
        raise KeyboardInterrupt  # the cli group prints "interrupted" and exits 130


COMMANDS = [load_cmd]
