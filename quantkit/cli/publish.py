"""`quantkit publish`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("publish", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def publish_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit publish has not landed yet")


COMMANDS = [publish_cmd]
