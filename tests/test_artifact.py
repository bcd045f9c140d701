"""--out safety for `quantkit convert`: --out is never an input, an exclusive
lock, what dead processes left is cleaned, SIGTERM cleans up, the --force swap is recoverable,
and artifacts carry the user's umask."""

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import RECIPES

REPO = Path(__file__).resolve().parents[1]
RECIPE = RECIPES / "int4-w4a16-rtn.yaml"
PY = REPO / ".venv" / "bin" / "python"
PY = str(PY if PY.exists() else sys.executable)

# Runs the CLI with convert paused just after the artifact is written into its staging dir: the
# test knows a live conversion is mid-way (it writes QK_TEST_MARK) and lets it go (QK_TEST_GO).
PAUSED = r"""
import os, sys, time
from pathlib import Path
import quantkit.quantize.convert as qc
real = qc.write_card
def paused(tmp, meta):
    real(tmp, meta)
    Path(os.environ["QK_TEST_MARK"]).write_text(str(tmp))
    go = Path(os.environ["QK_TEST_GO"])
    for _ in range(1800):
        if go.exists():
            break
        time.sleep(0.1)
qc.write_card = paused
from quantkit.cli import main
sys.argv = ["quantkit", *sys.argv[1:]]
main()
"""


def convert(cli, model, out, *extra, recipe=RECIPE):
    return cli("convert", str(recipe), "--model", str(model), "--out", str(out), *extra)


def digest(path: Path) -> str:
    """Every file's name and bytes under path (or the file itself)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def no_load(monkeypatch):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before refusing --out"))


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def leftovers(out: Path) -> list[str]:
    return sorted(
        p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.") and not p.name.endswith(".lock")
    )


@pytest.fixture
def src(tiny_llama, tmp_path) -> Path:
    dst = tmp_path / "models" / "src"
    shutil.copytree(tiny_llama, dst)
    return dst


@pytest.fixture
def text(tiny_text, tmp_path) -> Path:
    dst = tmp_path / "data" / "calib.txt"
    dst.parent.mkdir()
    shutil.copy(tiny_text, dst)
    return dst


def _hub_snapshot(tmp_path, src):
    """A hub-cache layout: snapshot files are symlinks into blobs/."""
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in src.iterdir():
        shutil.copy(f, blobs / f.name)
        (snap / f.name).symlink_to(blobs / f.name)
    return snap, blobs


OUTS = {  # --out -> (what the test protects, the model to convert)
    "the source": lambda t, s, x: (s, s, s),
    "a parent of the source": lambda t, s, x: (s.parent, s, s),
    "a symlink to the source": lambda t, s, x: ((t / "link").symlink_to(s) or t / "link", s, s),
    "the calibration text": lambda t, s, x: (x, x, s),
    "a parent of the calibration text": lambda t, s, x: (x.parent, x, s),
    "the blobs of a hub snapshot": lambda t, s, x: (lambda snap, blobs: (blobs, blobs, snap))(*_hub_snapshot(t, s)),
    "the quantkit cache": lambda t, s, x: (Path(os.environ["QUANTKIT_HOME"]),) * 2 + (s,),
}


@pytest.mark.parametrize("kind", list(OUTS))
def test_force_never_deletes_an_input(cli, src, text, tmp_path, monkeypatch, kind):
    Path(os.environ["QUANTKIT_HOME"]).mkdir(parents=True, exist_ok=True)
    out, protected, model = OUTS[kind](tmp_path, src, text)
    before = digest(protected)
    no_load(monkeypatch)
    code, _, err, _ = convert(cli, model, out, "--calib", f"file:{text}", "--force")
    if out.is_file():  # click's own check (--out is a directory option): a usage error, exit 2
        assert code == 2 and "is a file" in err, err
    else:
        assert code == 2 and one_line(err) and "choose another directory" in err, err
    assert digest(protected) == before


def test_recipe_files_are_inputs(cli, src, tmp_path, monkeypatch):
    """The recipe's directory and the folder of a recipe file a suite includes."""
    suite_dir = tmp_path / "suite"
    (suite_dir / "inc").mkdir(parents=True)
    shutil.copy(RECIPE, suite_dir / "inc" / "rtn.yaml")
    suite = suite_dir / "suite.yaml"
    suite.write_text("variants:\n  - name: a\n    recipe: inc/rtn.yaml\n")
    no_load(monkeypatch)
    for out in (suite_dir, suite_dir / "inc"):  # (a file as --out is a click usage error)
        before = digest(suite_dir)
        code, _, err, _ = convert(cli, src, out, "--variant", "a", "--force", recipe=suite)
        assert code == 2 and one_line(err) and "recipe" in err, (out, err)
        assert digest(suite_dir) == before


