"""Run one server so that nothing it starts outlives it, nor outlives quantkit (Linux).

    python -I -S supervisor.py --parent PID --grace SECONDS -- COMMAND...

A process-group kill misses a server's children that call setsid() or double-fork, and a
parent-death signal reaches only the direct child, not what a wrapper (`sh -c "server & wait"`)
started. So quantkit starts this small program, which starts the server and:

- is a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant whose parent exits is reparented
  to it rather than to init, so setsid'd and double-forked processes stay in its tree;
- gets SIGTERM when quantkit dies, SIGKILL included (PR_SET_PDEATHSIG), and checks getppid()
  after arming it: a parent that died before then would never send it;
- on SIGTERM, SIGINT or SIGHUP, on its parent's death, or when the server exits, sends SIGTERM
  to every descendant, SIGKILL to those left after the grace period, reaps them all, and exits
  with the server's exit code (128 + N when a signal N ended it).

Stdlib only and run by path with -I -S: it imports nothing from quantkit or the working
directory, and the server's environment (PYTHONPATH, ...) does not change the supervisor.
What it cannot do: outlive a SIGKILL sent to itself (its descendants are then reparented to an
outer subreaper or init; quantkit then kills the supervisor's process group as a last resort).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
STOPS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
WATCHED = STOPS | {signal.SIGCHLD}
NOT_STARTED = 127  # as a shell reports a command it could not run
POLL_S = 1.0  # how often the parent is checked besides the death signal


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process, from /proc/PID/stat (no kernel option needed,
    unlike /proc/PID/task/TID/children)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        except OSError:  # exited meanwhile
            continue
        table[int(name)] = (int(fields[1]), fields[0])
    return table


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes below `root`."""
    children: dict[int, list[int]] = {}
    states = {}
    for pid, (ppid, state) in _processes().items():
        children.setdefault(ppid, []).append(pid)
        states[pid] = state
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return [pid for pid in found if states[pid] != "Z"]


class Supervisor:
    def __init__(self, parent: int, grace_s: float):
        self.parent, self.grace_s = parent, grace_s
        self.server: int | None = None
        self.code: int | None = None  # the server's exit code, once reaped

    def arm(self) -> bool:
        """Dispositions reset and stop signals blocked (sigtimedwait takes them), then subreaper
        and parent-death signal. False when the parent is already gone."""
        for sig in WATCHED:  # an inherited SIG_IGN would drop the parent-death signal
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        return os.getppid() == self.parent

    def spawn(self, command: list[str]) -> None:
        # the server gets an empty signal mask and default dispositions (Python ignores SIGPIPE and
        # SIGXFSZ), as if started directly
        self.server = os.posix_spawnp(
            command[0], command, os.environ, setsigmask=(), setsigdef=tuple(WATCHED | {signal.SIGPIPE, signal.SIGXFSZ})
        )

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.server:
                code = os.waitstatus_to_exitcode(status)
                self.code = code if code >= 0 else 128 - code

    def watch(self) -> None:
        """Until a stop signal, the parent's death, or the server's exit."""
        while True:
            info = signal.sigtimedwait(WATCHED, POLL_S)
            self.reap()
            if self.code is not None or (info and info.si_signo in STOPS) or os.getppid() != self.parent:
                return

    def stop_all(self) -> None:
        """SIGTERM to every descendant (also those that appear meanwhile), SIGKILL after the grace
        period, until none is left."""
        deadline = time.monotonic() + self.grace_s
        warned: set[int] = set()
        while True:
            self.reap()
            alive = descendants(os.getpid())
            if not alive:
                return
            late = time.monotonic() >= deadline
            for pid in alive:
                if late or pid not in warned:
                    try:
                        os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                    warned.add(pid)
            signal.sigtimedwait({signal.SIGCHLD}, 0.05 if late else 0.2)


def _args(argv: list[str]) -> tuple[int, float, list[str]]:
    """--parent PID --grace SECONDS -- COMMAND..."""
    split = argv.index("--")
    opts, command = argv[:split], argv[split + 1 :]
    values = dict(zip(opts[::2], opts[1::2]))
    if not command or set(values) != {"--parent", "--grace"}:
        raise ValueError("usage: supervisor.py --parent PID --grace SECONDS -- COMMAND...")
    return int(values["--parent"]), float(values["--grace"]), command


def main(argv: list[str]) -> int:
    try:
        parent, grace_s, command = _args(argv)
    except ValueError as exc:
        print(f"quantkit supervisor: {exc}", file=sys.stderr)
        return 2
    supervisor = Supervisor(parent, grace_s)
    try:
        if not supervisor.arm():
            return NOT_STARTED  # quantkit died first: start nothing
    except (OSError, AttributeError) as exc:  # no prctl (not Linux, a sandbox that forbids it): fail closed
        print(f"quantkit supervisor: cannot watch the server: {exc}", file=sys.stderr, flush=True)
        return NOT_STARTED
    try:
        supervisor.spawn(command)
    except OSError as exc:
        print(f"quantkit supervisor: cannot start {command[0]}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return NOT_STARTED
    try:
        supervisor.watch()
    finally:
        supervisor.stop_all()
    return supervisor.code if supervisor.code is not None else 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
