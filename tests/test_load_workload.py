"""quantkit.load.workload: prompt-length distributions, a shared prefix, multi-turn chat; end to end
against the loopback stub server (which reports prefix-cache hits and its context like vLLM or llama.cpp)."""

from __future__ import annotations

import json
import random
import statistics

import pytest
from click.testing import CliRunner
from load_fixtures.fake_server import FakeOpenAI

from quantkit.cli import cli
from quantkit.load.workload import (
    LengthSpec,
    RequestSource,
    Workload,
    WorkloadError,
    build_workload,
    check_fits,
    parse_prompt_len,
)

FAST = dict(prefill_s=0.005, token_s=0.001)
BASE = ["--model", "m", "--gen-len", "4", "--max-requests", "12", "--step-seconds", "5"]


def _load(server, *args) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(cli, ["load", server.url, *BASE, *map(str, args), "--json"])
    return result.exit_code, (json.loads(result.stdout) if result.exit_code == 0 else None), result.output


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("128", LengthSpec(128, 128)),
        (64, LengthSpec(64, 64)),
        ("64:256", LengthSpec(64, 256)),
        ("256,long=0.1x4", LengthSpec(256, 256, 0.1, 4.0)),
        ("64:256, long=0.05x2.5", LengthSpec(64, 256, 0.05, 2.5)),
    ],
)
def test_prompt_len_syntax(spec, expected):
    assert parse_prompt_len(spec) == expected
    assert parse_prompt_len(expected.describe()) == expected  # the JSON's spec string reads back


@pytest.mark.parametrize(
    "spec",
    [
        "0",
        "-5",
        "256:64",
        "abc",
        "1:2:3",
        "256,long=0.1",
        "256,long=2x4",
        "256,long=0x4",
        "256,long=0.1x1",
        "256,long=0.1x0.5",
        "256,short=0.1x4",
        "256,long=.x4",
        "256,",
        "1e3",
    ],
)
def test_bad_prompt_len_is_one_line(spec):
    with pytest.raises(WorkloadError, match="--prompt-len") as caught:
        parse_prompt_len(spec)
    assert "\n" not in str(caught.value)


def test_lengths_follow_the_distribution():
    rng = random.Random(0)
    uniform = [LengthSpec(64, 256).draw(rng) for _ in range(4000)]
    assert min(uniform) == 64 and max(uniform) == 256 and statistics.mean(uniform) == pytest.approx(160, abs=4)
    mixed = [LengthSpec(256, 256, 0.1, 4).draw(rng) for _ in range(4000)]
    assert set(mixed) == {256, 1024} and mixed.count(1024) / 4000 == pytest.approx(0.1, abs=0.02)


def test_requests_are_reproducible_and_share_exactly_the_prefix():
    workload = Workload(LengthSpec(8, 32), shared_prefix=50, turns=1)
    a, b = RequestSource(workload, 7), RequestSource(workload, 7)
    first = [a.next().messages for _ in range(20)]
    assert first == [b.next().messages for _ in range(20)]
    systems = {m[0]["content"] for m in first}
    assert len(systems) == 1 and len(systems.pop().split()) == 50 and first[0][0]["role"] == "system"
    users = [m[1]["content"] for m in first]
    assert len(set(users)) == 20 and all(7 <= len(u.split()) <= 31 for u in users)  # "Request N:" = 2 words, 3 tokens
    assert RequestSource(workload, 8).next().messages[0] != first[0][0]  # another seed, another prefix
    assert a.warm_up()[0] == first[0][0] and a.warm_up()[1]["content"] not in users


