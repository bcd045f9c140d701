"""The CPU variant of a llama.cpp build is tried before it is trusted (gguf/cpu_variant.py): a
variant that dies (a stand-in library that raises SIGILL, as ggml's sapphirerapids variant does on
VMs that advertise AMX but trap on it) is passed over for the next-best one that runs, for
quantkit's own engine and for the tools it starts, and the verdict is kept per machine and build."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.gguf import cpu_variant, tools
from quantkit.gguf.cpu_variant import Choice

STAND_IN = r"""
#include <signal.h>
int ggml_backend_score(void) { return 1 << 20; }  /* above every real variant: ggml's loader picks it */
void * ggml_backend_init(void) { raise(SIGILL); return 0; }  /* what an untrapped AMX instruction does */
"""


def fake_build(root: Path, variants=("x64", "haswell", "amx")) -> Path:
    d = root / "build"
    d.mkdir()
    for v in variants:
        (d / f"libggml-cpu-{v}.so").write_bytes(b"\x7fELF" + v.encode())
    for lib in ("libllama.so", "libggml.so", "libggml-base.so"):
        (d / lib).write_bytes(b"\x7fELF")
    (d / "llama-bench").write_text("#!/bin/sh\n")
    (d / "llama-bench").chmod(0o755)
    (d / "BUILD.json").write_text(json.dumps({"cmake_flags": "-DGGML_BACKEND_DL=ON", "llama_cpp_python": "0"}))
    return d


@pytest.fixture(autouse=True)
def fresh_home(tmp_path, monkeypatch):
    """A home without the session's verdicts (conftest.py copies them into every test's home)."""
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("QUANTKIT_HOME", str(home))
    return home


@pytest.fixture
def stubbed(monkeypatch):
    """Scores as ggml reads them; a probe that dies on the `amx` variant, as the VM does."""
    tried = []

    def scores(lib_dir):
        return {"x64": 1, "haswell": 64, "amx": 4032}

    def try_dir(lib_dir, model):
        kept = sorted(p.name for p in Path(lib_dir).glob("libggml-cpu-*.so"))
        tried.append(kept)
        assert len(kept) == 1, "each variant is tried alone"
        return ("amx" not in kept[0], "died of SIGILL" if "amx" in kept[0] else "ran")

    monkeypatch.setattr(cpu_variant, "scores", scores)
    monkeypatch.setattr(cpu_variant, "try_dir", try_dir)
    return tried


def test_a_variant_that_dies_is_passed_over_for_the_next_best(tmp_path, stubbed):
    build = fake_build(tmp_path)
    where, choice = cpu_variant.runnable_dir(build)
    assert choice.variant == "haswell" and choice.fallback
    assert [(t.variant, t.ok, t.result) for t in choice.trials] == [
        ("amx", False, "died of SIGILL"),
        ("haswell", True, "ran"),
    ]
    # the directory the engine and the tools load: every file of the build, the dying variant left out
    assert where != build and sorted(p.name for p in where.glob("libggml-cpu-*.so")) == ["libggml-cpu-haswell.so"]
    assert (where / "llama-bench").is_file() and (where / "libllama.so").is_file()
    assert "haswell (fallback); amx died of SIGILL" == choice.describe()


def test_the_verdict_is_kept_per_machine_and_build(tmp_path, fresh_home, stubbed, monkeypatch):
    build = fake_build(tmp_path)
    first = cpu_variant.choose(build)
    n = len(stubbed)
    assert cpu_variant.choose(build) == first and len(stubbed) == n, "a second run tries nothing"
    records = list((fresh_home / "llama-cpu").glob("*.json"))
    assert len(records) == 1 and Choice.from_json(json.loads(records[0].read_text())) == first
    monkeypatch.setattr(cpu_variant, "machine_key", lambda: "another-cpu")
    cpu_variant.choose(build)
    assert len(stubbed) > n, "another CPU is tried anew"


RECORD_DAMAGES = {
    "a list": lambda rec: [rec],
    "null": lambda rec: None,
    "a variant the build lacks": lambda rec: {
        **rec,
        "variant": "zen9",
        "trials": [{"variant": "zen9", "score": 9, "ok": True, "result": "ran"}],
    },
    "trials that ran but no choice": lambda rec: {**rec, "variant": None, "dir": None},
    "a choice no trial ran": lambda rec: {**rec, "variant": "amx"},
    "its directory gone": lambda rec: {**rec, "dir": "/nonexistent/llama-cpu"},
    "another library": lambda rec: {**rec, "library": "/elsewhere/build"},
    "no dispatch for a build with variants": lambda rec: {**rec, "dispatch": False},
    "a trial that is text": lambda rec: {**rec, "trials": ["haswell ran"]},
    "ok as text": lambda rec: {**rec, "trials": [{**t, "ok": "yes"} for t in rec["trials"]]},
    "an unknown key": lambda rec: {**rec, "surprise": 1},
    "schema 2": lambda rec: {**rec, "schema": 2},
}


@pytest.mark.parametrize("damage", RECORD_DAMAGES, ids=list(RECORD_DAMAGES))
def test_a_record_that_does_not_match_the_build_is_tried_again(tmp_path, fresh_home, stubbed, damage):
    """A parsable verdict that does not describe the build on disk (or is not a verdict at all) never
    disables llama.cpp: it is ignored, the variants are tried again and a good verdict replaces it."""
    build = fake_build(tmp_path)
    first = cpu_variant.choose(build)
    (record,) = (fresh_home / "llama-cpu").glob("*.json")
    record.write_text(json.dumps(RECORD_DAMAGES[damage](first.to_json())))
    n = len(stubbed)
    where, again = cpu_variant.runnable_dir(build)
    assert len(stubbed) > n and again == first and again.variant == "haswell"
    assert Choice.from_json(json.loads(record.read_text())) == first


def test_a_directory_in_the_records_place_is_replaced(tmp_path, fresh_home, stubbed):
    build = fake_build(tmp_path)
    first = cpu_variant.choose(build)
    (record,) = (fresh_home / "llama-cpu").glob("*.json")
    record.unlink()
    (record / "inside").mkdir(parents=True)
    assert cpu_variant.choose(build) == first and record.is_file()


def test_ggmls_own_choice_is_used_as_built_when_it_runs(tmp_path, monkeypatch):
    build = fake_build(tmp_path)
    monkeypatch.setattr(cpu_variant, "scores", lambda d: {"x64": 1, "haswell": 64, "amx": 4032})
    monkeypatch.setattr(cpu_variant, "try_dir", lambda d, m: (True, "ran"))
    where, choice = cpu_variant.runnable_dir(build)
    assert where == build and choice.variant == "amx" and not choice.fallback


def test_no_variant_that_runs_is_one_line_and_exit_1(tmp_path, monkeypatch):
    build = fake_build(tmp_path)
    monkeypatch.setattr(cpu_variant, "scores", lambda d: {"x64": 1, "amx": 4032})
    monkeypatch.setattr(cpu_variant, "try_dir", lambda d, m: (False, "died of SIGILL"))
    with pytest.raises(EngineCrash) as err:
        cpu_variant.runnable_dir(build)
    assert err.value.exit_code == 1 and "does not run on this CPU" in str(err.value) and "\n" not in str(err.value)


def test_signal_names_and_advice():
    assert signal_name(-4) == "SIGILL" and signal_name(132) == "SIGILL" and signal_name(1) is None
    line = crash_line("llama-bench", -4)
    assert line.startswith("llama-bench died of SIGILL (an instruction this CPU does not execute")


def test_the_tools_run_from_the_runnable_directory(tmp_path, stubbed, monkeypatch):
    build = fake_build(tmp_path)
    monkeypatch.setenv(tools.ENV, str(build))
    path = tools.locate("llama-bench")
    assert path.parent != build and not (path.parent / "libggml-cpu-amx.so").exists()


def test_a_tool_killed_by_a_signal_is_one_line_exit_1(tmp_path, monkeypatch):
    d = tmp_path / "tools"
    d.mkdir()
    (d / "llama-bench").write_text("#!/bin/sh\nkill -ILL $$\n")
    (d / "llama-bench").chmod(0o755)
    monkeypatch.setenv(tools.ENV, str(d))  # no CPU variants: a plain directory of programs
    with pytest.raises(EngineCrash) as err:
        tools.run("llama-bench", ["-m", "x"])
    assert err.value.exit_code == 1 and "llama-bench died of SIGILL" in str(err.value)


needs_tools = pytest.mark.skipif(
    tools.dispatch_library() is None or shutil.which("gcc") is None,
    reason="needs llama.cpp's tools built with run-time dispatch (QUANTKIT_WITH_LLAMA_TOOLS=1) and gcc",
)


@needs_tools
def test_a_real_build_falls_back_from_a_variant_that_raises_sigill(tmp_path, fresh_home):
    """The real build with one more variant, a stand-in that scores above all and raises SIGILL
    when ggml starts it: quantkit's engine and llama-bench run on the next-best real variant."""
    real = tools.tools_dir()
    build = tmp_path / "build"
    shutil.copytree(real, build, symlinks=True)
    src = tmp_path / "standin.c"
    src.write_text(STAND_IN)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(build / "libggml-cpu-standin.so"), str(src)], check=True)
    where, choice = cpu_variant.runnable_dir(build)
    assert choice.trials[0].variant == "standin" and choice.trials[0].result == "died of SIGILL"
    assert choice.fallback and choice.trials[-1].ok and choice.variant != "standin"
    assert not (where / "libggml-cpu-standin.so").exists()
    # llama-bench from that directory benches the probe's tiny model (from the build's own it dies)
    probe = fresh_home / "llama-cpu" / "probe.gguf"
    args = ["-m", str(probe), "-p", "8", "-n", "4", "-r", "1", "-o", "json"]
    out = subprocess.run([str(where / "llama-bench"), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(r["n_gen"] for r in json.loads(out.stdout)) == [0, 4]  # the prompt test, then the decode test
    dead = subprocess.run([str(build / "llama-bench"), *args], capture_output=True, text=True, timeout=120)
    assert signal_name(dead.returncode) == "SIGILL"
