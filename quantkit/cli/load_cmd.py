"""`quantkit load`: a staircase of rising load against an OpenAI-compatible server."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from quantkit.cli._common import console, echo_json, json_option
from quantkit.load.config import DEFAULT_CONCURRENCY, LoadError


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
@click.option(
    "--concurrency",
    metavar="N,N,...",
    help=f"Closed loop: concurrent requests per step [default: {DEFAULT_CONCURRENCY}].",
)
@click.option(
    "--rate", metavar="R,R,...", help="Open loop: Poisson arrivals per second per step (instead of --concurrency)."
)
@click.option(
    "--prompt-len",
    default="128",
    show_default=True,
    metavar="N|LO:HI[,long=FxK]",
    help="Prompt length in tokens (approximate: common words): fixed N, uniform LO:HI, and "
    "optionally a fraction F of prompts K times longer, e.g. 256,long=0.1x4.",
)
@click.option(
    "--shared-prefix",
    default=0,
    show_default=True,
    metavar="N",
    help="Start every prompt with the same N-token prefix (a system prompt), before its unique part.",
)
@click.option(
    "--turns",
    default=1,
    show_default=True,
    metavar="K",
    help="K-turn conversations (--api chat): each request resends the conversation so far plus a new turn.",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="Send this header with every request (repeatable), e.g. a gateway's 'Authorization: Bearer KEY'; "
    "values are not recorded in the run JSON.",
)
@click.option(
    "--session-header",
    metavar="NAME",
    help="Name each request's conversation in this header (e.g. x-session-id), for routers with "
    "session affinity (vLLM production stack: --routing-logic session --session-key NAME).",
)
@click.option(
    "--context-len",
    type=int,
    metavar="TOKENS",
    help="The server's context length, to check the workload against [default: asked from the server].",
)
@click.option(
    "--gen-len", default=64, show_default=True, help="max_tokens per request (EOS ignored where --engine allows)."
)
@click.option("--step-seconds", default=30.0, show_default=True, help="Seconds of sending per step.")
@click.option("--max-requests", type=int, help="At most this many requests per step.")
@click.option("--slo", metavar="ttft=MS,tpot=MS", help="Latency objectives for goodput, in milliseconds.")
@click.option(
    "--api",
    default="completions",
    show_default=True,
    help="completions (/v1/completions) or chat (/v1/chat/completions).",
)
@click.option(
    "--engine",
    default="openai",
    show_default=True,
    help="Server kind, for fixed-length output: openai, vllm, sglang, llamacpp, transformers.",
)
@click.option(
    "--timeout", "timeout_s", default=60.0, show_default=True, help="Seconds before one request counts as a timeout."
)
@click.option("--patience", default=1, show_default=True, help="Stop after this many saturated steps in a row.")
@click.option("--no-stop", is_flag=True, help="Climb every level even past saturation.")
@click.option("--seed", default=0, show_default=True, help="Seed for prompts and arrival times.")
@click.option(
    "--workload",
    metavar="NAME[:KEY=VALUE,...]",
    help="A built-in workload of real text instead of --prompt-len: agent (multi-turn sessions, --api chat), "
    "long-short (short prompts and a fraction 16x longer; statistics per class), copy (answers that repeat "
    "the prompt).",
)
@click.option(
    "--search",
    is_flag=True,
    help="Find the highest load that meets --slo between the two levels given (--concurrency LO,HI or "
    "--rate LO,HI) by bracketing and bisection, instead of climbing every level.",
)
@click.option(
    "--repeats",
    default=1,
    show_default=True,
    help="Steps per level (with --search: at the two levels around the knee); the knee's and each P99's "
    "95%% interval come from them.",
)
@click.option(
    "--attribution",
    metavar="BENCH.json[#ROW]",
    help="A quantkit bench result of the served model on this device: its attribution.bound names what a "
    "decode step is bound by, when TPOT degrades first.",
)
@click.option(
    "--admission",
    type=int,
    metavar="N",
    help="Admission gate (--rate only): at most N requests in flight; arrivals beyond it are rejected at "
    "once and counted (kind `rejected`).",
)
@click.option(
    "--class-priority",
    metavar="CLASS=N,...",
    help="Send vLLM's request priority per workload class (long-short: short=0,long=1; lower is served "
    "first under --scheduling-policy priority).",
)
@click.option(
    "--rerun-disturbed",
    default=0,
    show_default=True,
    metavar="K",
    help="Measure a step again, up to K times, when other processes used the cores during it.",
)
@click.option(
    "--server-pid",
    type=int,
    metavar="PID",
    help="The server's process, for its cores and CPU [default: the process listening on a loopback URL's port].",
)
@click.option("--label", help="Name of this run in tables, plots and comparisons.")
@click.option("--out", help="Save the run JSON here (input to `quantkit compare`).")
@click.option("--keep-requests", is_flag=True, help="Include every request's timings in the run JSON.")
@click.option("--plot", help="Write a PNG of TTFT-P99 and TPOT-P99 against achieved req/s.")
@click.option(
    "--force", is_flag=True, help="Replace an existing --out or --plot, only a load run or plot quantkit wrote."
)
@json_option
def load_cmd(url, model, concurrency, rate, slo, no_stop, out, keep_requests, plot, force, as_json, **options) -> None:
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

    attribution = options.pop("attribution")
    cfg = build_config(
        attribution=read_attribution(attribution) if attribution else None,
        url=url,
        model=model,
        concurrency=concurrency,
        rate=rate,
        slo=slo,
        stop_at_saturation=not no_stop,
        **options,
    )
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
