"""quantkit convert refusing bad checkpoints and bad results: one line, exit 2, nothing at --out."""

import json
import shutil
from pathlib import Path

import pytest
from fixtures import RECIPES

REPO = Path(__file__).resolve().parents[1]


def convert(cli, model, out, *extra):
    return cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(model),
        "--out",
        str(out),
        *extra,
    )


def no_load(monkeypatch):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))


def nothing_at(out: Path) -> bool:
    return not out.exists() and not list(out.parent.glob(f".{out.name}.partial-*"))


def test_shard_named_in_index_but_missing(cli, tiny_llama, tmp_path, monkeypatch):
    src = tmp_path / "sharded"
    shutil.copytree(tiny_llama, src)
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    weight_map = {n: "model.safetensors" for n in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    no_load(monkeypatch)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, src, out)
    assert (
        code == 2
        and "missing weight shard model-00002-of-00002.safetensors named in model.safetensors.index.json" in err
    )
    assert len(err.strip().splitlines()) == 1 and nothing_at(out)


def test_bin_only_checkpoint_needs_allow_pickle(cli, tiny_llama, tmp_path, monkeypatch):
    src = tmp_path / "pickled"
    shutil.copytree(tiny_llama, src)
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    no_load(monkeypatch)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, src, out)
    assert code == 2 and "only pickle (.bin) weights" in err and "--allow-pickle" in err
    assert len(err.strip().splitlines()) == 1 and nothing_at(out)

    # with the flag the check lets it through to the load (stubbed here: the file is no real pickle)
    import quantkit.quantize.convert as qc
    from quantkit.errors import ModelError

    def reached(*a, **k):
        raise ModelError("reached load_model")

    monkeypatch.setattr(qc, "load_model", reached)
    code, _, err, _ = convert(cli, src, out, "--allow-pickle")
    assert code == 2 and "reached load_model" in err and nothing_at(out)


def test_non_finite_converted_model_refused(cli, tiny_llama, tmp_path, monkeypatch):
    import torch

    import quantkit.quantize.convert as qc

    real = qc.apply_steps

    def nan_steps(*a, **k):
        model, done = real(*a, **k)
        with torch.no_grad():
            model.model.norm.weight[0] = float("nan")
        return model, done

    monkeypatch.setattr(qc, "apply_steps", nan_steps)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, tiny_llama, out)
    assert code == 2 and "the converted model has non-finite values in model.norm.weight" in err
    assert "Traceback" not in err and nothing_at(out)


def test_awq_pin_memory_patch_is_a_no_op_without_an_accelerator(monkeypatch):
    """methods/patches.py: IntermediatesCache.pin_memory skips pinning without an accelerator
    (where torch would raise), calls through with one, and patching twice wraps once."""
    pytest.importorskip("llmcompressor")
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    from quantkit.methods.patches import llmcompressor_cpu_pin_memory

    calls = []

    def original(self, *args, **kwargs):
        calls.append((self, args, kwargs))
        return "pinned"

    monkeypatch.setattr(IntermediatesCache, "pin_memory", original)
    llmcompressor_cpu_pin_memory()
    patched = IntermediatesCache.pin_memory
    assert patched is not original and patched._quantkit_cpu_patch
    llmcompressor_cpu_pin_memory()
    assert IntermediatesCache.pin_memory is patched  # idempotent

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert patched("cache", 1, x=2) is None and calls == []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert patched("cache", 1, x=2) == "pinned" and calls == [("cache", (1,), {"x": 2})]


def test_not_enough_free_space_refused_before_loading(cli, tiny_llama, tmp_path, monkeypatch):
    import quantkit.artifacts.staging as art

    monkeypatch.setattr(art, "free_bytes", lambda path: 10_000)
    no_load(monkeypatch)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, tiny_llama, out)
    assert code == 2 and "GB free, but the artifact needs about" in err and str(tmp_path) in err
    assert len(err.strip().splitlines()) == 1 and nothing_at(out)


@pytest.mark.parametrize("recipe", ["int4-w4a16-rtn", "bnb-nf4", "int8-w8a8-smoothquant"])
def test_free_space_estimate_is_close_to_the_artifact(cli, tiny_llama, tiny_text, tmp_path, monkeypatch, recipe):
    """The estimate (less its fixed headroom) is within a factor of the weights actually written."""
    import quantkit.quantize.convert as qc

    needed = []
    real = qc.check_free_space
    monkeypatch.setattr(qc, "check_free_space", lambda out, need: (needed.append(need), real(out, need)))
    out = tmp_path / "x"
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "calibration.samples=4",
        "--set",
        "calibration.seq_len=64",
    )
    assert code == 0, err
    weights = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    estimate = (needed[0] - (32 << 20)) / 1.05
    assert 0.8 * weights <= estimate <= 1.6 * weights, (estimate, weights)


@pytest.mark.parametrize(
    "error",
    [
        lambda: OSError(28, "No space left on device"),
        lambda: __import__("safetensors").SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        ),
    ],
    ids=["ENOSPC", "safetensors"],
)
def test_disk_full_while_writing_is_one_line(cli, tiny_llama, tmp_path, monkeypatch, error):
    from quantkit.artifacts import containers

    real = containers.CONTAINERS["compressed-tensors"]

    def save(model, out, shard):
        real.save(model, out, shard)
        raise error()

    monkeypatch.setitem(
        containers.CONTAINERS, "compressed-tensors", containers.Container(save, real.load, real.loader, real.describe)
    )
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, tiny_llama, out)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "no space left on the device" in errors[0] and str(out) in errors[0], err
    assert nothing_at(out) and not [
        p for p in tmp_path.iterdir() if p.name.startswith(".x.") and not p.name.endswith(".lock")
    ]


