"""llama.cpp's llama-server in a lever study: the flags its levers become, what its stream reports
(cached prompt tokens, speculative drafts), a client that survives its dropped connections, and one
study against the real server the install built (fails, not skips, where the install built it)."""

from __future__ import annotations

import json
import re
import socketserver
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from installed import llama_tool

from quantkit.cli import cli
from quantkit.load.lever_records import LeverStudy
from quantkit.load.load_stats import speculation
from quantkit.load.request_timings import RequestRecord
from quantkit.load.runfile import LoadRun
from quantkit.load.servers import SERVERS, lever_args
from quantkit.load.sse import MalformedChunk, apply_chunk, finish_record
from quantkit.load.step_record import Latency, Step

# ---------------------------------------------------------------- a server that drops its connections

CLOSE_AFTER_S = 0.3  # long enough that a client reusing the connection has sent its next request


class _DropsAfterStream(socketserver.StreamRequestHandler):
    """HTTP/1.1 with keep-alive announced, as llama-server answers: GETs keep the connection, and
    after a streamed answer the server closes it without saying so (a moment later)."""

    def handle(self) -> None:
        while True:
            line = self.rfile.readline()
            if not line.strip():
                return
            method, path = line.decode().split()[:2]
            headers = {}
            while header := self.rfile.readline().strip():
                name, _, value = header.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            self.rfile.read(int(headers.get("content-length", 0)))
            if method == "GET":
                self._json({"status": "ok"} if path == "/health" else {"default_generation_settings": {"n_ctx": 4096}})
                continue
            self._stream()
            if headers.get("connection", "").lower() != "close":
                time.sleep(CLOSE_AFTER_S)
            return  # the connection closes, announced or not

    def _json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5, max=100\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )

    def _stream(self) -> None:
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Keep-Alive: timeout=5, max=100\r\n\r\n"
        )
        final = {
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": 2},
        }
        for event in ({"choices": [{"index": 0, "text": " a"}]}, {"choices": [{"index": 0, "text": " b"}]}, final):
            self._chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


@pytest.fixture
def dropping_server():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _DropsAfterStream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("engine, dropped", [("llamacpp", False), ("openai", True)])
def test_llama_server_engine_opens_a_connection_per_request(cli, dropping_server, engine, dropped):
    """--engine llamacpp never sends a request on a connection llama-server is about to drop; a client
    that reuses connections (--engine openai) loses requests to it, which shows the server drops them."""
    code, _, stderr, run = cli(
        "load",
        dropping_server,
        "--model",
        "m",
        "--engine",
        engine,
        "--concurrency",
        "1",
        "--prompt-len",
        "4",
        "--gen-len",
        "2",
        "--max-requests",
        "6",
        "--timeout",
        "10",
        "--json",
    )
    assert code == 0, stderr
    step = run["steps"][0]
    assert step["requests"] == 6
    if dropped:
        assert step["errors"]["connection"] > 0 and "disconnected" in step["error_examples"]["connection"].lower()
    else:
        assert step["completed"] == 6 and step["error_count"] == 0, step["error_examples"]


# ---------------------------------------------------------------- levers -> flags, the stream -> records


def test_a_draft_model_turns_speculative_decoding_on():
    kind = SERVERS["llama-server"]
    args, body = lever_args(kind, {"model_draft": "/d.gguf", "draft_max": 8, "parallel": 4}, "x")
    assert args == [
        "--model-draft",
        "/d.gguf",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "8",
        "--parallel",
        "4",
    ]
    assert body == {} and all(key.here for key in kind.keys.values())  # every llama-server lever runs on a CPU


