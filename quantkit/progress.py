"""Progress on stderr: a rich bar on a terminal; elsewhere (a log file, CI) one plain line when a
step starts, then at most one a minute while it runs, and one when it ends, as pip and
huggingface_hub print to a log. QUANTKIT_NO_PROGRESS silences both."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

LOG_EVERY_S = 60.0  # a plain progress line at most this often


def _enabled() -> bool:
    return not os.environ.get("QUANTKIT_NO_PROGRESS") and not os.environ.get("QUANTKIT_QUIET")


@contextmanager
def bar(description: str, total: int | None = None):
    """Yield `update(completed, description=None)`; a no-op when progress display is off."""
    if not _enabled():
        yield lambda completed=None, description=None: None
        return
    if not sys.stderr.isatty():
        with _lines(description, total) as update:
            yield update
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


@contextmanager
def _lines(description: str, total: int | None):
    """The bar as plain lines: start, at most one per LOG_EVERY_S, end (with the time it took)."""
    start = last = time.monotonic()
    state = {"done": 0, "what": description}

    def count() -> str:
        return f" {state['done']}/{total}" if total else ""

    print(f"{description}: started{' (' + str(total) + ' steps)' if total else ''}", file=sys.stderr, flush=True)

    def update(completed=None, description=None):
        nonlocal last
        if completed is not None:
            state["done"] = completed
        if description is not None:
            state["what"] = description
        now = time.monotonic()
        if now - last >= LOG_EVERY_S:
            last = now
            print(f"{state['what']}:{count()} ({now - start:.0f} s)", file=sys.stderr, flush=True)

    yield update
    print(f"{description}: done{count()} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def note(message: str) -> None:
    """A one-line status message on stderr (kept out of --json stdout)."""
    if not os.environ.get("QUANTKIT_QUIET"):
        print(message, file=sys.stderr, flush=True)
