"""Writes are transactions: a temp file beside the target, fsync, rename; exclusive locks.

A reader never sees a half-written file, and a crash leaves the old file (or none), never an
empty or truncated one. Locks are advisory `flock`s on a `.NAME.lock` file beside the target;
the kernel releases them when the holder dies, so a killed process never leaves a stale lock.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import QuantkitError


def write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data, **kwargs) -> None:
    kwargs.setdefault("indent", 2)
    write_text(path, json.dumps(data, **kwargs) + "\n")


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def lock_path(target: Path) -> Path:
    target = Path(target)
    return target.parent / f".{target.name}.lock"


@contextmanager
def exclusive(target: Path, what: str | None = None):
    """Hold an exclusive lock on `target` (a file or directory that may not exist yet).

    A second process gets one line and exit code 2 at once instead of waiting or clobbering."""
    import fcntl

    lp = lock_path(target)
    lp.parent.mkdir(parents=True, exist_ok=True)
    fh = open(lp, "a+")
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(lp)
            raise QuantkitError(f"{what or target} is in use by another quantkit process{holder}; wait for it to finish") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


def _holder(lp: Path) -> str:
    try:
        pid = lp.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""
