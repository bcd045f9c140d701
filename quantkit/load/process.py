"""Start a server on loopback, wait until it is ready, and always stop it (its whole process group).

The server runs in its own session (process group), so stopping it reaches anything it spawned;
on Linux it also gets SIGTERM if quantkit itself dies (prctl PR_SET_PDEATHSIG), so even a
`kill -9` of quantkit does not leave a server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .servers import StudyError

STOP_GRACE_S = 15.0  # SIGTERM, then SIGKILL after this long
LOG_TAIL_LINES = 3
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# No proxies from the environment: the server is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: a new session, and SIGTERM when the parent dies (Linux)."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux / no glibc: the group kill on the normal path remains
        pass


@dataclass
class Server:
    command: list[str]
    url: str
    log: Path
    proc: subprocess.Popen
    ready_s: float | None = None  # seconds from start until it answered

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines the server wrote, joined into one line."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)[-600:]


def start(command: list[str], url: str, log: Path, env: dict[str, str]) -> Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as sink:
        try:
            proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **env}, preexec_fn=_die_with_parent)
        except OSError as exc:
            raise StudyError(f"cannot start the server ({command[0]}: {exc.strerror or exc})") from None
    return Server(command, url, log, proc)


def wait_ready(server: Server, path: str, timeout_s: float) -> float:
    """Seconds until GET `path` answered 200; a StudyError with the server's last lines otherwise."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        code = server.proc.poll()
        if code is not None:
            raise StudyError(f"the server exited with code {code} before it was ready: {server.tail() or '(no output)'}")
        try:
            with _OPENER.open(server.url + path, timeout=2.0) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise StudyError(f"the server was not ready within {timeout_s:g} s (GET {path}): {server.tail() or '(no output)'}")


def stop(server: Server) -> int | None:
    """SIGTERM to the server's process group, SIGKILL after STOP_GRACE_S; returns its exit code."""
    proc = server.proc
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


@contextlib.contextmanager
def running(command: list[str], url: str, log: Path, env: dict[str, str], ready: str, timeout_s: float):
    """A started, ready server for the `with` block; stopped on the way out, whatever happens."""
    server = start(command, url, log, env)
    try:
        server.ready_s = wait_ready(server, ready, timeout_s)
        yield server
    finally:
        stop(server)
