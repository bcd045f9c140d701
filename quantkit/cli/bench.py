"""`quantkit bench`."""

from __future__ import annotations

import click

from ..errors import NotImplementedYet  # noqa: F401


@click.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def bench_cmd() -> None:
    """(not implemented yet)"""
    raise NotImplementedYet("quantkit bench has not landed yet")


COMMANDS = [bench_cmd]
