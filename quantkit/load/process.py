"""Start a server on loopback, wait until it is ready, and always stop it with everything it started.

On Linux the server runs under `supervisor.py` (same Python): a child subreaper that gets SIGTERM
when quantkit dies, even by SIGKILL, and then stops every descendant of the server, those that
called setsid() or double-forked included. Elsewhere the server runs in its own session and is
stopped by a process-group kill, which misses descendants that left the group and does not
happen at all if quantkit is killed with SIGKILL.

The parent-death signal follows the thread that started the supervisor: start servers from a
thread that lives as long as they should (quantkit uses its main thread).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.load.servers import StudyError

STOP_GRACE_S = 15.0  # SIGTERM, then SIGKILL after this long
SUPERVISOR_MARGIN_S = 10.0  # on top of the grace: the supervisor's own SIGKILL round and reaping
LOG_TAIL_LINES = 3
SUPERVISOR = Path(__file__).with_name("supervisor.py")
# No proxies from the environment: the server is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def supervised() -> bool:
    """Whether servers start under the supervisor (it needs Linux's prctl and /proc)."""
    return sys.platform.startswith("linux")


def _launch(command: list[str], supervise: bool) -> list[str]:
    if not supervise:
        return command
    # -I -S: the study's environment (PYTHONPATH, ...) and the working directory do not reach it
    return [
        sys.executable,
        "-I",
        "-S",
        str(SUPERVISOR),
        "--parent",
        str(os.getpid()),
        "--grace",
        f"{STOP_GRACE_S:g}",
        "--",
        *command,
    ]


@dataclass
class Server:
    command: list[str]
    url: str
    log: Path
    proc: subprocess.Popen  # the supervisor where supervised, else the server itself
    supervised: bool = False
    ready_s: float | None = None  # seconds from start until it answered

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines the server wrote, joined into one line."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)[-600:]


def _pinned(cores: tuple[int, ...] | None):
    """The child's cores, set before it runs anything (inherited by the server and all it starts)."""
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def start(command: list[str], url: str, log: Path, env: dict[str, str], cores: tuple[int, ...] | None = None) -> Server:
    full_env = {**os.environ, **env}
    if shutil.which(command[0], path=full_env.get("PATH")) is None:  # refused here, not in the log
        raise StudyError(f"cannot start the server ({command[0]}: not found or not executable)")
    supervise = supervised()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as sink:
        try:
            proc = subprocess.Popen(
                _launch(command, supervise),
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
                preexec_fn=_pinned(cores),  # started from the main thread, before any event loop
            )
        except OSError as exc:
            raise StudyError(f"cannot start the server ({command[0]}: {exc.strerror or exc})") from None
    return Server(command, url, log, proc, supervise)


def wait_ready(server: Server, path: str, timeout_s: float) -> float:
    """Seconds until GET `path` answered 200; a StudyError with the server's last lines otherwise."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        code = server.proc.poll()
        if code is not None and signal_name(code):
            raise EngineCrash(crash_line("the server", code, f"its last lines: {server.tail() or '(no output)'}"))
        if code is not None:
            raise StudyError(
                f"the server exited with code {code} before it was ready: {server.tail() or '(no output)'}"
            )
        try:
            with _OPENER.open(server.url + path, timeout=2.0) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise StudyError(f"the server was not ready within {timeout_s:g} s (GET {path}): {server.tail() or '(no output)'}")


def stop(server: Server) -> int | None:
    """SIGTERM, SIGKILL after STOP_GRACE_S; returns the exit code (the server's, through the supervisor).

    Supervised, only the supervisor is signalled: it stops the whole tree itself. If it has not
    exited after its grace and a margin, or unsupervised after the grace, the process group gets
    SIGKILL."""
    proc = server.proc
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if server.supervised:
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_GRACE_S + (SUPERVISOR_MARGIN_S if server.supervised else 0.0))
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        return proc.poll()


@contextlib.contextmanager
def running(
    command: list[str],
    url: str,
    log: Path,
    env: dict[str, str],
    ready: str,
    timeout_s: float,
    cores: tuple[int, ...] | None = None,
):
    """A started, ready server for the `with` block (on `cores` when given); stopped on the way out,
    whatever happens."""
    server = start(command, url, log, env, cores)
    try:
        server.ready_s = wait_ready(server, ready, timeout_s)
        yield server
    finally:
        stop(server)
