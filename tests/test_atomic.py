"""quantkit.core.atomic: write-then-rename, locks that die with their holder, the user's umask, a full disk."""

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from quantkit.core import atomic
from quantkit.errors import QuantkitError


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    tmp_path = tmp_path / "w"  # apart from the test's quantkit home beside it
    tmp_path.mkdir()
    f = tmp_path / "steps.json"
    atomic.write_json(f, {"a": 1})

    def boom(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic.write_json(f, {"a": 2})
    assert json.loads(f.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["steps.json"]


def test_disk_full_is_one_clear_error(tmp_path, monkeypatch):
    tmp_path = tmp_path / "w"  # apart from the test's quantkit home beside it
    tmp_path.mkdir()
    f = tmp_path / "report.json"
    atomic.write_json(f, {"old": True})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(atomic.DiskFullError, match="no space left") as e:
        atomic.write_json(f, {"old": False})
    assert isinstance(e.value, QuantkitError) and str(f) in str(e.value)
    monkeypatch.undo()
    assert json.loads(f.read_text()) == {"old": True} and [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.parametrize(
    "exc,full",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (
            Exception("Error while serializing: I/O error: No space left on device (os error 28)"),
            True,
        ),  # safetensors' Rust writer
        (RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos"), False),
        (OSError(errno.EACCES, "Permission denied"), False),
    ],
)
def test_is_disk_full(exc, full):
    assert atomic.is_disk_full(exc) is full
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = exc
    assert atomic.is_disk_full(wrapped) is full


@pytest.mark.parametrize("umask,mode,dmode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)])
def test_written_files_follow_the_umask(tmp_path, umask, mode, dmode):
    old = os.umask(umask)
    try:
        atomic.write_text(tmp_path / "a.txt", "x")
        d = tmp_path / "tree"
        (d / "sub").mkdir(parents=True, mode=0o700)
        (d / "sub" / "f").write_text("y")
        os.chmod(d / "sub" / "f", 0o600)
        atomic.apply_umask(d)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == mode
    assert stat.S_IMODE((d / "sub" / "f").stat().st_mode) == mode
    assert stat.S_IMODE((d / "sub").stat().st_mode) == dmode and stat.S_IMODE(d.stat().st_mode) == dmode


def test_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    target = tmp_path / "art"
    with atomic.exclusive(target):
        with pytest.raises(QuantkitError, match=f"in use by another quantkit process \\(pid {os.getpid()}\\)"):
            with atomic.exclusive(target):
                pass
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from quantkit.core import atomic\n"
            f"with atomic.exclusive({str(target)!r}):\n print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(QuantkitError, match=f"pid {holder.pid}"):
            with atomic.exclusive(target):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with atomic.exclusive(target):  # the kernel released the dead holder's lock: no stale lock
        pass


def test_lock_file_removed_and_a_just_unlinked_one_never_trusted(tmp_path, monkeypatch):
    """The flock-and-unlink protocol: the holder removes its lock file; a process that locked a file
    the previous holder unlinked in between (an orphan) must start over on the new file."""
    import builtins

    target = tmp_path / "art"
    lp = atomic.lock_path(target)
    lp.write_text("")
    real_open, opened = builtins.open, []

    def open_then_unlinked(path, *a, **k):
        fh = real_open(path, *a, **k)
        if str(path) == str(lp) and not opened:
            os.unlink(path)  # the previous holder finishes right after this process opened its file
        opened.append(path)
        return fh

    monkeypatch.setattr(builtins, "open", open_then_unlinked)
    with atomic.exclusive(target):
        assert len(opened) == 2 and lp.read_text() == str(os.getpid())  # locked the new file, not the orphan
        monkeypatch.setattr(builtins, "open", real_open)
        with pytest.raises(QuantkitError, match="in use"):
            with atomic.exclusive(target):
                pass
    assert not lp.exists()


def test_unwritable_lock_dir_is_one_line(tmp_path, monkeypatch):
    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(QuantkitError, match="cannot create the lock file"):
        with atomic.exclusive(tmp_path / "x"):
            pass


def test_sigterm_unwinds_like_ctrl_c():
    with pytest.raises(KeyboardInterrupt):
        with atomic.sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode
            pytest.fail("SIGTERM did not interrupt")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_signals_deferred_until_the_block_ends():
    seen = []
    with atomic.sigterm_as_interrupt():
        try:
            with atomic.signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                seen.append("renames done")
        except KeyboardInterrupt:
            seen.append("interrupted after")
    assert seen == ["renames done", "interrupted after"]


def test_signals_deferred_while_other_threads_run():
    """A process-directed signal goes to any thread not blocking it (torch's workers): the
    deferral must hold process-wide, not only for the main thread's signal mask."""
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    seen = []
    try:
        with atomic.sigterm_as_interrupt():
            try:
                with atomic.signals_deferred():
                    os.kill(os.getpid(), signal.SIGTERM)
                    deadline = time.monotonic() + 0.3  # time for the worker to take the signal
                    while time.monotonic() < deadline:  # bytecodes at which a pending handler would run
                        pass
                    seen.append("renames done")
            except KeyboardInterrupt:
                seen.append("interrupted after")
    finally:
        stop.set()
        worker.join()
    assert seen == ["renames done", "interrupted after"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_json_safe_writes_no_number_json_cannot_hold(value):
    data = {"a": value, 2: [value, (1.5, value)], "ok": "x"}
    text = json.dumps(atomic.json_safe(data), allow_nan=False)  # raises on NaN/inf left anywhere
    assert json.loads(text) == {"a": None, "2": [None, [1.5, None]], "ok": "x"}


def strict_loads(text: str):
    """json.loads as a strict parser reads: NaN, Infinity and -Infinity are not JSON."""

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _write_json(tmp_path, data, capsys):
    atomic.write_json(tmp_path / "a.json", data, default=str)
    return (tmp_path / "a.json").read_text()


def _echo_json(tmp_path, data, capsys):
    from quantkit.cli._common import echo_json

    echo_json(data)
    return capsys.readouterr().out


def _gguf_record(tmp_path, data, capsys):
    from quantkit.gguf.write import staged_file

    with staged_file(tmp_path / "x.gguf", tmp_path / "x.quantkit.json") as stage:
        stage.path.write_bytes(b"GGUF")
        stage.record = data
    return (tmp_path / "x.quantkit.json").read_text()


@pytest.mark.parametrize("writer", [_write_json, _echo_json, _gguf_record], ids=["files", "stdout", "gguf-record"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_every_json_quantkit_writes_is_strict(tmp_path, capsys, writer, value):
    """A non-finite number is null wherever it sits (a verification's mean_kl was written `NaN`,
    which strict parsers refuse), also in what `default` turns an object into."""
    import numpy as np

    class Odd:
        def __str__(self):
            return "odd"

    data = {"verification": {"mean_kl": value, "max_kl": [value, 1.5]}, "n": np.nan}
    if writer is not _echo_json:  # the file writers take default=str (quantkit.json holds paths)
        data.update(path=tmp_path, x=Odd())
    parsed = strict_loads(writer(tmp_path, data, capsys))
    assert parsed["verification"] == {"mean_kl": None, "max_kl": [None, 1.5]} and parsed["n"] is None


def test_strict_json_refuses_what_it_cannot_write():
    with pytest.raises(TypeError):
        atomic.strict_json({"x": object()})
    assert strict_loads(atomic.strict_json({"x": object()}, default=lambda o: float("nan"))) == {"x": None}
