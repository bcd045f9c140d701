"""`quantkit run`: the main job, from a checkpoint to a side-by-side report."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, debug_enabled, echo_json, json_option, set_option
from quantkit.cli.recipe_cmd import include_option


@click.command("run")
@click.argument("recipe_file", metavar="RECIPE")
@click.option("--model", default=None, type=MODEL, help="Source checkpoint (default: the recipe's model).")
@click.option(
    "--out", default=None, type=click.Path(file_okay=False), help="Run directory (default: runs/RECIPE_NAME)."
)
@click.option("--calib", default=None, help="Calibration text SPEC (overrides the recipe).")
@click.option(
    "--eval-text",
    multiple=True,
    help="Evaluation text SPEC, repeatable: one report row per variant per text (overrides the recipe's eval.texts).",
)
@click.option("--skip-eval", is_flag=True)
@click.option("--skip-bench", is_flag=True)
@click.option("--rerun", is_flag=True, help="Redo every step instead of reusing finished ones.")
@set_option
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Print every step's memory, disk and time from the headers, then exit without loading weights.",
)
@include_option
@json_option
def run_cmd(
    recipe_file, model, out, calib, eval_text, skip_eval, skip_bench, rerun, plan_only, overrides, include_dirs, as_json
):
    """Convert, verify, evaluate and benchmark every variant of RECIPE, then write a report."""
    from quantkit.artifacts.staging import recipe_inputs
    from quantkit.core.atomic import sigterm_as_interrupt
    from quantkit.pipeline.run import Runner, RunOptions
    from quantkit.recipe.files import load_recipe

    recipe = load_recipe(recipe_file, overrides, include_dirs)
    opts = RunOptions(
        model=model,
        out=Path(out) if out else None,
        calib=calib,
        eval_text=tuple(eval_text),
        skip_eval=skip_eval,
        skip_bench=skip_bench,
        rerun=rerun,
        debug=debug_enabled(),
        inputs=tuple(recipe_inputs(recipe_file)),
    )
    if plan_only:
        from quantkit.cli._costs import show
        from quantkit.pipeline.run_costs import plan_run

        return show(plan_run(recipe, opts), as_json)
    runner = Runner(recipe, opts)
    with sigterm_as_interrupt():  # `kill` unwinds like Ctrl-C: a conversion's staging dir is removed
        report = runner.run()
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo((runner.dir / "report.md").read_text())
        click.echo(f"report: {runner.dir / 'report.md'}")
    if report.failed:
        raise SystemExit(1)


COMMANDS = [run_cmd]
