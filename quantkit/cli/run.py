"""`quantkit run`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def run_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit run has not landed yet")


COMMANDS = [run_cmd]