def test_conversations_resend_everything_and_end_after_k_turns():
    source = RequestSource(Workload(LengthSpec(4, 4), shared_prefix=0, turns=3), 0)
    t1 = source.next()
    assert t1.turn == 1 and [m["role"] for m in t1.messages] == ["user"]
    source.answered(t1, True, "answer one")
    other = source.next()  # a second worker takes the conversation that is waiting
    assert other.conversation is t1.conversation and other.turn == 2
    assert [m["role"] for m in other.messages] == ["user", "assistant", "user"]
    assert other.messages[1]["content"] == "answer one" and other.messages[0] == t1.messages[0]
    fresh = source.next()  # nothing idle: a new conversation
    assert fresh.conversation.index == 2 and fresh.turn == 1
    source.answered(other, True, "answer two")
    last = source.next()
    assert last.turn == 3 and len(last.messages) == 5 and last.words > other.words
    source.answered(last, True, "done")
    source.answered(fresh, False, None)  # a failed turn ends its conversation
    assert source.next().conversation.index == 3


def test_workload_checks():
    with pytest.raises(WorkloadError, match="--api chat"):
        build_workload("16", 0, 2, "completions")
    with pytest.raises(WorkloadError, match="--turns"):
        build_workload("16", 0, 0, "chat")
    with pytest.raises(WorkloadError, match="--shared-prefix"):
        build_workload("16", -1, 1, "chat")
    w = build_workload("100", 400, 1, "completions")
    check_fits(w, 64, None, None)  # context unknown: nothing to check
    check_fits(w, 64, 1024, "x")
    with pytest.raises(WorkloadError, match="longer than the server's context"):
        check_fits(w, 64, 400, "/v1/models max_model_len")
    with pytest.raises(WorkloadError, match="does not fit"):
        check_fits(build_workload("100,long=0.1x4", 0, 3, "chat"), 64, 1024, "x")


def test_shared_prefix_is_served_from_the_cache():
    server = FakeOpenAI(cache="usage", **FAST).start()
    try:
        code, run, output = _load(
            server,
            "--concurrency",
            "1,2",
            "--shared-prefix",
            "64",
            "--prompt-len",
            "16",
            "--no-stop",
            "--keep-requests",
        )
        code2, plain, output2 = _load(server, "--concurrency", "1", "--prompt-len", "16")
    finally:
        server.stop()
    assert code == 0 and code2 == 0, output + output2
    assert run["config"]["workload"] == {
        "prompt_len": {"low": 16, "high": 16, "long_fraction": 0.0, "long_factor": 1.0},
        "shared_prefix": 64,
        "turns": 1,
        "name": "synthetic",
        "prompt_len_spec": "16",
    }
    for step in run["steps"]:
        assert step["cached_tokens_mean"] >= 64 and step["prompt_tokens_mean"] == pytest.approx(64 + 16, abs=1)
        assert step["cache_hit_fraction"] == pytest.approx(64 / 80, abs=0.03)
    records = [r for step in run["requests"] for r in step]
    assert all(r["cached_tokens"] >= 64 and r["prompt_tokens"] >= 79 for r in records)
    assert plain["steps"][0]["cache_hit_fraction"] < 0.1  # unique prompts: only "Request" is shared


def test_llama_cpp_style_timings_are_read_as_cache_hits():
    server = FakeOpenAI(cache="timings", **FAST).start()
    try:
        code, run, output = _load(server, "--concurrency", "1", "--shared-prefix", "32", "--prompt-len", "8")
    finally:
        server.stop()
    assert code == 0, output
    assert run["steps"][0]["cached_tokens_mean"] >= 32 and run["steps"][0]["prompt_tokens_mean"] > 32


@pytest.mark.parametrize("mode", [["--concurrency", "2"], ["--rate", "20"]])
def test_multi_turn_chat_against_the_stub(mode):
    server = FakeOpenAI(cache="usage", **FAST).start()
    try:
        code, run, output = _load(
            server,
            *mode,
            "--api",
            "chat",
            "--turns",
            "3",
            "--prompt-len",
            "8",
            "--shared-prefix",
            "16",
            "--keep-requests",
        )
    finally:
        server.stop()
    assert code == 0, output
    bodies = server.bodies[1:]  # after the warm-up
    lengths = [len(b["messages"]) for b in bodies]
    assert set(lengths) <= {2, 4, 6} and 6 in lengths  # system + user, then +assistant +user per turn
    third = next(b for b in bodies if len(b["messages"]) == 6)["messages"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2]["content"] == " t0 t1 t2 t3"  # the server's own answer, resent
    records = run["requests"][0]
    assert {r["turn"] for r in records} == {1, 2, 3}
    by_turn = {t: statistics.mean(r["prompt_tokens"] for r in records if r["turn"] == t) for t in (1, 2, 3)}
    assert by_turn[1] < by_turn[2] < by_turn[3]
    assert statistics.mean(r["cached_tokens"] for r in records if r["turn"] == 3) > by_turn[2] - 1
    assert run["config"]["workload"]["turns"] == 3


