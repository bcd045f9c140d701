"""How every command's `--plan` is printed: the plan's text (or --json), then exit 2 with one line
when it cannot fit."""

from __future__ import annotations

import click

from quantkit.cli._common import echo_json
from quantkit.costs.commands import render
from quantkit.costs.formulas import Plan
from quantkit.errors import QuantkitError


def show(plan: Plan, as_json: bool) -> None:
    """Print the plan; one that cannot fit then exits 2 with one line naming what would make it fit."""
    if as_json:
        echo_json(plan.to_dict())
    else:
        click.echo(render(plan))
    if not plan.fits:
        raise QuantkitError(f"the plan does not fit: {'; '.join(plan.problems)}; to fit: {' or '.join(plan.advice)}")
