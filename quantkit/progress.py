"""Progress bars on stderr (rich); silent when stderr is not a terminal or QUANTKIT_NO_PROGRESS is set."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def _enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("QUANTKIT_NO_PROGRESS")


@contextmanager
def bar(description: str, total: int | None = None):
    """Yield `update(completed, description=None)`; a no-op when progress display is off."""
    if not _enabled():
        yield lambda completed=None, description=None: None
        return

    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)

        def update(completed=None, description=None):
            kw = {}
            if completed is not None:
                kw["completed"] = completed
            if description is not None:
                kw["description"] = description
            progress.update(task, **kw)

        yield update


def note(message: str) -> None:
    """A one-line status message on stderr (kept out of --json stdout)."""
    if not os.environ.get("QUANTKIT_QUIET"):
        print(message, file=sys.stderr, flush=True)
