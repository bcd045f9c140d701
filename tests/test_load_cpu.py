"""quantkit.load.cpu: the client's and the server's cores, the warning when they overlap, each party's
CPU during a step, and the server found by its loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from load_fixtures.fake_server import FakeOpenAI

from quantkit.load import cpu

BUSY = [sys.executable, "-c", "while True: pass"]
CORES = sorted(os.sched_getaffinity(0))


def _spawn(command: list[str], cores: list[int]) -> subprocess.Popen:
    return subprocess.Popen(command, preexec_fn=lambda: os.sched_setaffinity(0, cores))


def test_shared_cores_are_warned_about():
    proc = _spawn(["sleep", "30"], CORES)
    try:
        found = cpu.placement(proc.pid).to_json()
    finally:
        proc.kill()
        proc.wait()
    assert found["server_cores"] == CORES and found["shared_cores"] == CORES and "share cores" in found["warning"]


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to pin client and server apart")
def test_cores_pinned_apart_are_not():
    proc = _spawn(["sleep", "30"], CORES[:1])
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, CORES[1:])
    try:
        found = cpu.placement(proc.pid).to_json()
    finally:
        os.sched_setaffinity(0, old)
        proc.kill()
        proc.wait()
    assert found["shared_cores"] == [] and "warning" not in found


def test_an_unknown_server_is_said_so():
    assert "unknown" in cpu.placement(None).warning
    assert cpu.placement(os.getpid()).server_pid is None  # a stub inside the client's own process


def _proc_cpu_s(pid: int) -> float:
    """utime + stime from /proc/PID/stat, in seconds (independent of psutil)."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_servers_cpu_during_a_step():
    proc = _spawn(BUSY, CORES)
    try:
        time.sleep(0.2)
        start, before = time.perf_counter(), _proc_cpu_s(proc.pid)
        watch = cpu.Watch(proc.pid).start()
        time.sleep(1.5)
        shares = watch.shares().to_json()
        expected = (_proc_cpu_s(proc.pid) - before) / (time.perf_counter() - start)
    finally:
        proc.kill()
        proc.wait()
    # whatever else runs on the machine, the busy child's share is what the kernel charged it
    assert expected > 0.1 and shares["server"] == pytest.approx(expected, abs=0.1) and shares["client"] < 0.2
    assert shares["machine"] >= shares["server"] - 0.05 and shares["others"] >= 0


def test_the_server_is_found_by_its_loopback_port():
    child = subprocess.Popen(
        [sys.executable, "tests/load_fixtures/fake_server.py", "--slots", "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(child.stdout.readline())
        assert cpu.listening_pid(f"http://127.0.0.1:{port}") == child.pid
    finally:
        child.kill()
        child.wait()
    assert cpu.listening_pid("http://example.com:80") is None
    server = FakeOpenAI().start()  # this process listens: found, then set aside by placement()
    try:
        assert cpu.listening_pid(server.url) == os.getpid()
    finally:
        server.stop()
