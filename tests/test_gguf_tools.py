"""llama.cpp's tools: found where the install recorded them (or $QUANTKIT_LLAMA_TOOLS, or PATH), a
missing or failing one is one line, and the tools the install built run on this CPU."""

import os
import re
import stat
from pathlib import Path

import installed
import pytest
from installed import llama_tool

from quantkit.gguf import tools

REPO = Path(__file__).resolve().parents[1]


def _program(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_record(monkeypatch, tmp_path):
    """No install record and no QUANTKIT_LLAMA_TOOLS: what a hand-made environment has."""
    monkeypatch.delenv("QUANTKIT_LLAMA_TOOLS", raising=False)
    monkeypatch.setattr(tools, "record_file", lambda: tmp_path / "no-record")


def test_the_env_directory_wins_and_a_tool_missing_there_is_one_line(monkeypatch, tmp_path):
    _program(tmp_path / "t", "llama-bench", "exit 0")
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    assert tools.locate("llama-bench") == tmp_path / "t" / "llama-bench"
    with pytest.raises(tools.ToolError) as err:
        tools.locate("llama-quantize", "--type Q4_K_M")
    msg = str(err.value)
    assert (
        "\n" not in msg
        and msg.startswith("--type Q4_K_M: llama.cpp's llama-quantize is not installed")
        and "QUANTKIT_WITH_LLAMA_TOOLS=1" in msg
    )


def test_the_install_record_names_the_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("QUANTKIT_LLAMA_TOOLS", raising=False)
    _program(tmp_path / "built", "llama-imatrix", "exit 0")
    (tmp_path / "record").write_text(f"{tmp_path / 'built'}\n")
    monkeypatch.setattr(tools, "record_file", lambda: tmp_path / "record")
    assert tools.find("llama-imatrix") == tmp_path / "built" / "llama-imatrix"
    assert tools.find("llama-server") is None  # not in the recorded directory: PATH is not consulted then


def test_without_a_record_path_is_searched(monkeypatch, tmp_path, no_record):
    _program(tmp_path / "bin", "llama-server", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert tools.find("llama-server") == tmp_path / "bin" / "llama-server"


def test_a_tool_that_crashes_on_version_is_an_error(monkeypatch, tmp_path):
    _program(tmp_path / "t", "llama-server", "echo 'error while loading shared libraries: libllama.so.0' >&2; exit 127")
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    with pytest.raises(tools.ToolError, match="exit 127.*libllama"):
        tools.version("llama-server")


@pytest.mark.parametrize(
    "body, expect",
    [
        (
            "echo 'loading'; echo 'error: failed to read the model' >&2; exit 1",
            "failed (exit 1): error: failed to read the model",
        ),
        ("echo 'main: invalid ftype' >&2; echo 'usage: ...'; exit 3", "failed (exit 3): main: invalid ftype"),
        ("exit 7", "failed (exit 7): no output"),
    ],
)
def test_a_failing_tool_is_one_line_with_its_telling_line(monkeypatch, tmp_path, body, expect):
    _program(tmp_path / "t", "llama-quantize", body)
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    with pytest.raises(tools.ToolError) as err:
        tools.run("llama-quantize", ["x"])
    assert "\n" not in str(err.value) and expect in str(err.value)


def test_version_reads_llama_cpps_version_line(monkeypatch, tmp_path):
    _program(
        tmp_path / "t",
        "llama-bench",
        "echo 'load_backend: loaded CPU' >&2; echo 'version: 0.5.0-dev (build 0, commit 0c1e570)' >&2",
    )
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(tmp_path / "t"))
    assert tools.version("llama-bench") == "0.5.0-dev (build 0, commit 0c1e570)"


def test_installed_fails_where_the_install_recorded_tools_that_are_gone(monkeypatch, tmp_path):
    gone = tmp_path / "gone"
    (tmp_path / "record").write_text(str(gone))
    monkeypatch.delenv("QUANTKIT_LLAMA_TOOLS", raising=False)
    monkeypatch.setattr(tools, "record_file", lambda: tmp_path / "record")
    monkeypatch.setattr(installed, "LLAMA_TOOLS_RECORD", tmp_path / "record")
    with pytest.raises(pytest.fail.Exception, match="recorded as built: the install is broken"):
        installed.llama_tool("llama-quantize")
    monkeypatch.setattr(tools, "record_file", lambda: tmp_path / "none")
    monkeypatch.setattr(installed, "LLAMA_TOOLS_RECORD", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception):
        installed.llama_tool("llama-quantize")


def test_the_install_script_writes_the_record_quantkit_reads():
    script = (REPO / "scripts" / "_install.sh").read_text()
    assert f".venv/{tools.RECORD}" in script and f".venv/{installed.LLAMA_TOOLS_LEFT_OUT.name}" in script
    assert "scripts/build_llama_tools.sh" in script
    build = (REPO / "scripts" / "build_llama_tools.sh").read_text()
    assert "-DGGML_BACKEND_DL=ON" in build and "-DGGML_CPU_ALL_VARIANTS=ON" in build and "-DGGML_NATIVE=OFF" in build
    assert "march=native" not in build.replace("never -march=native", "")
    assert all(t in build for t in tools.TOOLS)
    assert "QUANTKIT_WITH_LLAMA_TOOLS=1" in (REPO / "scripts" / "test.sh").read_text()


@pytest.mark.parametrize("name", tools.TOOLS)
def test_every_built_tool_runs_here(name):
    llama_tool(name)
    version = tools.version(name)  # the binary started and its libraries loaded (else ToolError)
    assert version[0].isdigit() or version.startswith("build "), version


def test_the_build_picks_its_cpu_code_at_run_time():
    llama_tool("llama-bench")
    info = tools.build_info()
    if info is None:
        pytest.skip("tools found on PATH or $QUANTKIT_LLAMA_TOOLS, not built by scripts/build_llama_tools.sh")
    variants = info["cpu_variants"].split()
    assert {"x64", "haswell"} <= set(variants) and "-DGGML_BACKEND_DL=ON" in info["cmake_flags"]
    libs = {p.name for p in tools.tools_dir().glob("libggml-cpu-*.so")}
    assert libs == {f"libggml-cpu-{v}.so" for v in variants}
    proc = tools.run("llama-bench", ["--list-devices"])  # ggml logs which CPU library it loaded
    loaded = re.search(r"loaded CPU backend from (\S+)", proc.stdout + proc.stderr)
    assert loaded and Path(loaded.group(1)).name in libs, proc.stderr


def test_levers_engines_shows_llama_server_installed(cli):
    path = llama_tool("llama-server")
    code, stdout, stderr, _ = cli("levers", "--engines")
    assert code == 0, stderr
    block = stdout.split("llama-server: ", 1)[1].splitlines()
    assert block[1].strip().startswith(f"installed: {path} (version ")


def _built(folder: Path, version: str, flags: str = "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON") -> Path:
    folder.mkdir()
    for lib in ("libllama.so", "libggml.so", "libggml-cpu-haswell.so"):
        (folder / lib).write_bytes(b"")
    (folder / "BUILD.json").write_text(f'{{"llama_cpp_python": "{version}", "cmake_flags": "{flags}"}}')
    return folder


@pytest.mark.parametrize("case", ["same version", "another version", "one CPU variant", "no libllama"])
def test_the_dispatch_library_stands_in_only_for_the_same_llama_cpp(monkeypatch, tmp_path, case):
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "0.3.36")
    folder = _built(
        tmp_path / "t",
        "0.3.1" if case == "another version" else "0.3.36",
        "-DGGML_NATIVE=OFF" if case == "one CPU variant" else "-DGGML_BACKEND_DL=ON",
    )
    if case == "no libllama":
        (folder / "libllama.so").unlink()
    monkeypatch.setenv("QUANTKIT_LLAMA_TOOLS", str(folder))
    assert tools.dispatch_library() == (folder if case == "same version" else None)


def test_the_llamacpp_engine_runs_the_tools_cpu_variant(tmp_path):
    """Where the install built the tools, llama-cpp-python in a fresh process loads their libllama and
    the CPU variant that runs here, as llama-bench does (test_the_build_picks_its_cpu_code_at_run_time)."""
    import subprocess
    import sys

    llama_tool("llama-bench")
    if tools.dispatch_library() is None:
        pytest.skip("the tools are not a run-time dispatch build of the installed llama-cpp-python's llama.cpp")
    code = (
        "from quantkit.bench.engines import llamacpp_engine as e; m = e.import_llama_cpp(); print(e.library()); "
        "print(m.llama_print_system_info().decode())"
    )
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where = tools.runnable_dir(tools.dispatch_library())  # the build, or its copy without variants that die here
    assert proc.stdout.startswith(f"{where} (ggml's run-time CPU dispatch)"), proc.stdout
    loaded = re.search(r"loaded CPU backend from (\S+)", proc.stdout + proc.stderr)
    assert loaded and Path(loaded.group(1)).parent == where, proc.stderr
