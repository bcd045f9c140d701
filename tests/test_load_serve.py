"""`quantkit load` against a real OpenAI-compatible engine: `transformers serve` on loopback.

The server runs a tiny random Llama built here (no download). A server that crashes or never gets
ready fails the tests, with its last words; they skip only where the `transformers[serving]` extra
was never installed (installed.py: never after scripts/_install.sh, which installs it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner
from installed import require_serving
from load_fixtures.tiny_model import build_tiny_model

from quantkit.cli import cli

pytestmark = pytest.mark.serve
READY_TIMEOUT_S = 180  # importing torch + transformers on a busy 2-core runner takes 20-40 s


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, log) -> str | None:
    """None when /health answers 200; otherwise why the server is not usable."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"`transformers serve` exited with {proc.returncode}: {log.read_text()[-400:]}"
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return None
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    return f"`transformers serve` not ready within {READY_TIMEOUT_S} s: {log.read_text()[-400:]}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_serving()
    root = tmp_path_factory.mktemp("serve")
    model = build_tiny_model(root / "tiny")
    port, log = _free_port(), root / "server.log"
    cmd = [
        sys.executable,
        "-c",
        "from transformers.cli.transformers import main; main()",
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    # one intra-op thread: on a shared 2-core runner two threads oversubscribe and crawl (docs/LOAD.md)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        reason = _wait_ready(proc, url, log)
        if reason:
            pytest.fail(reason, pytrace=False)
        yield url, str(model)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_staircase_against_transformers_serve(served, tmp_path):
    url, model = served
    out = tmp_path / "run.json"
    result = CliRunner().invoke(
        cli,
        [
            "load",
            url,
            "--model",
            model,
            "--engine",
            "transformers",
            "--concurrency",
            "1,2",
            "--prompt-len",
            "16",
            "--gen-len",
            "8",
            "--step-seconds",
            "10",
            "--max-requests",
            "4",
            "--timeout",
            "30",
            "--slo",
            "ttft=2000,tpot=500",
            "--no-stop",
            "--keep-requests",
            "--out",
            str(out),
            "--plot",
            str(tmp_path / "run.png"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    assert run["kind"] == "load-run" and run["stopped"] == "bounds"
    assert run["prompt_tokens_reported"] > 0
    assert [s["offered"] for s in run["steps"]] == [1, 2]
    for step in run["steps"]:
        assert step["requests"] == 4 and step["completed"] == 4, step["errors"]
        assert step["tokens_from_usage"] and step["output_tokens_mean"] == 8  # min_new_tokens held EOS back
        assert step["achieved_qps"] > 0 and step["output_tokens_per_s"] > 0
        assert 0 < step["ttft_ms"]["p50"] <= step["ttft_ms"]["p99"] <= step["e2e_ms"]["p99"]
        assert step["tpot_ms"]["n"] == 4 and step["goodput"]["fraction"] is not None
    assert len(run["requests"]) == 2 and len(run["requests"][0]) == 4
    assert (tmp_path / "run.png").stat().st_size > 1000


def test_chat_endpoint_streams_too(served):
    url, model = served
    result = CliRunner().invoke(
        cli,
        [
            "load",
            url,
            "--model",
            model,
            "--engine",
            "transformers",
            "--api",
            "chat",
            "--concurrency",
            "1",
            "--prompt-len",
            "8",
            "--gen-len",
            "4",
            "--max-requests",
            "2",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    step = json.loads(result.stdout)["steps"][0]
    assert step["completed"] == 2 and step["output_tokens_mean"] == 4


def test_wrong_model_name_is_a_clear_error(served):
    url, _ = served
    result = CliRunner().invoke(cli, ["load", url, "--model", "not-this-one", "--engine", "transformers", "--json"])
    errors = [line for line in result.output.splitlines() if not line.startswith("warning:")]
    assert result.exit_code == 2 and len(errors) == 1  # a warning on shared cores may come first
    assert "warm-up request" in result.output and "HTTP 400" in result.output


def test_multi_turn_chat_with_a_shared_prefix(served):
    """The workload shapes against a real chat template: a system prompt, resent turns, growing prompts."""
    url, model = served
    result = CliRunner().invoke(
        cli,
        [
            "load",
            url,
            "--model",
            model,
            "--engine",
            "transformers",
            "--api",
            "chat",
            "--concurrency",
            "1",
            "--turns",
            "2",
            "--shared-prefix",
            "24",
            "--prompt-len",
            "6:10",
            "--gen-len",
            "4",
            "--max-requests",
            "4",
            "--timeout",
            "30",
            "--keep-requests",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    records = run["requests"][0]
    assert all(r["error"] is None for r in records) and [r["turn"] for r in records] == [1, 2, 1, 2]
    assert records[1]["prompt_tokens"] > records[0]["prompt_tokens"] + 4  # turn 2 resent turn 1 and its answer
    assert run["config"]["workload"]["shared_prefix"] == 24


def test_a_lever_study_against_transformers_serve(tmp_path):
    """`quantkit levers` starts the real server per lever (batching off, then on) and stops it."""
    import yaml

    require_serving()
    model = build_tiny_model(tmp_path / "tiny")
    study = {
        "name": "tiny-cb",
        "server": {
            "engine": "transformers-serve",
            "model": str(model),
            "ready_timeout_s": READY_TIMEOUT_S,
            "settings": {"device": "cpu", "cb_block_size": 16, "cb_num_blocks": 64, "cb_max_batch_tokens": 128},
            "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
        },
        "load": {
            "concurrency": "1,2",
            "prompt_len": 8,
            "gen_len": 4,
            "max_requests": 2,
            "timeout": 60,
            "no_stop": True,
        },
        "levers": [{"name": "no-cb"}, {"name": "cb", "settings": {"continuous_batching": True}}],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    result = CliRunner().invoke(cli, ["levers", str(path), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output  # a server that crashed or never got ready is a failure
    data = json.loads(result.stdout)
    assert [row["lever"] for row in data["table"]] == ["no-cb", "cb"]
    for run in data["runs"]:
        assert all(step["completed"] == 2 for step in run["steps"]), run["steps"]
        assert run["server"]["exit_code"] is not None  # stopped
    assert "--continuous-batching" in data["runs"][1]["server"]["command"]
    assert "--continuous-batching" not in data["runs"][0]["server"]["command"]