def _can_mount_tmpfs(path) -> bool:
    import subprocess

    try:
        r = subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {path}"], capture_output=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def test_real_full_disk(tiny_llama, tmp_path):
    """A 200 KiB tmpfs (in a user namespace) as --out's disk: the weights do not fit. The free-space
    check is switched off so the write itself hits ENOSPC, as when another process fills the disk."""
    import os
    import subprocess
    import sys

    small = tmp_path / "small"
    small.mkdir()
    if not _can_mount_tmpfs(small):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    py = REPO / ".venv" / "bin" / "python"
    driver = (
        "import sys, quantkit.quantize.convert as qc; qc.check_free_space = lambda out, need: None\n"
        "from quantkit.cli import main; sys.argv = ['quantkit', *sys.argv[1:]]; main()"
    )
    out = small / "art"
    script = (
        f'mount -t tmpfs -o size=200k tmpfs {small} && "$0" -c "$1" convert '
        f"{RECIPES / 'int4-w4a16-rtn.yaml'} "
        f"--model {tiny_llama} --out {out}; rc=$?; ls -A {small}; exit $rc"
    )
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, str(py if py.exists() else sys.executable), driver],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QUANTKIT_NO_PROGRESS": "1"},
    )
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "no space left on the device" in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stdout.split() == []  # nothing at --out, no staging, no lock file left


def test_fewer_calibration_windows_than_asked_are_said(cli, tiny_llama, tmp_path):
    """calibration.samples beyond what the text's region holds: the conversion calibrates on what
    there is, says how many and why, and quantkit.json records both counts."""
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i % 97} river {i}" for i in range(150)))
    out = tmp_path / "a"
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{text}",
        "--set",
        "calibration.samples=500",
        "--set",
        "calibration.seq_len=64",
        "--set",
        "steps[0].quantize.group_size=32",
    )
    assert code == 0, err
    cal = json.loads((out / "quantkit.json").read_text())["calibration"]
    assert cal["requested_samples"] == 500 and 0 < cal["samples"] < 500
    assert f"{cal['samples']} of the 500 windows asked for: the second half of the text" in err


def tree_state(root: Path) -> dict:
    """Every path under root (root included) with its mtime: a file created and removed again (a
    lock file) still changes its directory's mtime."""
    return {str(p.relative_to(root)): p.lstat().st_mtime_ns for p in [root, *sorted(root.rglob("*"))]}


@pytest.mark.parametrize(
    "where, force, message",
    [
        ("src/sub", False, "is inside the source checkpoint"),
        ("src/a/b", True, "is inside the source checkpoint"),
        ("src", True, "is the source checkpoint"),
        ("old", False, "already exists; pass --force"),
        ("foreign", True, "is not a quantkit artifact (no quantkit.json) and is not empty"),
    ],
)
def test_every_refusal_of_where_to_write_comes_before_anything_is_written(
    cli, tiny_llama, tmp_path, where, force, message
):
    """`--out SRC/sub` was refused "(nothing was changed)" after SRC/.sub.lock had been created,
    changing the source's mtime (a read-only source got a permission error instead)."""
    import os

    root = tmp_path / "root"
    shutil.copytree(tiny_llama, root / "src")
    (root / "old").mkdir()
    (root / "old" / "quantkit.json").write_text("{}")
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("mine")
    for p in [root, *root.rglob("*")]:
        os.utime(p, ns=(10**18, 10**18), follow_symlinks=False)
    before = tree_state(root)
    for extra in ([], ["--plan"]):
        code, _, err, _ = convert(cli, root / "src", root / where, *extra, *(["--force"] if force else []))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert tree_state(root) == before


class _RunsCode:
    """A pickle that would run a command when unpickled without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    "others, named",
    [((), "pytorch_model.bin"), (("training_args.bin",), "one of its pickle files (pytorch_model.bin, training_args")],
    ids=["one", "several"],
)
def test_a_pickle_the_safe_loader_refuses_is_one_line_naming_it(cli, tiny_llama, tmp_path, others, named):
    """With --allow-pickle, torch's weights_only loader blocks a malicious pickle, which was exit 1
    with torch's advice to turn weights_only off: exit 2, naming the file, without that advice."""
    import torch

    src = tmp_path / "pickled"
    shutil.copytree(tiny_llama, src)
    (src / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({"model.embed_tokens.weight": _RunsCode(marker)}, src / "pytorch_model.bin")
    for other in others:
        torch.save({"x": torch.zeros(1)}, src / other)
    out = tmp_path / "x"
    code, _, err, _ = convert(cli, src, out, "--allow-pickle")
    assert code == 2 and f"{src}: {named}" in err and "holds objects other than tensors" in err, err
    assert len(err.strip().splitlines()) == 2 and "weights_only` set to `False`" not in err  # `loading SRC` first
    assert not marker.exists() and nothing_at(out)
