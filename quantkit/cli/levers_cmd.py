"""`quantkit levers STUDY.yaml`: the same staircase against one engine, one lever changed per run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from quantkit.cli._common import echo_json, json_option


def _engines_text() -> str:
    from quantkit.load.servers import SERVERS

    lines = []
    for kind in SERVERS.values():
        lines.append(
            f"{kind.name}: {shlex.join(kind.command) or '(your command: server.command, run with --trust-study)'}"
        )
        if kind.program:
            lines.append(f"  {_installed(kind.name)}")
        for name, key in kind.keys.items():
            how = f"body {key.body}" if key.body else f"{key.flag} ({key.style})"
            lines.append(f"  {name:28s} {how:42s} {key.help}{'' if key.here else '  [not run on this machine]'}")
    return "\n".join(lines)


def _installed(name: str) -> str:
    """Where a built engine binary is and which build, or how to build it (quantkit.gguf.tools)."""
    from quantkit.gguf import tools

    try:
        path = tools.locate(name)
        return f"installed: {path} (version {tools.version(name)})"
    except tools.ToolError as exc:
        return f"not installed: {str(exc).split('; ', 1)[-1]}" if tools.find(name) is None else f"does not run: {exc}"


def _plan(study, check: bool = False) -> list[dict]:
    from quantkit.load.levers import lever_plan

    return [lever_plan(study, i, check=check) for i in range(len(study.levers))]


def _print_plan(study, plans: list, reasons: list[str], as_json: bool) -> None:
    """Everything a run would start: per lever, what it adds to the environment and the command."""
    if as_json:
        levers = [plan.to_json() for plan in plans]
        echo_json({"kind": "lever-plan", "name": study.name, "needs_trust": reasons, "levers": levers})
        return
    for plan in plans:
        env = [f"{name}={value}" for name, value in plan.env.items()]
        cores = f"  on cores {plan.server_cpus}" if plan.server_cpus else ""
        click.echo(
            f"{plan.lever}: {shlex.join(['env', *env, *plan.command] if env else plan.command)}"
            + (f"  body {plan.body_fields}" if plan.body_fields else "")
            + cores
        )
    if study.client_cpus:
        click.echo(f"the client on cores {study.client_cpus}")
    if reasons:
        click.echo(f"runs only with --trust-study: {'; '.join(reasons)}")


def _finish(result, out: Path) -> None:
    """levers.md and levers.png beside study.json, from whatever levers ran."""
    from quantkit.core.atomic import write_text
    from quantkit.load.compare import render_load_comparison
    from quantkit.load.levers_report import render_table
    from quantkit.load.plot import plot_runs

    if not result.runs:
        return
    text = f"# Lever study: {result.name}\n\n" + render_table(result)
    if result.comparison:
        text += "\n" + render_load_comparison(result.comparison)
    write_text(out / "levers.md", text)
    plot_runs(result.runs, out / "levers.png")


@click.command("levers")
@click.argument("study_file", required=False)
@click.option("--out", type=click.Path(file_okay=False), help="Directory for the runs [default: levers-NAME].")
@click.option("--force", is_flag=True, help="Replace the results of an earlier study in --out.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate the study and print each lever's exact command and environment; start nothing.",
)
@click.option(
    "--trust-study",
    is_flag=True,
    help="Run a study that runs its own command (custom engine) or sets the server's environment "
    "beyond thread counts and quiet/offline switches. Off by default: read it with --dry-run first.",
)
@click.option("--engines", is_flag=True, help="List the engines and the levers each one has.")
@json_option
def levers_cmd(study_file, out, force, dry_run, trust_study, engines, as_json) -> None:
    """Run a lever study: per lever, start the server on loopback, run the staircase, stop it.

    Writes one load-run JSON per lever (the exact server command inside), the lever table
    (knee req/s, TTFT-P99 and TPOT-P99 at the knee, goodput under the SLO, which latency degraded
    first) as study.json and levers.md, and the comparison plot levers.png. Servers started here
    are always stopped, with everything they started, also on Ctrl-C and SIGTERM (and on Linux
    when quantkit itself is killed).
    """
    from quantkit.core.atomic import exclusive
    from quantkit.load.levers import run_study
    from quantkit.load.load_steps import Terminated
    from quantkit.load.servers import StudyError
    from quantkit.load.study import check_trusted, read_study, untrusted

    if engines:
        click.echo(_engines_text())
        return
    if not study_file:
        raise StudyError(
            "give a study file or a built-in study's name (quantkit recipe list "
            "--studies), or --engines to list the engines"
        )
    from quantkit.resources import find_study

    study_file = find_study(study_file)
    study = read_study(study_file)
    if dry_run:
        _print_plan(study, _plan(study), untrusted(study), as_json)
        return
    check_trusted(study, str(study_file), trust_study)  # before anything is created or started
    _plan(study, check=True)  # every lever's model and installed engine, before --out is made or a server starts
    out_dir = Path(out or f"levers-{study.name}")
    if (out_dir / "study.json").exists() and not force:
        raise StudyError(f"--out: {out_dir} holds an earlier study (study.json); use --force to replace it")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(f"--out: cannot create {out_dir}: {exc.strerror or exc}") from None
    result, failure = None, None
    with exclusive(out_dir, f"the study directory {out_dir}"):
        holder: dict = {}
        try:
            result = run_study(
                study,
                out_dir,
                source=str(study_file),
                trusted=trust_study,
                log=lambda line: click.echo(line, err=True),
                sink=holder,
            )
        except (KeyboardInterrupt, Terminated, Exception) as exc:  # write what ran, then re-raise
            failure, result = exc, holder.get("result")
        if result:
            _finish(result, out_dir)
    if isinstance(failure, Terminated):
        click.echo("terminated", err=True)
        sys.exit(143)
    if failure is not None:
        raise failure
    if as_json:
        echo_json(result.to_json())
        return
    from quantkit.load.levers_report import render_table

    click.echo(render_table(result))  # markdown, one row per line (not wrapped to the terminal)
    click.echo(f"runs, server logs, study.json, levers.md, levers.png: {out_dir}")


COMMANDS = [levers_cmd]
