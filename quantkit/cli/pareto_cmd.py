"""`quantkit pareto MODEL --calib SPEC --out DIR`: quantkit's points and llama.cpp's K-quants at
several sizes, scored by the same KL harness, as a curve of accuracy per bit."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, debug_enabled, echo_json, json_option
from quantkit.cli._options import settings_from_cli, settings_options
from quantkit.pipeline.pareto_settings import ParetoSettings


@click.command("pareto")
@click.argument("model", type=MODEL)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory of the front.")
@settings_options(ParetoSettings)  # the front's options: pipeline/pareto.py
@click.option(
    "--plan", "plan_only", is_flag=True, help="Print the front's predicted time and memory, then exit (nothing made)."
)
@json_option
def pareto_cmd(model, out, plan_only, as_json, **options):
    """quantkit's points (GGUF --mixed at each anchor's size, compressed-tensors auto at each size) and
    llama.cpp's K-quants with an importance matrix, KL per bit on several domains."""
    from quantkit.core.atomic import sigterm_as_interrupt
    from quantkit.models.resolve import resolve_path
    from quantkit.pipeline.pareto import check_out, run_pareto

    resolve_path(model)  # a name, a path or an artifact, as every command takes it: checked here (one line, exit 2)
    # the model as the user spelled it: the front's title and record name no directory of this machine
    s = settings_from_cli(ParetoSettings, options, model=model, out=out, debug=debug_enabled())
    check_out(s)  # a directory of its own, before the plan or any work
    if plan_only:
        from quantkit.cli._costs import show
        from quantkit.pipeline.pareto_costs import plan_pareto

        return show(plan_pareto(s), as_json)
    with sigterm_as_interrupt():
        result = run_pareto(s)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo((out / "pareto.md").read_text())
    click.echo(f"front: {out / 'pareto.json'}, {out / 'pareto.md'}, {out / 'pareto.png'}")


COMMANDS = [pareto_cmd]
