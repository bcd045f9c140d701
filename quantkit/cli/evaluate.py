"""`quantkit eval`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("eval", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def evaluate_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit eval has not landed yet")


COMMANDS = [evaluate_cmd]
