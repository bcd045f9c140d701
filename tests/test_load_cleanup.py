"""A lever study's server is stopped with everything it started, by kind of server that hides from a
process-group kill (a shell wrapper, setsid, a double fork) and by how quantkit ends (the normal
path, SIGKILL while waiting for readiness, SIGKILL during the staircase); and the misbehaving servers
(never ready, exits at once, port taken, ignores SIGTERM) still end as one line.

Real processes throughout: the working process writes its pid and start time (escaping_server.py),
and a test passes only when that process is gone, polled with a timeout.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FAKE = str(REPO / "tests" / "load_fixtures" / "fake_server.py")
ESCAPE = str(REPO / "tests" / "load_fixtures" / "escaping_server.py")
SUPERVISOR = REPO / "quantkit" / "load" / "supervisor.py"
SLEEPER = ["{python}", "-c", "import time; time.sleep(1000)", "{port}"]
SERVER = ["{python}", FAKE, "--port", "{port}", "--slots", "1"]
HOWS = ["wrapper", "setsid", "daemon"]
GONE_WITHIN_S = 30.0  # the supervisor's SIGTERM round plus a loaded 2-core machine

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the supervisor (subreaper, parent-death signal) is Linux's"
)


def _command(how: str, record: Path, worker: list[str]) -> list[str]:
    """The study's server command: the worker escapes the way `how` names."""
    if how == "wrapper":  # sh -c "server & wait": the server is the shell's child
        return ["sh", "-c", shlex.join(["{python}", ESCAPE, "serve", str(record), *worker]) + " & wait"]
    return ["{python}", ESCAPE, how, str(record), *worker]