def test_long_prompt_fraction_is_sent():
    server = FakeOpenAI(**FAST).start()
    try:
        code, run, output = _load(
            server,
            "--concurrency",
            "4",
            "--max-requests",
            "200",
            "--prompt-len",
            "20:40,long=0.25x4",
            "--keep-requests",
        )
    finally:
        server.stop()
    assert code == 0, output
    words = [r["prompt_words"] for r in run["requests"][0]]
    long = [w for w in words if w > 45]
    assert (
        0.15 < len(long) / len(words) < 0.35 and max(words) < 160 and min(words) >= 19
    )  # "Request N:" is 2 words, 3 tokens


@pytest.mark.parametrize("context_at", ["models", "props"])
@pytest.mark.parametrize(
    "args, message",
    [
        (["--shared-prefix", "600"], "--shared-prefix 600 is longer than the server's context (512 tokens"),
        (["--api", "chat", "--turns", "4", "--prompt-len", "120"], "does not fit the server's context (512"),
        (["--prompt-len", "128,long=0.1x8"], "does not fit"),
    ],
)
def test_a_workload_the_server_cannot_hold_is_refused(context_at, args, message):
    server = FakeOpenAI(context=512, context_at=context_at, **FAST).start()
    try:
        code, _, output = _load(server, *args)
    finally:
        server.stop()
    assert code == 2 and output.count("\n") == 1 and message in output, output
    assert ("/props n_ctx" if context_at == "props" else "/v1/models max_model_len") in output
    assert server.bodies == []  # refused before any request


def test_context_len_overrides_and_bad_flags():
    server = FakeOpenAI(context=4096, **FAST).start()
    try:
        code, _, output = _load(server, "--shared-prefix", "600", "--context-len", "512")
        assert code == 2 and "512 tokens, --context-len" in output
        code, run, output = _load(server, "--shared-prefix", "600", "--concurrency", "1")
        assert code == 0 and run["server_context"] == {"tokens": 4096, "source": "/v1/models max_model_len"}
        for bad, text in (
            (["--turns", "2"], "--api chat"),
            (["--context-len", "0"], "--context-len"),
            (["--prompt-len", "9:3"], "--prompt-len"),
        ):
            code, _, output = _load(server, *bad)
            assert code == 2 and output.count("\n") == 1 and text in output, output
    finally:
        server.stop()


def test_session_header_names_conversations_and_headers_stay_out_of_the_json():
    server = FakeOpenAI(**FAST).start()
    try:
        code, run, output = _load(
            server,
            "--concurrency",
            "2",
            "--api",
            "chat",
            "--turns",
            "2",
            "--prompt-len",
            "8",
            "--session-header",
            "x-session-id",
            "--header",
            "Authorization: Bearer s3cret",
        )
        bad = [_load(server, "--header", "no colon")[0], _load(server, "--session-header", "bad name")[0]]
    finally:
        server.stop()
    assert code == 0, output
    seen = server.headers_seen[1:13]  # the staircase's requests
    assert all(h["Authorization"] == "Bearer s3cret" for h in seen)
    sessions = [h["x-session-id"] for h in seen]
    assert len(set(sessions)) == 6 and all(sessions.count(s) == 2 for s in sessions)  # 2 turns per conversation
    assert "s3cret" not in json.dumps(run) and run["config"]["headers"] == {"Authorization": "<not recorded>"}
    assert bad == [2, 2]
