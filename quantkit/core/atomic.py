"""Writes are transactions: a temp file beside the target, fsync, rename; exclusive locks.

A reader never sees a half-written file, and a crash leaves the old file (or none), never an
empty or truncated one. Locks are advisory `flock`s on a `.NAME.lock` file beside the target;
the kernel releases them when the holder dies, so a killed process never leaves a stale lock
(only, after `kill -9`, an unlocked `.NAME.lock` file, which the next holder reuses and removes).
Files and directories get the modes the user's umask asks for (a server running as another
user must be able to read what quantkit writes when the umask allows it).

A directory is replaced by `swap_in`: the new one is built beside it (`.NAME.partial-*`), then
old aside (`.NAME.old-PID`), new in, old removed. What a killed process leaves beside NAME is
recognised by its name and cleaned up by the next holder of NAME's lock (`recover_leftovers`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.progress import note

# errno values that mean "the device is full" (ENOSPC) or "the user's quota is" (EDQUOT).
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# Libraries that write through their own I/O (safetensors' Rust writer, torch's zip writer)
# report a full disk as a message, not an OSError.
_FULL_TEXT = ("no space left on device", "os error 28", "disk quota exceeded", "storagefull")


class DiskFullError(QuantkitError):
    """The filesystem ran out of space (or quota) while quantkit was writing."""


def is_disk_full(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        if any(t in str(exc).lower() for t in _FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise DiskFullError(f"{path}: no space left on the device; the file was not changed") from None
        raise
    fsync_dir(path.parent)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data, **kwargs) -> None:
    """`data` as strict JSON (strict_json), written atomically; indented by 2 unless told otherwise."""
    kwargs.setdefault("indent", 2)
    write_text(path, strict_json(data, **kwargs) + "\n")


def strict_json(data, *, default=None, **kwargs) -> str:
    """The one way quantkit turns data into JSON (files, --json on stdout, GGUF header strings):
    strict JSON that every parser reads. json.dumps alone writes `NaN` and `Infinity`, which are
    not JSON; here a non-finite number is null, also one that `default` (e.g. str for a Path)
    turns into data, and anything left over is refused (allow_nan=False) rather than written."""

    def convert(obj):
        return json_safe(default(obj)) if default is not None else _unserializable(obj)

    return json.dumps(json_safe(data), default=convert, allow_nan=False, **kwargs)


def _unserializable(obj):
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def json_safe(obj):
    """`obj` as strict JSON holds it: NaN and infinities become null (json.dumps would write
    `NaN`, which other parsers refuse), keys become strings, tuples lists."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


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


def file_mode() -> int:
    return 0o666 & ~_umask()


def dir_mode() -> int:
    return 0o777 & ~_umask()


def apply_umask(root: Path) -> None:
    """Give a tree the modes a plain `mkdir`/`open` would have: `tempfile.mkdtemp` makes 0700
    directories, and some writers (safetensors) create 0600 files whatever the umask."""
    root = Path(root)
    fmode, dmode = file_mode(), dir_mode()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, fmode)
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, dmode)
    os.chmod(root, dmode)


def lock_path(target: Path) -> Path:
    target = Path(os.path.abspath(target))
    return target.parent / f".{target.name}.lock"


@contextmanager
def exclusive(target: Path, what: str | None = None):
    """Hold an exclusive lock on `target` (a file or directory that may not exist yet).

    A second process gets one line and exit code 2 at once instead of waiting or clobbering.
    The holder removes the lock file when it is done. That is safe because a process that got
    the lock then checks that the path still names the file it locked (the usual flock-and-unlink
    protocol): one that locked a file just unlinked by the previous holder starts over."""
    lp = lock_path(target)
    fh = _acquire(lp, what or str(target))
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        try:
            lp.unlink()  # still holding the lock: nobody else can be between their lock and their check
        except OSError:
            pass
        fh.close()


def _acquire(lp: Path, what: str):
    while True:
        try:
            lp.parent.mkdir(parents=True, exist_ok=True)
            fh = open(lp, "a+")
        except OSError as exc:
            raise QuantkitError(f"cannot create the lock file {lp}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise QuantkitError(
                f"{what} is in use by another quantkit process{_holder(lp)}; wait for it to finish"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fh.fileno()), os.stat(lp))
        except FileNotFoundError:
            same = False
        if same:
            return fh
        fh.close()  # the previous holder removed this file after we opened it: lock the new one


def _holder(lp: Path) -> str:
    try:
        pid = lp.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


@contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM until the block is done (a rename pair that must not be split).
    A signal that arrives meanwhile is delivered when the block ends.

    Handlers, not the signal mask: `pthread_sigmask` blocks a signal for the calling thread
    only, and `kill PID` is delivered to any thread that does not block it (torch's and
    OpenMP's worker threads), whose C handler then has the main thread run Python's handler
    at once. A recording handler holds the signal process-wide."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    watched = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in watched}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if pending:
            handler = old[pending[0]]
            if callable(handler):
                handler(pending[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(pending[0])


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def sigterm_as_interrupt():
    """`kill PID` (SIGTERM) unwinds like Ctrl-C, so every `finally`/`except BaseException`
    cleanup runs (staging dirs removed, nothing left at --out) instead of the process vanishing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def swap_in(new: Path, out: Path) -> None:
    """Old aside, new in, old removed. A kill between the renames leaves `.NAME.old-PID`, which
    the next command on `out` restores; the signals this process handles are held meanwhile."""
    old = None
    with signals_deferred():
        if os.path.lexists(out):
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        try:
            os.rename(new, out)
        except BaseException:
            if old is not None:
                os.rename(old, out)
            remove(new)
            raise
        fsync_dir(out.parent)
    if old is not None:
        remove(old)


def _leftover_re(out: Path) -> re.Pattern:
    # tempfile names: 8 characters of [a-z0-9_]; an exact pattern, so `.a.partial-x.partial-…`
    # (the staging of a *different* --out, "a.partial-x") is never taken for one of "a"'s.
    return re.compile(rf"\.{re.escape(out.name)}\.(?:(partial|offload)-[a-z0-9_]{{8}}|old-(\d+))")


def leftovers(out: Path) -> list[Path]:
    out = Path(out)
    if not out.parent.is_dir():
        return []
    pat = _leftover_re(out)
    return sorted(p for p in out.parent.iterdir() if pat.fullmatch(p.name))


def recover_leftovers(out: Path) -> None:
    """Only call with the lock held: then whoever wrote these is dead."""
    found = leftovers(out)
    olds = [p for p in found if ".old-" in p.name]
    if olds and not os.path.lexists(out):
        # killed between moving the old artifact aside and moving the new one in: put it back
        keep = max(olds, key=lambda p: p.lstat().st_ctime)
        os.rename(keep, out)
        found.remove(keep)
        note(f"{out}: restored the artifact that an interrupted --force replacement had moved aside ({keep.name})")
    for p in found:
        remove(p)
        note(f"removed {p}, left by an interrupted quantkit process")


def remove(p: Path) -> None:
    """Remove a file, a symlink (never what it points at) or a directory tree."""
    p = Path(p)
    if p.is_symlink() or p.is_file():
        p.unlink(missing_ok=True)
    elif p.exists():
        shutil.rmtree(p, ignore_errors=True)