def _study(tmp_path: Path, command: list[str], ready_timeout_s: float = 120, **load) -> Path:
    study = {
        "name": "cleanup",
        "server": {"engine": "custom", "model": "m", "command": command, "ready_timeout_s": ready_timeout_s},
        "load": {"concurrency": "1", "prompt_len": 8, "gen_len": 4, "max_requests": 2, "timeout": 20, **load},
        "levers": [{"name": "only"}],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _running(record: tuple[int, str]) -> bool:
    """The recorded process still runs (not a zombie, not a new process under a reused pid)."""
    pid, start = record
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start


def _ends(record: tuple[int, str], within_s: float = GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _running(record):
            return True
        time.sleep(0.2)
    return False


def _read_record(path: Path, proc: subprocess.Popen | None = None, within_s: float = 90.0) -> tuple[int, str]:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert proc is None or proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, f"the worker never wrote {path.name}"
        time.sleep(0.2)
    pid, start = path.read_text().split()
    return int(pid), start


@pytest.fixture
def leftovers():
    """Records of workers to kill after the test whatever it asserted, so a failure leaves nothing behind."""
    records: list[tuple[int, str]] = []
    yield records
    for record in records:
        if _running(record):
            os.kill(record[0], signal.SIGKILL)


def _one_error(stderr: str) -> bool:
    """One error line (progress lines such as `[lever] starting: ...` come before it)."""
    return len([line for line in stderr.splitlines() if line.startswith("error:")]) == 1


def _spawn_levers(study: Path, out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-c",
        "from quantkit.cli import main; main()",
        "levers",
        str(study),
        "--out",
        str(out),
        "--trust-study",
    ]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize("how", HOWS)
def test_kill_9_while_waiting_for_readiness_leaves_no_server(tmp_path, how, leftovers):
    record_file = tmp_path / "worker"
    proc = _spawn_levers(_study(tmp_path, _command(how, record_file, SLEEPER)), tmp_path / "out")
    try:
        record = _read_record(record_file, proc)
        leftovers.append(record)
        assert _running(record) and proc.poll() is None  # quantkit is still waiting for readiness
        proc.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stderr.close()
    assert _ends(record), f"{how}: the worker {record[0]} outlived a SIGKILLed quantkit"


def test_kill_9_during_the_staircase_leaves_no_server(tmp_path, leftovers):
    record_file = tmp_path / "worker"
    study = _study(tmp_path, _command("wrapper", record_file, SERVER), max_requests=None, step_seconds=60)
    proc = _spawn_levers(study, tmp_path / "out")
    try:
        for _ in range(60):
            line = proc.stderr.readline()
            if "warm-up ok" in line or not line:
                break
        assert "warm-up ok" in line, line
        record = _read_record(record_file)
        leftovers.append(record)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stderr.close()
    assert _ends(record), "the server outlived a SIGKILLed quantkit"


@pytest.mark.parametrize("how", HOWS)
def test_the_normal_path_stops_servers_that_left_the_process_group(cli, tmp_path, how, leftovers):
    record_file = tmp_path / "worker"
    study = _study(tmp_path, _command(how, record_file, SERVER))
    code, _, stderr, _ = cli("levers", str(study), "--out", str(tmp_path / "out"), "--trust-study")
    record = _read_record(record_file, within_s=0)
    leftovers.append(record)
    assert code == 0, stderr
    assert _ends(record, within_s=5), f"{how}: the server {record[0]} outlived its study"
    run = json.loads((tmp_path / "out" / "00-only.json").read_text())
    assert run["steps"][0]["completed"] == 2 and run["server"]["exit_code"] is not None


def test_a_server_that_ignores_sigterm_is_killed_with_what_it_started(cli, tmp_path, monkeypatch, leftovers):
    import quantkit.load.process as process

    monkeypatch.setattr(process, "STOP_GRACE_S", 1.0)
    deaf = [
        "{python}",
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)",
        "{port}",
    ]
    record_file = tmp_path / "worker"
    wrapper = ["sh", "-c", "trap '' TERM; " + shlex.join(["{python}", ESCAPE, "setsid", str(record_file), *deaf])]
    start = time.monotonic()
    code, _, stderr, _ = cli(
        "levers", str(_study(tmp_path, wrapper, ready_timeout_s=3)), "--out", str(tmp_path / "out"), "--trust-study"
    )
    record = _read_record(record_file, within_s=0)
    leftovers.append(record)
    assert code == 2 and "not ready within 3 s" in stderr and _one_error(stderr)
    assert _ends(record, within_s=5) and time.monotonic() - start < 60


@pytest.mark.parametrize(
    "command, message",
    [
        (["{python}", "-c", "import sys; print('bye', file=sys.stderr); sys.exit(5)", "{port}"], "exited with code 5"),
        (["/nonexistent/server-binary", "--port", "{port}"], "cannot start the server (/nonexistent/server-binary"),
        (
            [
                "{python}",
                "-c",
                "import socket, sys; socket.create_server(('127.0.0.1', int(sys.argv[1])))",
                "PORT",
                "{port}",
            ],
            "Address already in use",
        ),
    ],
)
def test_servers_that_cannot_start_are_one_line(cli, tmp_path, command, message):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # a port another program holds
        command = [str(taken.getsockname()[1]) if part == "PORT" else part for part in command]
        code, _, stderr, _ = cli(
            "levers", str(_study(tmp_path, command)), "--out", str(tmp_path / "out"), "--trust-study"
        )
    assert code == 2 and _one_error(stderr) and message in stderr, stderr


def test_without_the_supervisor_the_process_group_is_still_stopped(cli, tmp_path, monkeypatch, leftovers):
    """Where the supervisor is not available (not Linux), a wrapper's child in its group still goes."""
    import quantkit.load.process as process

    monkeypatch.setattr(process, "supervised", lambda: False)
    record_file = tmp_path / "worker"
    code, _, stderr, _ = cli(
        "levers",
        str(_study(tmp_path, _command("wrapper", record_file, SERVER))),
        "--out",
        str(tmp_path / "out"),
        "--trust-study",
    )
    record = _read_record(record_file, within_s=0)
    leftovers.append(record)
    assert code == 0, stderr
    assert _ends(record, within_s=5)


def test_the_supervisor_starts_nothing_once_its_parent_is_gone(tmp_path):
    """The parent-death signal is armed after the supervisor starts: a parent that died before then
    (here: a pid that is not its parent) must not leave a server nobody will stop."""
    marker = tmp_path / "started"
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(SUPERVISOR),
            "--parent",
            str(os.getppid()),
            "--grace",
            "1",
            "--",
            "touch",
            str(marker),
        ],
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 127 and not marker.exists()


def test_the_supervisor_passes_the_servers_exit_code_on(tmp_path):
    """wait_ready reads the supervisor's exit code as the server's ('exited with code 3')."""
    script = (
        f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-I', '-S', {str(SUPERVISOR)!r}, "
        "'--parent', str(__import__('os').getpid()), '--grace', '1', '--', 'sh', '-c', sys.argv[1]]).returncode)"
    )
    for shell, code in (("exit 3", 3), ("kill -9 $$", 128 + 9)):
        assert subprocess.run([sys.executable, "-c", script, shell], timeout=30).returncode == code
