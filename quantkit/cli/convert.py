"""`quantkit convert`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("convert", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def convert_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit convert has not landed yet")


COMMANDS = [convert_cmd]
