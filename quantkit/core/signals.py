"""Processes that die of a signal (an engine, a tool, a worker, a server): which signal, what it
usually means, and what to do, in one line; such a death is a fault (exit 1), never a result."""

from __future__ import annotations

import signal

from quantkit.errors import QuantkitError


class EngineCrash(QuantkitError):
    """An engine or tool process killed by a signal: a fault of the program or the machine (exit 1)."""

    exit_code = 1


def signal_name(returncode: int) -> str | None:
    """`SIGILL` for a process that died of signal 4 (returncode -4, or 128 + 4 from a shell); None otherwise."""
    num = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
    if num is None:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


# signal -> (what it usually means, what to do)
SIGNAL_ADVICE = {
    "SIGILL": ("an instruction this CPU does not execute", "rebuild it for this machine"),
    "SIGKILL": (
        "killed from outside, often by the kernel's out-of-memory killer",
        "free memory or use a smaller model",
    ),
    "SIGBUS": ("a memory fault, often a model file changed or truncated while mapped", "check the model file"),
    "SIGSEGV": ("a memory fault inside the program", "check the model file; if it recurs, report it"),
    "SIGABRT": ("the program aborted on an internal check", "check the model file; if it recurs, report it"),
}


def crash_line(what: str, returncode: int, todo: str | None = None) -> str:
    """One line for a process that died of a signal: which signal, what it usually means, what to do."""
    sig = signal_name(returncode) or f"exit {returncode}"
    why, advice = SIGNAL_ADVICE.get(sig, ("a fault inside the program", "if it recurs, report it"))
    return f"{what} died of {sig} ({why}); nothing was recorded; {todo or advice}"
