"""A worker process in another Python (another virtual environment), driven in JSON lines.

quantkit writes one request per line to the worker's stdin and reads one answer per line from its
stdout: {"ok": true, ...} or {"ok": false, "error": "Type: message"}. The worker's stderr (its
library's log) goes to a file; it is removed when the worker closes cleanly and kept (its path in
the error) when it failed. Arrays too large for a line travel as .npz files in the worker's own
temporary directory (`Worker.tmp`).

While the worker lives, an answer is awaited without a time limit (loading a model on a busy CPU
took minutes); when it dies, the error is its last words: the root-cause line of its log (the
library's own exception), not a broken pipe. The worker dies with quantkit: it asks Linux for a
parent-death signal (vllm_worker.py) and reads end-of-file on stdin when quantkit is gone.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import tempfile
from pathlib import Path

from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.errors import QuantkitError
from quantkit.home import subdir

CLOSE_TIMEOUT_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION = re.compile(r"(?:^|\s)((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")
# Errors that only say that another one happened (the engine core died): the log has the cause.
GENERIC = (
    "Engine core initialization failed",
    "EngineDeadError",
    "See root cause above",
    "EngineCore encountered an issue",
    "the worker exited",
)


class WorkerError(QuantkitError):
    """A worker refused a request or died: one line, in the library's own words."""


def root_cause(text: str) -> str | None:
    """The last exception line of a log ("ValueError: ..."), log prefixes and colours stripped,
    skipping lines that only report that another error happened."""
    for line in reversed(_ANSI.sub("", text).splitlines()):
        m = _EXCEPTION.search(line.strip())
        if m and not any(g in line for g in GENERIC):
            return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"[:400]
    return None


def _one_line(text: str) -> str:
    return " / ".join(part.strip() for part in str(text).splitlines() if part.strip())[:600]


class Worker:
    """One running worker. `call(op, **fields)` sends a request and returns its answer."""

    def __init__(self, proc: subprocess.Popen, log: Path, tmp: Path, what: str):
        self.proc, self.log, self.tmp, self.what = proc, log, tmp, what
        self._buf = b""
        self.failed = False

    @classmethod
    def start(cls, python: Path, script: Path, *, env: dict[str, str], what: str) -> "Worker":
        """Start `python script` with this environment plus `env`, less PYTHONPATH/PYTHONHOME (they
        name quantkit's packages, which must not shadow the other environment's)."""
        tmp = Path(tempfile.mkdtemp(prefix="quantkit-worker-"))
        fd, log_name = tempfile.mkstemp(prefix=f"{what.replace(' ', '-')}-", suffix=".log", dir=subdir("logs"))
        full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        full.update(env, QUANTKIT_PARENT_PID=str(os.getpid()))
        try:
            proc = subprocess.Popen(
                [str(python), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd, env=full, cwd=tmp
            )
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WorkerError(f"{what}: cannot start {python} ({exc.strerror or exc})") from None
        finally:
            os.close(fd)
        return cls(proc, Path(log_name), tmp, what)

    def call(self, op: str, **fields) -> dict:
        line = (json.dumps({"op": op, **fields}) + "\n").encode()
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise self._died() from None
        answer = self._read_line()
        if answer is None:
            raise self._died()
        try:
            msg = json.loads(answer)
        except ValueError:
            self.failed = True
            raise WorkerError(
                f"{self.what}: the worker answered {answer[:120]!r}, not a protocol line (log: {self.log})"
            ) from None
        if not msg.get("ok"):
            self.failed = True
            error = _one_line(msg.get("error") or "no reason given")
            if any(g in error for g in GENERIC):
                error = root_cause(self._log_text()) or error
            raise WorkerError(f"{self.what}: {error}")
        return msg

    def _read_line(self) -> str | None:
        """The next line of stdout; None at end of file or when the worker has exited (a child it
        started may hold the pipe open after it died, so its exit is checked every second)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buf += chunk
            elif self.proc.poll() is not None:
                return None
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace")

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def _died(self) -> QuantkitError:
        self.failed = True
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and signal_name(code):  # killed by a signal: a fault, exit 1
            return EngineCrash(crash_line(f"{self.what}: the worker", code, f"its log: {self.log}"))
        cause = root_cause(self._log_text()) or "no error in its log"
        return WorkerError(f"{self.what}: the worker exited (code {code}): {cause} (log: {self.log})")

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has; remove its files (its log too, unless it failed)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"op": "close"}\n')
                self.proc.stdin.flush()
                self.proc.stdin.close()
                self.proc.wait(timeout=CLOSE_TIMEOUT_S)
            except (BrokenPipeError, ValueError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream and not stream.closed:
                try:  # closing flushes what a dead worker never read: a broken pipe here is expected
                    stream.close()
                except BrokenPipeError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        if not self.failed:
            self.log.unlink(missing_ok=True)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