@pytest.mark.parametrize("engine", ["llama-server", "vllm"])
def test_sampling_settings_are_request_fields(engine):
    """Temperature and seed go in every request's body, where any OpenAI-compatible server reads them."""
    args, body = lever_args(SERVERS[engine], {"temperature": 0, "seed": 7}, "x")
    assert args == [] and body == {"temperature": 0, "seed": 7}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"temperature": "hot"}, "x.settings.temperature: 'hot' is not a finite number"),
        ({"temperature": -0.5}, "x.settings.temperature: -0.5 is not at least 0"),
        ({"temperature": float("nan")}, "is not a finite number"),
        ({"temperature": True}, "is not a finite number"),
        ({"seed": 1.5}, "x.settings.seed: 1.5 is not a whole number of at least 0"),
        ({"seed": "7"}, "is not a whole number of at least 0"),
    ],
)
def test_a_sampling_setting_no_server_takes_is_refused_before_it_starts(settings, message):
    from quantkit.load.servers import StudyError

    for engine in ("llama-server", "vllm"):
        with pytest.raises(StudyError, match=re.escape(message)):
            lever_args(SERVERS[engine], settings, "x")


def test_every_llama_server_lever_is_a_flag_of_the_installed_server():
    """What a study's llama-server settings become (each flag, and the flags one needs beside it) is
    in the built llama-server's --help, so no lever fails at start-up for a flag this build lacks."""
    from quantkit.gguf import tools

    llama_tool("llama-server")
    proc = tools.run("llama-server", ["--help"], timeout=60)
    flags = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", proc.stdout + proc.stderr))
    keys = SERVERS["llama-server"].keys.values()
    wanted = {flag for key in keys for flag in (key.flag, *key.also) if flag and flag.startswith("--")}
    wanted |= {"--no-" + key.flag.removeprefix("--") for key in keys if key.flag and key.style == "pair"}
    assert wanted and wanted <= flags, sorted(wanted - flags)


