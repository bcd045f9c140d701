"""llama.cpp's own programs (llama-quantize, llama-imatrix, llama-bench, llama-server,
llama-perplexity): where they are, which build they are, and running one with a one-line error.

scripts/_install.sh builds them once from the llama.cpp that llama-cpp-python vendors
(scripts/build_llama_tools.sh, ggml's run-time CPU dispatch) and records their directory beside
its stamp in the virtual environment. Looked up in order: $QUANTKIT_LLAMA_TOOLS (a directory),
that record, then PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.errors import QuantkitError
from quantkit.gguf import cpu_variant

TOOLS = ("llama-server", "llama-bench", "llama-quantize", "llama-imatrix", "llama-perplexity")
ENV = "QUANTKIT_LLAMA_TOOLS"
RECORD = ".quantkit-llama-tools"  # in the virtual environment, written by scripts/_install.sh
INSTALL = (
    "QUANTKIT_WITH_LLAMA_TOOLS=1 ./scripts/_install.sh builds them (or set "
    "QUANTKIT_LLAMA_TOOLS to a directory holding them)"
)


class ToolError(QuantkitError):
    """A llama.cpp program that is missing, or that failed."""


def record_file() -> Path:
    return Path(sys.prefix) / RECORD


def tools_dir() -> Path | None:
    """The directory of the built tools: $QUANTKIT_LLAMA_TOOLS, else the install's record; None if neither."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    try:
        text = record_file().read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask: a container's or taskset's limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def find(name: str) -> Path | None:
    """The program `name` (one of TOOLS), or None when it is nowhere."""
    if name not in TOOLS:
        raise ValueError(f"not a llama.cpp tool quantkit runs: {name}")
    where = tools_dir()
    if where is not None:
        if not (where / name).is_file():
            return None
        path = runnable_dir(where) / name
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(name)
    return Path(found) if found else None


def runnable_dir(where: Path) -> Path:
    """`where`, or for a build with run-time CPU dispatch the directory of it whose CPU variant was
    tried on this machine (cpu_variant.py): a tool started from there never loads a variant that dies."""
    if not cpu_variant.variants_of(where):
        return where
    return cpu_variant.runnable_dir(where)[0]


def cpu_choice() -> cpu_variant.Choice | None:
    """The tools' CPU variant on this machine (tried now if it was not yet), or None without a dispatch build."""
    where = tools_dir()
    return cpu_variant.choose(where) if where is not None and cpu_variant.variants_of(where) else None


def locate(name: str, purpose: str = "") -> Path:
    """The program `name`, or one line saying it is missing and how to build it."""
    path = find(name)
    if path is None:
        where = f" (not in {tools_dir()})" if tools_dir() is not None else ""
        raise ToolError(f"{purpose + ': ' if purpose else ''}llama.cpp's {name} is not installed{where}; {INSTALL}")
    return path


def build_info() -> dict | None:
    """What scripts/build_llama_tools.sh recorded (version, CPU variants, flags, build time), if it built them."""
    where = tools_dir()
    try:
        return json.loads((where / "BUILD.json").read_text()) if where else None
    except (OSError, json.JSONDecodeError):
        return None


def dispatch_library() -> Path | None:
    """The tools' directory when its libllama can stand in for llama-cpp-python's own: built with
    ggml's run-time CPU dispatch (the best CPU variant chosen when it loads, as llama-bench does)
    from the llama.cpp that the installed llama-cpp-python vendors (the same version, so the same C
    API). None otherwise (no tools, another build, another version)."""

    info, where = build_info(), tools_dir()
    if not info or where is None or "GGML_BACKEND_DL=ON" not in info.get("cmake_flags", ""):
        return None
    if not (where / "libllama.so").is_file() or not list(where.glob("libggml-cpu-*.so")):
        return None
    try:
        installed = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None
    return where if info.get("llama_cpp_python") == installed else None


def version(name: str) -> str:
    """What `NAME --version` prints after "version: " ("0.5.0-dev (build 0, commit ...)"). A tool
    that has no --version (llama-quantize prints its usage and exits 1) started all the same: the
    build's recorded commit stands for it. ToolError when the program does not start."""
    path = locate(name)
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(
            f"{path} does not start ({getattr(exc, 'strerror', None) or exc}); rebuild it: {INSTALL}"
        ) from None
    if proc.returncode < 0:
        raise EngineCrash(crash_line(name, proc.returncode, _crash_todo(proc.returncode)))
    text = (proc.stdout + proc.stderr).strip()
    match = re.search(r"^version: (.+)$", text, re.M)
    if match:
        return match.group(1).strip()
    if re.match(r"usage: ", text):
        return f"build {(build_info() or {}).get('llama_cpp_commit', 'of unknown commit')} (no --version)"
    raise ToolError(f"{name} --version failed (exit {proc.returncode}): {telling_line(text)}")


def _crash_todo(returncode: int) -> str | None:
    """What to do when a tool died of `returncode`'s signal (None: the signal's own advice)."""
    if signal_name(returncode) != "SIGILL":
        return None
    return f"`quantkit engines status llamacpp` shows the CPU variants tried here; rebuild the tools: {INSTALL}"


def telling_line(text: str) -> str:
    """The line that says what went wrong: the last one naming an error, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.search(r"error|failed|invalid|unknown|cannot|can't|unable", line, re.I):
            return line[:240]
    return lines[-1][:240] if lines else "no output"


def run(name: str, args: list[str], timeout: float | None = None, purpose: str = "") -> subprocess.CompletedProcess:
    """Run a tool to completion (text output captured); ToolError with its telling line when it fails."""
    path = locate(name, purpose)
    try:
        proc = subprocess.run(
            [str(path), *map(str, args)], capture_output=True, text=True, errors="replace", timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ToolError(f"{name} did not finish within {timeout:.0f} s") from None
    except OSError as exc:  # a binary of another platform, a library it cannot load
        raise ToolError(f"{path} does not start ({exc.strerror or exc}); rebuild it: {INSTALL}") from None
    if proc.returncode < 0:  # killed by a signal: no output of it is a result
        raise EngineCrash(crash_line(name, proc.returncode, _crash_todo(proc.returncode)))
    if proc.returncode != 0:
        raise ToolError(f"{name} failed (exit {proc.returncode}): {telling_line(proc.stderr + proc.stdout)}")
    return proc


def status() -> dict:
    """Each tool: its path and version, or why it is not there; and the build record."""
    choice = cpu_choice()
    out = {
        "dir": str(tools_dir()) if tools_dir() else None,
        "build": build_info(),
        "cpu_variant": choice.to_json() if choice else None,
        "tools": {},
    }
    for name in TOOLS:
        path = find(name)
        entry: dict = {"path": str(path) if path else None}
        if path is not None:
            try:
                entry["version"] = version(name)
            except ToolError as exc:
                entry["error"] = str(exc)
        out["tools"][name] = entry
    return out
