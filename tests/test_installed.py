"""installed.py decides whether a missing tool fails a test or skips it: it fails once the install
script has run (its stamp is there), unless llama.cpp was left out on purpose; it skips otherwise."""

import sys
from pathlib import Path

import installed
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def venv(tmp_path, monkeypatch):
    """A virtual environment of the test's own, no tool in it: llama_cpp and fastapi do not import."""
    monkeypatch.setattr(installed, "STAMP", tmp_path / ".quantkit-install")
    monkeypatch.setattr(installed, "LLAMACPP_LEFT_OUT", tmp_path / ".quantkit-without-llamacpp")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    monkeypatch.setitem(sys.modules, "fastapi", None)  # find_spec answers None
    return tmp_path


def test_after_the_install_script_a_missing_tool_fails(venv):
    (venv / ".quantkit-install").write_text("0123456789abcdef\n")
    with pytest.raises(pytest.fail.Exception, match="llama-cpp-python is missing, but scripts/_install.sh installed"):
        installed.require_llama_cpp()
    with pytest.raises(pytest.fail.Exception, match=r"transformers\[serving\] extra \(fastapi\) is missing"):
        installed.require_serving()


def test_llama_cpp_left_out_on_purpose_skips(venv):
    (venv / ".quantkit-install").write_text("0123456789abcdef\n")
    (venv / ".quantkit-without-llamacpp").touch()
    with pytest.raises(pytest.skip.Exception, match="llama-cpp-python is not installed"):
        installed.require_llama_cpp()
    with pytest.raises(pytest.fail.Exception):  # leaving llama.cpp out does not leave out the rest
        installed.require_serving()


def test_without_the_install_script_a_missing_tool_skips(venv):
    with pytest.raises(pytest.skip.Exception, match="llama-cpp-python is not installed"):
        installed.require_llama_cpp()
    with pytest.raises(pytest.skip.Exception, match="fastapi"):
        installed.require_serving()


def test_the_install_script_records_what_it_left_out():
    """The file installed.py reads is the one scripts/_install.sh writes."""
    script = (REPO / "scripts" / "_install.sh").read_text()
    assert (
        f"touch .venv/{installed.LLAMACPP_LEFT_OUT.name}" in script and f"stamp=.venv/{installed.STAMP.name}" in script
    )