def test_a_missing_draft_model_is_refused_before_a_server_starts(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    study = {
        "name": "s",
        "server": {"engine": "llama-server", "model": str(model)},
        "levers": [{"name": "base"}, {"name": "spec", "settings": {"model_draft": str(tmp_path / "gone.gguf")}}],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    result = CliRunner().invoke(cli, ["levers", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "levers[1] (spec).settings.model_draft" in result.stderr and "gone.gguf is not a file" in result.stderr
    assert not list((tmp_path / "out").glob("*.server.log"))  # no server was started


def _final(timings: dict) -> dict:
    return {
        "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 32}},
        "timings": {"cache_n": 32, "prompt_n": 8, **timings},
    }


def _record(final: dict) -> RequestRecord:
    rec = RequestRecord(t_send=0.0)
    apply_chunk(rec, {"choices": [{"index": 0, "text": " x"}]}, "completions", 0.1)
    apply_chunk(rec, final, "completions", 0.2)
    return finish_record(rec, 0.3)


@pytest.mark.parametrize("drafted, accepted", [(12, 9), (4, 0), (0, 0)])
def test_speculative_drafts_are_read_from_the_stream(drafted, accepted):
    rec = _record(_final({"draft_n": drafted, "draft_n_accepted": accepted}))
    assert rec.ok and (rec.draft_tokens, rec.draft_accepted) == (drafted, accepted) and rec.cached_tokens == 32


def test_a_server_that_does_not_speculate_reports_no_drafts():
    rec = _record(_final({}))
    assert (
        rec.ok
        and rec.draft_tokens is None
        and speculation([rec]) == {"draft_tokens_mean": None, "draft_acceptance": None}
    )


def test_more_accepted_than_drafted_is_a_stream_error():
    rec = _record(_final({"draft_n": 4, "draft_n_accepted": 5}))
    assert rec.error == "stream_error" and "accepted draft tokens (5) exceed the drafted (4)" in rec.detail


@pytest.mark.parametrize(
    "timings",
    [
        {"draft_n": -1, "draft_n_accepted": 0},
        {"draft_n": 3, "draft_n_accepted": "2"},
        {"draft_n": 2.5, "draft_n_accepted": 1},
    ],
)
def test_draft_counts_that_are_not_token_counts_break_the_stream(timings):
    with pytest.raises(MalformedChunk, match="not a token count"):  # the client counts it as a stream_error
        _record(_final(timings))


def test_acceptance_is_summed_over_requests():
    recs = [_record(_final({"draft_n": d, "draft_n_accepted": a})) for d, a in ((10, 9), (30, 3))]
    spec = speculation(recs)
    assert spec["draft_tokens_mean"] == 20 and spec["draft_acceptance"] == pytest.approx(12 / 40)


# ---------------------------------------------------------------- the real llama-server


@pytest.fixture(scope="module")
def tiny_gguf(tiny_dir, tmp_path_factory) -> Path:
    """The tiny llama fixture as an F16 GGUF (quantkit export)."""
    root = tmp_path_factory.mktemp("llama-server")
    out = root / "tiny-f16.gguf"
    result = CliRunner().invoke(
        cli,
        ["export", str(tiny_dir / "llama-gqa"), "--format", "gguf", "--out", str(out)],
        env={"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"},
    )
    assert result.exit_code == 0, result.output
    return out


def test_a_lever_study_against_llama_server(tiny_gguf, tmp_path):
    """Every lever of the built-in study's kind on the real server: slots, the prompt cache as a
    request field, speculative decoding (the model as its own draft); each server stopped."""
    llama_tool("llama-server")
    study = {
        "name": "tiny-llama-server",
        "server": {
            "engine": "llama-server",
            "model": str(tiny_gguf),
            "ready_timeout_s": 60,
            # greedy: the random model's answer to each seeded prompt is the same on every run (sampled, one
            # in some hundreds is byte tokens llama-server holds back as unfinished UTF-8: no text at all)
            "settings": {"threads": 1, "ctx_size": 512, "parallel": 1, "temperature": 0},
        },
        "load": {
            "concurrency": "1,2",
            "shared_prefix": 32,
            "prompt_len": 8,
            "gen_len": 8,
            "max_requests": 4,
            "timeout": 60,
            "no_stop": True,
            "repeats": 1,
        },
        "levers": [
            {"name": "one-slot"},
            {"name": "two-slots", "settings": {"parallel": 2}},
            {"name": "no-prompt-cache", "settings": {"cache_prompt": False}},
            {"name": "speculative", "settings": {"model_draft": str(tiny_gguf)}},
        ],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    result = CliRunner().invoke(cli, ["levers", str(path), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output  # a server that crashed or never got ready is a failure
    data = json.loads(result.stdout)
    runs = {run["label"]: run for run in data["runs"]}
    for run in runs.values():
        found = [(s["completed"], s["error_count"]) for s in run["steps"]]
        assert found == [(4, 0), (4, 0)], (run["label"], [s.get("error_examples") for s in run["steps"]])
        assert run["server"]["exit_code"] is not None and run["steps"][0]["tokens_from_usage"]
    rows = {row["lever"]: row for row in data["table"]}
    assert rows["one-slot"]["first_cache_hit"] > 0.3 and rows["no-prompt-cache"]["first_cache_hit"] == 0
    assert runs["two-slots"]["server_context"] == {"tokens": 256, "source": "/props n_ctx"}  # the slots split ctx_size
    assert rows["speculative"]["changes"] == f"model_draft={tiny_gguf.name}"  # a file by its name
    assert (
        rows["speculative"]["first_draft_acceptance"] is not None and rows["one-slot"]["first_draft_acceptance"] is None
    )
    assert all(s["draft_tokens_mean"] > 0 for s in runs["speculative"]["steps"])
    # TTFT split per answer from the server's own timings (the tiny model decodes its 8 tokens in about
    # a millisecond, so they reach the client in one read and `other` is not small: the demo's run is
    # where the parts are checked against TTFT, benchmarks/load_parts.py)
    for run in runs.values():
        for step in run["steps"]:
            found = step["ttft_parts"]
            assert found["per_request"] and found["n"] == 4 and "llama-server" in found["source"]["prefill_ms"]
            assert found["prefill_ms"]["mean"] > 0 and found["queue_ms"]["mean"] >= 0


# ---------------------------------------------------------------- the prefix reference against a cache-off lever


def _run(label: str, prefix: int, ttft_ms: float) -> LoadRun:
    config = {"mode": "concurrency", "workload": {"shared_prefix": prefix, "prompt_len": {"low": 32}}}
    steps = [Step(offered=1, ttft_ms=Latency(p50=ttft_ms))]
    return LoadRun(label=label, config=config, steps=steps, levels=[], analysis=None, stopped=None)


def test_the_prefix_is_set_against_the_lever_that_turns_the_cache_off(monkeypatch):
    """llama-server caches prompts by default: the baseline of the prefix reference is the cache-off
    lever, wherever it stands, not the first."""
    import quantkit.bench.probe as probe
    from quantkit.core.hardware import Device
    from quantkit.load.levers_report import prefix_reference

    monkeypatch.setattr(probe, "cached_probe", lambda device: Device("test", 1e10, 1e11, "test"))
    runs = [_run("one-slot", 256, 50.0), _run("four-slots", 256, 60.0), _run("no-prompt-cache", 256, 200.0)]
    ref = prefix_reference("smollm2-135m", runs, base=2).to_json()
    rows = {row["lever"]: row for row in ref["levers"]}
    assert ref["baseline"] == "no-prompt-cache" and rows["no-prompt-cache"]["ttft_ratio"] == 1.0
    assert rows["one-slot"]["ttft_ratio"] == pytest.approx(0.25) and rows["one-slot"]["saved_ms"] == pytest.approx(
        150.0
    )
    assert 0 < rows["one-slot"]["roofline_ttft_ratio"] < 1


def _study(tmp_path: Path, baseline: str) -> Path:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    shape = tmp_path / "shape"
    shape.mkdir(exist_ok=True)
    (shape / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    study = {
        "name": "s",
        "server": {"engine": "llama-server", "model": str(model)},
        "levers": [{"name": "one-slot"}, {"name": "no-prompt-cache", "settings": {"cache_prompt": False}}],
        "reference": {"shape": str(shape), "baseline": baseline},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_a_reference_baseline_names_a_lever(tmp_path):
    ok = CliRunner().invoke(cli, ["levers", str(_study(tmp_path, "no-prompt-cache")), "--dry-run"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(cli, ["levers", str(_study(tmp_path, "no-cache")), "--dry-run"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
    assert "reference.baseline: no lever is named 'no-cache'; levers: one-slot, no-prompt-cache" in bad.stderr


def test_no_prefix_reference_before_its_baseline_has_run(tmp_path, monkeypatch):
    """study.json is rewritten after every lever: until the cache-off lever has run there is nothing to set against."""
    import quantkit.bench.probe as probe
    from quantkit.core.hardware import Device
    from quantkit.load.levers_report import summarize
    from quantkit.load.study import read_study

    monkeypatch.setattr(probe, "cached_probe", lambda device: Device("test", 1e10, 1e11, "test"))
    study = read_study(_study(tmp_path, "no-prompt-cache"))
    runs = [json.loads((Path(__file__).parent / "load_fixtures" / "attribution_nocb.json").read_text())]
    runs[0]["label"] = "one-slot"
    runs[0]["config"]["workload"] = {"shared_prefix": 256, "prompt_len": {"low": 32}}

    def summarized(runs: list[dict]) -> dict:
        result = LeverStudy(name=study.name, source="study.yaml", created="", study={})
        result.runs = [LoadRun.from_json(run, run["label"]) for run in runs]
        summarize(study, result)
        return result.to_json()

    assert "prefix_reference" not in summarized(runs)
    runs.append({**runs[0], "label": "no-prompt-cache"})
    assert summarized(runs)["prefix_reference"]["baseline"] == "no-prompt-cache"
