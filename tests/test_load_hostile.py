"""`quantkit load` against servers that misbehave, by kind: every bad answer is a counted error of the
right kind for that one request, never a crash, and what was measured always reaches --out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from load_fixtures.fake_server import FakeOpenAI
from load_fixtures.hostile import EXPECTED, MISBEHAVIOURS

from quantkit.cli import cli

REPO = Path(__file__).resolve().parents[1]
FAST = dict(prefill_s=0.01, token_s=0.002)
CHAT_KINDS = {"choice-number", "text-number", "delta-list", "finish-number", "after-done", "no-text", "huge-chunk"}


def _load(*args) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(cli, ["load", *map(str, args), "--json"])
    data = json.loads(result.stdout) if result.exit_code == 0 else None
    return result.exit_code, data, result.output


# only the choices are read differently per API: the chat API runs the kinds that touch them
@pytest.mark.parametrize(
    "kind, api", [(k, "completions") for k in sorted(MISBEHAVIOURS)] + [(k, "chat") for k in sorted(CHAT_KINDS)]
)
def test_each_kind_of_misbehaviour_is_counted_for_its_request(kind, api, tmp_path):
    server = FakeOpenAI(misbehave=kind, bad_every=3, **FAST).start()  # requests 3, 6, 9 misbehave
    out = tmp_path / "run.json"
    try:
        code, run, output = _load(
            server.url,
            "--model",
            "m",
            "--api",
            api,
            "--concurrency",
            "2",
            "--max-requests",
            "9",
            "--gen-len",
            "6",
            "--prompt-len",
            "8",
            "--timeout",
            "0.6",
            "--out",
            out,
        )
    finally:
        server.stop()
    assert code == 0, output
    step, expected = run["steps"][0], EXPECTED[kind]
    bad = 0 if expected is None else 3
    assert step["requests"] == 9 and step["completed"] == 9 - bad, step["error_examples"]
    assert step["errors"] == {k: (bad if k == expected else 0) for k in step["errors"]}, step["error_examples"]
    if expected:
        assert step["error_examples"][expected]  # what the server did, in one line
    assert json.loads(out.read_text())["steps"] == run["steps"]


def test_the_issue_cases_exactly(tmp_path):
    """`completion_tokens: "lots"` after warm-up, and 2 of 8 tokens without [DONE]."""
    for kind, error in (("usage-lots", "stream_error"), ("closed-early", "truncated")):
        server = FakeOpenAI(misbehave=kind, bad_every=2, **FAST).start()
        try:
            code, run, output = _load(
                server.url,
                "--model",
                "m",
                "--concurrency",
                "1,2",
                "--gen-len",
                "8",
                "--max-requests",
                "6",
                "--no-stop",
                "--out",
                tmp_path / f"{kind}.json",
            )
        finally:
            server.stop()
        assert code == 0, output
        assert sum(s["errors"][error] for s in run["steps"]) == sum(s["requests"] for s in run["steps"]) // 2


def test_a_server_that_dies_mid_run_stops_the_staircase_and_keeps_the_data(tmp_path):
    server = FakeOpenAI(**FAST).start()
    threading.Timer(1.0, server.stop).start()
    out = tmp_path / "run.json"
    code, run, output = _load(
        server.url,
        "--model",
        "m",
        "--concurrency",
        "1,2,4",
        "--step-seconds",
        "0.7",
        "--gen-len",
        "4",
        "--no-stop",
        "--out",
        out,
    )
    assert code == 0, output
    assert run["stopped"] == "failing" and "no request succeeded" in run["stop_detail"]
    assert run["steps"][0]["completed"] > 0 and run["steps"][-1]["errors"]["connection"] > 0
    assert json.loads(out.read_text())["stopped"] == "failing"


def test_a_fault_inside_quantkit_still_writes_what_was_measured(tmp_path, monkeypatch):
    import quantkit.load.search as search

    calls = []

    def broken(steps, patience):
        calls.append(1)
        if len(calls) == 1:  # the saturation check after the second step
            raise RuntimeError("a bug in the analysis")
        return False

    monkeypatch.setattr(search, "should_stop", broken)
    server = FakeOpenAI(**FAST).start()
    out = tmp_path / "run.json"
    try:
        result = CliRunner().invoke(
            cli,
            [
                "load",
                server.url,
                "--model",
                "m",
                "--concurrency",
                "1,2,4",
                "--max-requests",
                "3",
                "--gen-len",
                "4",
                "--out",
                str(out),
                "--json",
            ],
        )
    finally:
        server.stop()
    assert result.exit_code == 1 and "a bug in the analysis" in result.stderr
    run = json.loads(out.read_text())
    assert run["stopped"] == "error" and "RuntimeError" in run["stop_detail"] and len(run["steps"]) == 2


def test_a_failed_warm_up_leaves_an_earlier_out_file_alone(tmp_path):
    out = tmp_path / "run.json"
    out.write_text('{"earlier": true}')
    result = CliRunner().invoke(cli, ["load", "http://127.0.0.1:9", "--model", "m", "--out", str(out)])
    assert result.exit_code == 2 and json.loads(out.read_text()) == {"earlier": True}


@pytest.mark.parametrize("where", ["."])  # a missing parent is made, as every command's output rule makes it
def test_an_unwritable_out_is_refused_before_the_run(tmp_path, where):
    start = time.monotonic()
    result = CliRunner().invoke(cli, ["load", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / where)])
    assert result.exit_code == 2 and "--out" in result.output and result.output.count("\n") == 1
    assert time.monotonic() - start < 2  # before the 5 s connect timeout


def _spawn(url: str, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-c",
        "from quantkit.cli import main; main()",
        "load",
        url,
        "--model",
        "m",
        "--gen-len",
        "16",
        "--concurrency",
        "1,2",
        "--out",
        str(out),
        *extra,
    ]
    # default SIGINT/SIGTERM dispositions, as a shell would give (see test_load_cli's Ctrl-C test)
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(proc: subprocess.Popen, text: str) -> None:
    for _ in range(40):
        line = proc.stderr.readline()
        if text in line or not line:
            break
    assert text in line, line


def test_sigterm_writes_what_was_measured_and_exits_143(tmp_path):
    server = FakeOpenAI(**FAST).start()
    out = tmp_path / "run.json"
    proc = _spawn(server.url, out, "--step-seconds", "1.5", "--no-stop")
    try:
        _wait_for(proc, "concurrency=1:")  # the first step is done and checkpointed
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        server.stop()
    assert proc.returncode == 143 and "terminated" in stderr
    run = json.loads(out.read_text())
    assert run["stopped"] == "terminated" and run["interrupted"] and len(run["steps"]) == 2
    assert run["steps"][1]["partial"] and run["steps"][1]["requests"] > 0


def test_kill_9_keeps_every_finished_step(tmp_path):
    server = FakeOpenAI(**FAST).start()
    out = tmp_path / "run.json"
    proc = _spawn(server.url, out, "--step-seconds", "1.5", "--no-stop")
    try:
        _wait_for(proc, "concurrency=1:")
        time.sleep(0.3)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        server.stop()
    run = json.loads(out.read_text())  # complete JSON: the checkpoint was written atomically
    assert run["stopped"] is None and len(run["steps"]) == 1 and run["steps"][0]["completed"] > 0
