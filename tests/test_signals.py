"""A process quantkit runs that dies of a signal (a tool, the vLLM worker, a lever's server) is one
line naming the signal, what it usually means and what to do, exit code 1, and nothing of it is
recorded as a result (core/signals.py)."""

from __future__ import annotations

import sys

import pytest

from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.external.worker import Worker


@pytest.mark.parametrize(
    ("code", "name"), [(-4, "SIGILL"), (132, "SIGILL"), (-9, "SIGKILL"), (137, "SIGKILL"), (-11, "SIGSEGV")]
)
def test_a_signal_is_named_from_either_form_of_exit_code(code, name):
    assert signal_name(code) == name


@pytest.mark.parametrize("code", [0, 1, 2, 127, 128, 160])
def test_an_exit_code_is_no_signal(code):
    assert signal_name(code) is None


def test_the_line_names_the_signal_what_it_means_and_what_to_do():
    line = crash_line("llama-bench", -9)
    assert line == (
        "llama-bench died of SIGKILL (killed from outside, often by the kernel's out-of-memory killer); "
        "nothing was recorded; free memory or use a smaller model"
    )
    assert crash_line("x", -4, "do this").endswith("; nothing was recorded; do this")


def test_a_worker_killed_by_a_signal_is_a_crash_not_a_refusal(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import os, signal, sys\nsys.stdin.readline()\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    worker = Worker.start(sys.executable, script, env={}, what="stand-in")
    try:
        with pytest.raises(EngineCrash) as err:
            worker.call("ping")
    finally:
        worker.close()
    assert err.value.exit_code == 1 and "the worker died of SIGSEGV" in str(err.value) and "\n" not in str(err.value)
