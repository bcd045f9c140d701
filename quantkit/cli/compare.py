"""`quantkit compare`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("compare", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def compare_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit compare has not landed yet")


COMMANDS = [compare_cmd]
