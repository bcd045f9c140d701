"""quantkit export against hostile use: where --out may write, what --force may replace (the GGUF
and its NAME.quantkit.json record), the artifact's sha256 manifest, and `kill` mid-export.

The artifact here is converted from a private copy of the fixture whose weights are a symlink into
a blob folder, as in a Hugging Face cache, so "a file the source links to" is a case too."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures import RECIPES
from gguf_helpers import flip_tensor_bytes, tree_digest, without_quantkit_keys

REPO = Path(__file__).resolve().parents[1]
PY = REPO / ".venv" / "bin" / "python"
PY = str(PY if PY.exists() else sys.executable)


@pytest.fixture(scope="module")
def made(tiny_dir, tmp_path_factory) -> dict[str, Path]:
    """src (hub-like: model.safetensors links into blobs/), its RTN g32 artifact, and an export of it."""
    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("export-safety")
    src, blobs = root / "src", root / "blobs"
    shutil.copytree(tiny_dir / "llama-gqa", src)
    blobs.mkdir()
    (src / "model.safetensors").rename(blobs / "0123abcd")
    (src / "model.safetensors").symlink_to(Path("..") / "blobs" / "0123abcd")
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}
    res = CliRunner().invoke(
        group,
        [
            "convert",
            str(RECIPES / "int4-w4a16-rtn.yaml"),
            "--model",
            str(src),
            "--out",
            str(root / "art"),
            "--set",
            "steps[0].quantize.group_size=32",
        ],
        catch_exceptions=False,
        env=env,
    )
    assert res.exit_code == 0, res.stderr
    assert Path(json.loads((root / "art" / "quantkit.json").read_text())["source"]["path"]).resolve() == src.resolve()
    res = CliRunner().invoke(
        group,
        ["export", str(root / "art"), "--format", "gguf", "--out", str(root / "ours" / "a.gguf")],
        catch_exceptions=False,
        env=env,
    )
    assert res.exit_code == 0, res.stderr
    return {"root": root, "src": src, "blobs": blobs, "art": root / "art", "ours": root / "ours" / "a.gguf"}


def export(cli, artifact: Path, out: Path, *extra: str):
    return cli("export", str(artifact), "--format", "gguf", "--out", str(out), *extra)


def one_line(code: int, err: str) -> bool:
    return code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error:") and "Traceback" not in err


# ---------------------------------------------------------------- where --out may write


def forbidden_targets(made: dict, tmp: Path) -> dict[str, tuple[Path, str, bool]]:
    """name -> (--out, what the refusal names, --force): inputs in every guise, existing or not."""
    src, art = made["src"], made["art"]
    (tmp / "src-link").symlink_to(src)  # a folder link into the source
    (tmp / "weights.gguf").symlink_to(src / "model.safetensors")  # a file link into the source
    (tmp / "notes.txt").write_text("my notes\n")
    without_quantkit_keys(made["ours"], tmp / "llama-cpp.gguf")
    return {
        "a source weight file": (src / "model.safetensors", "the checkpoint the artifact was converted from", True),
        "the source's config.json": (src / "config.json", "the checkpoint the artifact was converted from", True),
        "a new shard name in the source": (src / "model-00002-of-00002.safetensors", "converted from", False),
        "a new file in a new folder of the source": (src / "gguf" / "x.gguf", "converted from", False),
        "the blob a source file links to": (made["blobs"] / "0123abcd", "links to", True),
        "a symlink to a source file": (tmp / "weights.gguf", "converted from", True),
        "a path through a folder link to the source": (tmp / "src-link" / "new.gguf", "converted from", False),
        "a new file inside the artifact": (art / "inside.gguf", "inside the artifact being exported", False),
        "a file of the artifact": (art / "config.json", "inside the artifact being exported", True),
        "the artifact's quantkit.json": (art / "quantkit.json", "inside the artifact being exported", True),
        "an arbitrary non-GGUF file": (tmp / "notes.txt", "not a GGUF that quantkit export wrote", True),
        "a GGUF another tool wrote": (tmp / "llama-cpp.gguf", "not a GGUF that quantkit export wrote", True),
    }


def test_out_never_lands_in_an_input_nor_replaces_a_foreign_file(cli, made, tmp_path):
    from quantkit.core.integrity import check

    work = tmp_path / "work"
    work.mkdir()
    watched = (made["src"], made["blobs"], made["art"], work)
    before = [tree_digest(d) for d in watched]
    for what, (out, needle, force) in forbidden_targets(made, work).items():
        snapshot = [tree_digest(d) for d in watched]
        code, _, err, _ = export(cli, made["art"], out, *(["--force"] if force else []))
        assert one_line(code, err) and needle in err, f"{what}: {code} {err}"
        assert [tree_digest(d) for d in watched] == snapshot, f"{what}: something was written"
    assert [tree_digest(d) for d in watched[:3]] == before[:3]
    check(made["art"], json.loads((made["art"] / "quantkit.json").read_text()))  # still publishable: no extra file


def test_force_replaces_a_gguf_export_wrote(cli, made, tmp_path):
    out = tmp_path / "a.gguf"
    shutil.copy(made["ours"], out)  # a quantkit GGUF moved away from its record: its header says who wrote it
    code, _, err, _ = export(cli, made["art"], out)
    assert one_line(code, err) and "--force" in err
    code, _, err, _ = export(cli, made["art"], out, "--force", "--json")
    assert code == 0, err
    assert json.loads((tmp_path / "a.quantkit.json").read_text())["kind"] == "quantkit-gguf-export"


def test_a_foreign_gguf_beside_a_stale_record_is_not_replaced(cli, made, tmp_path):
    """The user replaced quantkit's GGUF with another tool's file and left the old record: --force refuses."""
    out = tmp_path / "a.gguf"
    shutil.copy(made["ours"].with_name("a.quantkit.json"), tmp_path / "a.quantkit.json")
    without_quantkit_keys(made["ours"], out)
    out.write_bytes(out.read_bytes() + b"\0")  # not the bytes the record names
    before = out.read_bytes()
    code, _, err, _ = export(cli, made["art"], out, "--force")
    assert one_line(code, err) and "not a GGUF that quantkit export wrote" in err and out.read_bytes() == before


# ---------------------------------------------------------------- the record beside --out


@pytest.mark.parametrize("kind", ["user JSON", "not JSON", "JSON of another quantkit kind"])
def test_an_existing_record_needs_force_and_force_replaces_only_quantkits(cli, made, tmp_path, kind):
    rec = tmp_path / "x.quantkit.json"
    rec.write_text(
        {
            "user JSON": '{"mine": 1}',
            "not JSON": "my notes\n",
            "JSON of another quantkit kind": '{"kind": "quantkit-artifact", "files": {}}',
        }[kind]
    )
    mine = rec.read_bytes()
    for extra, needle in (
        ((), "x.quantkit.json already exists; pass --force"),
        (("--force",), "not an export record that quantkit export wrote"),
    ):
        code, _, err, _ = export(cli, made["art"], tmp_path / "x.gguf", *extra)
        assert one_line(code, err) and needle in err, err
        assert rec.read_bytes() == mine and not list(tmp_path.glob("*x.gguf*"))


def test_a_record_quantkit_wrote_is_replaced_with_force_only(cli, made, tmp_path):
    out = tmp_path / "x.gguf"
    assert export(cli, made["art"], out)[0] == 0
    out.unlink()  # the GGUF is gone, its record stays
    record = (tmp_path / "x.quantkit.json").read_bytes()
    code, _, err, _ = export(cli, made["art"], out)
    assert (
        one_line(code, err)
        and "already exists; pass --force" in err
        and (tmp_path / "x.quantkit.json").read_bytes() == record
    )
    assert not out.exists()
    code, _, err, _ = export(cli, made["art"], out, "--force")
    assert code == 0, err
    assert out.is_file()


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_record_path_that_is_no_file_is_refused(cli, made, tmp_path, kind):
    rec = tmp_path / "x.quantkit.json"
    if kind == "directory":
        rec.mkdir()
    else:
        (tmp_path / "elsewhere.json").write_text("{}")
        rec.symlink_to(tmp_path / "elsewhere.json")
    code, _, err, _ = export(cli, made["art"], tmp_path / "x.gguf", "--force")
    assert one_line(code, err) and str(rec) in err and not (tmp_path / "x.gguf").exists()


# ---------------------------------------------------------------- the artifact's manifest


def _tamper(art: Path, kind: str) -> None:
    if kind == "4 KB of weight_packed flipped":
        flip_tensor_bytes(art / "model.safetensors", "weight_packed")
    elif kind == "config.json edited":
        (art / "config.json").write_text((art / "config.json").read_text() + " ")
    elif kind == "an extra file":
        (art / "notes.txt").write_text("x")
    elif kind == "a missing file":
        (art / "tokenizer.json").unlink()
    elif kind == "a symlink in the artifact":
        (art / "extra.json").symlink_to(art / "config.json")
    elif kind == "the manifest removed":
        meta = json.loads((art / "quantkit.json").read_text())
        del meta["files"]
        (art / "quantkit.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "kind",
    [
        "4 KB of weight_packed flipped",
        "config.json edited",
        "an extra file",
        "a missing file",
        "a symlink in the artifact",
        "the manifest removed",
    ],
)
def test_an_artifact_that_differs_from_its_manifest_is_refused_like_publish(cli, made, tmp_path, kind):
    art = tmp_path / "art"
    shutil.copytree(made["art"], art)
    _tamper(art, kind)
    out = tmp_path / "out" / "t.gguf"
    code, _, err, _ = export(cli, art, out)
    assert one_line(code, err), err
    code, _, published, _ = cli("publish", str(art), "--repo", "org/name", "--dry-run")
    assert code == 2 and err == published  # one check, one message: integrity.check
    assert not out.parent.exists()  # nothing written, not even the output folder or its lock


# ---------------------------------------------------------------- signals

# Runs the CLI with the export paused after its third tensor is written into the temp file: the test
# knows a live export is mid-way (it writes QK_TEST_MARK) and then signals it.
PAUSED = r"""
import os, sys, time
from pathlib import Path
import quantkit.gguf.write as w
real, n = w.tensor_bytes, [0]
def paused(art, plan):
    n[0] += 1
    if n[0] == 3:
        Path(os.environ["QK_TEST_MARK"]).write_text("mid-export")
        time.sleep(600)
    return real(art, plan)
w.tensor_bytes = paused
from quantkit.cli import main
sys.argv = ["quantkit", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("replacing", [False, True])
def test_a_signal_mid_export_cleans_up_and_exits_like_ctrl_c(made, tmp_path, sig, replacing):
    work = tmp_path / "work"
    work.mkdir()
    out = work / "k.gguf"
    if replacing:
        shutil.copy(made["ours"], out)
        shutil.copy(made["ours"].with_name("a.quantkit.json"), work / "k.quantkit.json")
    before = tree_digest(work)
    mark = tmp_path / "mark"
    env = {**os.environ, "QK_TEST_MARK": str(mark), "QUANTKIT_NO_PROGRESS": "1"}
    # a shell's default dispositions (pytest's own SIGINT handler is not inherited by exec)
    proc = subprocess.Popen(
        [PY, "-c", PAUSED, "export", str(made["art"]), "--format", "gguf", "--out", str(out), "--force"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while not mark.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the export did not reach its third tensor: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    assert list(work.glob(".k.gguf.partial-*")) and (work / ".k.gguf.lock").exists()  # truly mid-export
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err[
        -2000:
    ]
    assert tree_digest(work) == before  # no temp file, no lock, the old GGUF and record as they were