@pytest.mark.parametrize("where", ["cwd", "parent-of-cwd", "home", "root"])
def test_force_never_replaces_cwd_home_or_root(cli, src, tmp_path, monkeypatch, where):
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    (work / "mine.txt").write_text("keep")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work))
    out = {"cwd": ".", "parent-of-cwd": "..", "home": str(work), "root": "/"}[where]
    no_load(monkeypatch)
    code, _, err, _ = convert(cli, src, out, "--force")
    assert code == 2 and one_line(err) and ("choose another directory" in err or "root directory" in err), err
    assert (work / "mine.txt").read_text() == "keep"


def test_force_replaces_only_an_artifact(cli, src, tmp_path, monkeypatch):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err, _ = convert(cli, src, out, "--force")
    assert (
        code == 2 and one_line(err) and "not a quantkit artifact" in err and (out / "notes.txt").read_text() == "mine"
    )
    f = tmp_path / "file"
    f.write_text("mine")
    code, _, err, _ = convert(cli, src, f, "--force")
    assert code == 2 and "is a file" in err and f.read_text() == "mine"  # click's check of a directory option
    from quantkit.artifacts.staging import check_out
    from quantkit.errors import QuantkitError

    with pytest.raises(QuantkitError, match="not a directory"):  # the library's own, for callers other than the CLI
        check_out(f, force=True)
    (out / "notes.txt").unlink()  # an empty directory may be filled
    code, _, err, _ = convert(cli, src, out, "--force")
    assert code == 0, err
    first = json.loads((out / "quantkit.json").read_text())
    code, _, err, _ = convert(cli, src, out, "--force")  # an artifact may be replaced
    assert code == 0, err
    assert json.loads((out / "quantkit.json").read_text())["files"] == first["files"]  # RTN is deterministic


def test_locked_out_is_refused_and_live_staging_untouched(cli, src, tmp_path, monkeypatch):
    from quantkit.core.atomic import exclusive

    out = tmp_path / "art"
    live = tmp_path / ".art.partial-abcd1234"  # the staging dir of the process holding the lock
    live.mkdir()
    (live / "model.safetensors").write_text("being written")
    no_load(monkeypatch)
    with exclusive(out):
        code, _, err, _ = convert(cli, src, out, "--force")
    assert code == 2 and one_line(err) and "in use by another quantkit process" in err and f"pid {os.getpid()}" in err
    assert (live / "model.safetensors").read_text() == "being written" and not out.exists()
    assert not (tmp_path / ".art.lock").exists()  # the holder removes its lock file when done


