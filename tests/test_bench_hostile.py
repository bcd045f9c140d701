"""bench's options as a hostile user gives them: lists with empty items, threads beyond the CPUs, a
probe that dies, a kill while it runs; each is one line with its exit code, never a silent default
or a traceback."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantkit.core.signals import EngineCrash

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args",
    [
        ["--depth", ""],
        ["--depth", "0,,4"],
        ["--depth", "4,"],
        ["--depth", ",4"],
        ["--depth", " "],
        ["--sweep", ""],
        ["--sweep", "8,,16"],
        ["--shape-bits", "16,,8"],
    ],
)
def test_a_list_with_an_empty_item_is_refused(cli, tiny_llama, monkeypatch, args):
    def boom(*a, **k):
        raise AssertionError("probed before the options were checked")

    monkeypatch.setattr("quantkit.bench.probe.run_probe", boom)
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "eager", *args)
    assert code == 2 and f"{args[0]} {args[1]!r}: expected comma-separated integers" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("bits", ["4,,8", "", "4,"])
def test_roofline_bits_with_an_empty_item_are_refused(cli, bits):
    code, _, err, _ = cli("roofline", "--shape", "llama3-8b", "--device", "h200", "--bits", bits)
    assert code == 2 and "--bits" in err and "expected comma-separated integers" in err, err


@pytest.mark.parametrize("threads", ["100000", str((os.cpu_count() or 1) * 64)])
def test_threads_beyond_the_cpus_are_refused_before_the_probe(cli, tiny_llama, monkeypatch, threads):
    def boom(*a, **k):
        raise AssertionError("probed with threads the process cannot run")

    monkeypatch.setattr("quantkit.bench.probe.run_probe", boom)
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "eager", "--threads", threads)
    assert code == 2 and f"--threads {threads}: this process may run on" in err, err


@pytest.mark.parametrize("returncode, kind", [(-11, EngineCrash), (-6, EngineCrash), (139, EngineCrash)])
def test_a_probe_that_dies_of_a_signal_is_one_line_exit_1(monkeypatch, returncode, kind):
    from quantkit.bench import probe

    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, returncode, "", ""))
    with pytest.raises(kind) as info:
        probe.run_probe(probe.devices.resolve_device("cpu"), 2)
    line = str(info.value)
    assert info.value.exit_code == 1 and "the device probe (cpu) died of SIG" in line and "?" not in line


def test_a_probe_that_fails_silently_says_its_exit_code(monkeypatch):
    from quantkit.bench import probe
    from quantkit.errors import QuantkitError

    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 3, "", ""))
    with pytest.raises(QuantkitError, match=r"device probe failed: exit 3, no message"):
        probe.run_probe(probe.devices.resolve_device("cpu"), 2)


def test_sigterm_stops_a_bench_with_one_line_and_130(tiny_llama, tmp_path):
    """`kill PID` during the timings: 'interrupted' and exit 130, as Ctrl-C and pareto do, never a
    silent 143; nothing is left at --out."""
    out = tmp_path / "res.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "QUANTKIT_HOME": str(tmp_path / "home"), "QUANTKIT_PROBE_MIB": "16"}
    cmd = [sys.executable, "-c", "from quantkit.cli import main; main()", "bench", str(tiny_llama), "--engine"]
    cmd += ["eager", "--repeats", "1000", "--min-seconds", "600", "--no-self-check", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "bench " + str(tiny_llama) not in proc.stderr.readline():
            pass
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err[-2000:]
    assert not out.exists()
