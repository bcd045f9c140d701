"""`quantkit roofline`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("roofline", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def roofline_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit roofline has not landed yet")


COMMANDS = [roofline_cmd]