def _fake_artifact(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    (path / "quantkit.json").write_text(json.dumps({"kind": "quantkit-artifact", "tag": tag}))
    (path / "model.safetensors").write_bytes(b"x" * 1000)
    return path


def test_dead_process_leftovers_are_cleaned(cli, src, tmp_path):
    out = _fake_artifact(tmp_path / "art", "old")
    dead = [tmp_path / ".art.partial-abcd1234", tmp_path / ".art.offload-efgh5678", tmp_path / ".art.old-4242"]
    for d in dead:
        d.mkdir()
        (d / "blob").write_bytes(b"0" * 4096)
    others = [
        tmp_path / ".art.partial-x.partial-abcd1234",
        tmp_path / ".artx.partial-abcd1234",
        tmp_path / "art.partial-abcd1234",
    ]
    for d in others:  # another --out's staging, or not quantkit's at all
        d.mkdir()
    code, _, err, _ = convert(cli, src, out, "--force")
    assert code == 0, err
    assert not any(d.exists() for d in dead) and all(d.is_dir() for d in others)
    assert "left by an interrupted quantkit process" in err
    assert json.loads((out / "quantkit.json").read_text())["kind"] == "quantkit-artifact" and "files" in json.loads(
        (out / "quantkit.json").read_text()
    )


def test_interrupted_force_swap_is_restored(cli, src, tmp_path):
    """Killed after moving the old artifact aside and before moving the new one in."""
    first = tmp_path / "first"
    code, _, err, _ = convert(cli, src, first)
    assert code == 0, err
    before = digest(first)
    out = tmp_path / "art"
    first.rename(tmp_path / ".art.old-4242")
    (tmp_path / ".art.partial-abcd1234").mkdir()  # the new artifact, never moved in
    code, _, err, _ = convert(cli, src, out)  # no --force: the restored artifact is kept
    assert code == 2 and "already exists" in err and "restored" in err
    assert digest(out) == before and leftovers(out) == []


def test_failed_swap_keeps_the_old_artifact(cli, src, tmp_path, monkeypatch):
    out = tmp_path / "art"
    code, _, err, _ = convert(cli, src, out)
    assert code == 0, err
    before = digest(out)
    real = os.rename

    def rename(a, b, *rest, **kw):
        if ".partial-" in str(a) and Path(b) == out:
            raise OSError(5, "Input/output error")
        return real(a, b, *rest, **kw)

    monkeypatch.setattr(os, "rename", rename)
    code, _, err, _ = convert(cli, src, out, "--force")
    assert code != 0 and "Traceback" not in err and [ln for ln in err.splitlines() if ln.startswith("error:")], err
    monkeypatch.setattr(os, "rename", real)
    assert digest(out) == before and leftovers(out) == []


@pytest.mark.parametrize("umask,dmode,fmode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)])
def test_artifact_modes_follow_the_umask(cli, src, tmp_path, umask, dmode, fmode):
    out = tmp_path / "art"
    old = os.umask(umask)
    try:
        code, _, err, _ = convert(cli, src, out)
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(out.stat().st_mode) == dmode
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in out.rglob("*")}
    assert set(modes.values()) == {oct(fmode)}, modes


def test_manifest_matches_the_files(cli, src, tmp_path):
    from quantkit.core.integrity import sha256_file

    out = tmp_path / "art"
    code, _, err, data = convert(cli, src, out, "--json")
    assert code == 0, err
    files = json.loads((out / "quantkit.json").read_text())["files"]
    on_disk = {p.name for p in out.iterdir() if p.name != "quantkit.json"}
    assert set(files) == on_disk and "model.safetensors" in files and "README.md" in files
    for name, rec in files.items():
        assert rec == {"sha256": sha256_file(out / name), "bytes": (out / name).stat().st_size}
    assert data["files"] == files


def _start_paused(args, tmp_path, tag):
    mark, go = tmp_path / f"{tag}.mark", tmp_path / f"{tag}.go"
    env = {**os.environ, "QK_TEST_MARK": str(mark), "QK_TEST_GO": str(go), "QUANTKIT_NO_PROGRESS": "1"}
    proc = subprocess.Popen(
        [PY, "-c", PAUSED, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 180
    while not mark.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the paused convert did not reach its staging dir: {proc.communicate()[1][-2000:]}")
        time.sleep(0.1)
    return proc, Path(mark.read_text()), go


def test_two_converts_racing_for_one_out(src, tmp_path):
    out = tmp_path / "art"
    args = ["convert", str(RECIPE), "--model", str(src), "--out", str(out)]
    first, staging, go = _start_paused(args, tmp_path, "a")
    try:
        second = subprocess.run([PY, "-m", "quantkit", *args, "--force"], capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [ln for ln in second.stderr.splitlines() if ln.startswith("error:")]
        assert (
            len(errors) == 1 and "in use by another quantkit process" in errors[0] and f"pid {first.pid}" in errors[0]
        )
        assert "Traceback" not in second.stderr and staging.is_dir() and not out.exists()
    finally:
        go.touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert (out / "quantkit.json").is_file() and leftovers(out) == []


def test_sigterm_mid_convert_cleans_up(cli, src, tmp_path):
    """kill -TERM during a --force replacement: the staging dir goes, the old artifact stays."""
    out = tmp_path / "art"
    code, _, err, _ = convert(cli, src, out)
    assert code == 0, err
    before = digest(out)
    proc, staging, _ = _start_paused(
        ["convert", str(RECIPE), "--model", str(src), "--out", str(out), "--force"], tmp_path, "t"
    )
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "interrupted" in err and "Traceback" not in err
    assert not staging.exists() and leftovers(out) == [] and digest(out) == before
