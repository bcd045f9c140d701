"""`quantkit load` end to end against a scripted SSE server on loopback (tests/load_fixtures).

Each run is bounded by --max-requests and --step-seconds: a few seconds in all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from load_fixtures.fake_server import FakeOpenAI

from quantkit.cli import cli

REPO = Path(__file__).resolve().parents[1]
QUICK = ["--model", "m", "--gen-len", "8", "--prompt-len", "16", "--step-seconds", "2", "--max-requests", "12"]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))


@pytest.fixture
def server(request):
    srv = FakeOpenAI(**getattr(request, "param", {})).start()
    yield srv
    srv.stop()


def _load(*args) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(cli, ["load", *args, "--json"])
    data = json.loads(result.stdout) if result.exit_code == 0 else None
    return result.exit_code, data, result.output


# Tokens 40 ms apart: a sleep's overshoot on a loaded 2-core machine (a few ms) stays far below the
# 1.5x that counts as degraded, so TPOT holds at 2 in flight and only TTFT moves when requests queue.
@pytest.mark.parametrize("server", [{"token_s": 0.04}], indirect=True)
def test_closed_loop_finds_the_knee_of_a_two_slot_server(server, tmp_path):
    # 2 slots, ~0.4 s per request: 1 -> 2 concurrent doubles req/s, 4 only queues.
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    code, run, output = _load(
        server.url,
        *QUICK,
        "--concurrency",
        "1,2,4,8",
        "--slo",
        "ttft=150",
        "--out",
        str(out),
        "--plot",
        str(png),
        "--label",
        "two-slot",
    )
    assert code == 0, output
    assert run["kind"] == "load-run" and run["schema_version"] == 2 and run["label"] == "two-slot"
    assert run["stopped"] == "saturation" and len(run["steps"]) == 3  # stopped before 8
    assert run["analysis"]["knee"]["offered"] == 2
    assert run["analysis"]["degraded_first"]["first"] == "ttft"
    step = run["steps"][1]
    assert step["completed"] == 12 and step["error_count"] == 0 and step["tokens_from_usage"]
    assert step["output_tokens_mean"] == 8 and step["prompt_tokens_mean"] > 0
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert step[metric]["p50"] <= step[metric]["p90"] <= step[metric]["p99"]
    assert run["steps"][2]["goodput"]["qps"] < run["steps"][1]["goodput"]["qps"]
    assert run["client_overhead"]["parse_ms"]["n"] > 0
    assert json.loads(out.read_text())["steps"] == run["steps"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(body["max_tokens"] == 8 for body in server.bodies[1:])


def test_open_loop_poisson_rates(server):
    code, run, output = _load(server.url, *QUICK, "--rate", "2,4", "--step-seconds", "1.5")
    assert code == 0, output
    assert [s["offered"] for s in run["steps"]] == [2, 4] and run["config"]["mode"] == "rate"
    assert all(s["client"]["send_lag_ms"]["n"] == s["requests"] for s in run["steps"])
    assert run["stopped"] == "bounds" and run["analysis"]["knee"] is None


@pytest.mark.parametrize("server", [{"fail_every": 4, "hang_every": 7}], indirect=True)
def test_http_errors_and_timeouts_are_counted_not_fatal(server):
    code, run, output = _load(server.url, *QUICK, "--concurrency", "2", "--timeout", "0.5", "--max-requests", "14")
    assert code == 0, output
    step = run["steps"][0]
    assert step["errors"]["http_5xx"] >= 2 and step["timeouts"] >= 1
    assert step["completed"] + step["error_count"] == step["requests"] == 14


@pytest.mark.parametrize("server", [{"usage": False}], indirect=True)
def test_chat_api_without_usage_counts_chunks(server):
    code, run, output = _load(server.url, *QUICK, "--api", "chat", "--concurrency", "1", "--max-requests", "3")
    assert code == 0, output
    step = run["steps"][0]
    assert step["output_tokens_mean"] == 8 and not step["tokens_from_usage"]
    assert step["prompt_tokens_mean"] is None
    assert "messages" in server.bodies[-1]


def test_table_output(server):
    result = CliRunner().invoke(cli, ["load", server.url, *QUICK, "--concurrency", "1,2", "--max-requests", "3"])
    assert result.exit_code == 0, result.output
    assert "TTFT p50/p90/p99 ms" in result.stdout and "client overhead" in result.stdout


def test_unreachable_url_is_one_line_within_seconds():
    start = time.monotonic()
    result = CliRunner().invoke(cli, ["load", "http://127.0.0.1:9", "--model", "m", "--json"])
    assert result.exit_code == 2 and time.monotonic() - start < 6
    assert result.output.count("\n") == 1 and result.output.startswith("error: cannot reach http://127.0.0.1:9")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--slo", "ttft=fast"], "--slo"),
        (["--concurrency", "4,2"], "--concurrency"),
        (["--concurrency", "1", "--rate", "1"], "not both"),
        (["--api", "responses"], "--api: unknown 'responses'"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    result = CliRunner().invoke(cli, ["load", "http://127.0.0.1:9", "--model", "m", "--json", *args])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and message in result.output


def test_server_rejecting_the_warm_up_is_a_clear_error(server):
    server.fail_every = 1  # every request answers HTTP 500
    result = CliRunner().invoke(cli, ["load", server.url, "--model", "m", "--json"])
    assert result.exit_code == 2 and "warm-up request" in result.output and "HTTP 500" in result.output


def test_ctrl_c_writes_what_was_measured(server, tmp_path):
    out = tmp_path / "partial.json"
    cmd = [
        sys.executable,
        "-c",
        "from quantkit.cli import main; main()",
        "load",
        server.url,
        "--model",
        "m",
        "--gen-len",
        "16",
        "--concurrency",
        "1,2",
        "--step-seconds",
        "60",
        "--out",
        str(out),
        "--json",
    ]
    # A child inherits an ignored SIGINT (something earlier in a full pytest session leaves the
    # test process with SIGINT set to SIG_IGN, and the child then never saw Ctrl-C); a user's
    # shell starts quantkit with the default disposition, so restore it.
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # other notes (e.g. a busy-machine warning) may come first; wait for the warm-up line
        seen = [proc.stderr.readline() for _ in range(1)]
        while "warm-up ok" not in seen[-1] and seen[-1] and len(seen) < 20:
            seen.append(proc.stderr.readline())
        assert "warm-up ok" in seen[-1], seen
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)  # a loaded CI machine once took more than 20 s
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in stderr
    run = json.loads(out.read_text())
    assert run["interrupted"] and run["stopped"] == "interrupted" and json.loads(stdout)["interrupted"]
    assert run["steps"][0]["partial"] and run["steps"][0]["completed"] > 0


@pytest.mark.parametrize("server", [{"slots": 1, "prefill_s": 0.03, "token_s": 0.002}], indirect=True)
def test_search_finds_the_highest_load_within_the_slo_with_an_interval(server):
    # one slot, ~45 ms a request: TTFT ~45 ms per request ahead, so an SLO of 120 ms holds near 2 in flight
    code, run, output = _load(
        server.url, "--model", "m", "--gen-len", "8", "--prompt-len", "16", "--step-seconds", "30",
        "--max-requests", "40", "--concurrency", "1,16", "--search", "--repeats", "2", "--slo", "ttft=120",
    )  # fmt: skip
    assert code == 0, output
    assert run["stopped"] == "search"
    phases = [s["phase"] for s in run["steps"]]
    assert phases[0] == "bracket" and "measure" in phases and len(run["steps"]) <= 10
    knee = run["analysis"]["slo_knee"]
    assert knee["censored"] is None and 1 <= knee["knee"] < 4
    low, high = knee["ci95"]
    assert low is None or low <= knee["knee"]
    assert high is None or knee["knee"] <= high
    around = [lv for lv in knee["levels"] if lv["steps"] == 2]
    assert len(around) == 2 and [lv["meets_slo"] for lv in around] == [True, False]
    assert all(lv["p99_is_near_max"] for lv in knee["levels"])  # 40 or 80 requests: below 102


def test_search_needs_bounds_and_an_slo(server):
    code, _, output = _load(server.url, *QUICK, "--concurrency", "1,2,4", "--search", "--slo", "ttft=100")
    assert code == 2 and "two bounds" in output
    code, _, output = _load(server.url, *QUICK, "--concurrency", "1,4", "--search")
    assert code == 2 and "--slo" in output
