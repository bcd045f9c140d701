"""`quantkit load`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("load", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def load_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit load has not landed yet")


COMMANDS = [load_cmd]
