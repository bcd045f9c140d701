"""quantkit.load.named_workloads: the built-in workloads (agent, long-short, copy) from the shipped texts, their
specs, and what the client sends for each; statistics per class; the admission gate; priorities."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from load_fixtures.fake_server import FakeOpenAI

from quantkit.cli import cli
from quantkit.load.named_workloads import Agent, Copy, LongShort, factbook, parse_named
from quantkit.load.workload import WorkloadError

FAST = {"prefill_s": 0.01, "token_s": 0.002}


def _load(server, *args) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(cli, ["load", server.url, "--model", "m", "--gen-len", "4", *args, "--json"])
    return result.exit_code, (json.loads(result.stdout) if result.exit_code == 0 else None), result.output


def test_specs_parse_and_refuse_with_one_line():
    assert parse_named("long-short") == LongShort()
    assert parse_named("long-short:short=32,fraction=0.25") == LongShort(short=32, fraction=0.25)
    assert parse_named("copy:passage=64").describe() == "copy:passage=64"
    for bad, what in [
        ("chat", "unknown"),
        ("copy:length=3", "takes passage"),
        ("long-short:fraction=1.5", "between 0 and 1"),
        ("agent:turns=x", "must be a number"),
        ("long-short:factor=1", "2 or more"),
    ]:
        with pytest.raises(WorkloadError, match=what):
            parse_named(bad)


def test_the_texts_are_real_and_the_sources_reproducible():
    entries = factbook()
    assert len(entries) > 200 and entries[0][0] == "Algeria" and "Numidians" in entries[0][1]
    a, b = LongShort().source(3), LongShort().source(3)
    turns = [a.next() for _ in range(50)]
    assert [t.messages for t in turns] == [b.next().messages for _ in range(50)]
    classes = [t.cls for t in turns]
    assert set(classes) == {"short", "long"} and 1 <= classes.count("long") <= 12  # 10% of 50, seeded
    short = next(t for t in turns if t.cls == "short").words
    long = next(t for t in turns if t.cls == "long").words
    assert 12 < long / short < 18  # 16x the passage, the instruction besides


def test_agent_sessions_grow_their_prefix_turn_by_turn():
    source = Agent(turns=3).source(0)
    first = source.next()
    system = first.messages[0]
    assert (
        system["role"] == "system"
        and "Worked examples" in system["content"]
        and "TOOL:" in first.messages[1]["content"]
    )
    source.answered(first, True, "an answer")
    second = source.next()
    assert second.conversation is first.conversation and second.turn == 2
    assert second.messages[:2] == first.messages and second.messages[2] == {"role": "assistant", "content": "an answer"}
    other = Agent(turns=3).source(0).next()
    assert other.messages[0] == system  # one system prompt for every session


def test_copy_tasks_hold_their_passage_and_ask_for_greedy_answers():
    source = Copy(passage=64).source(1)
    texts = [source.next().messages[0]["content"] for _ in range(12)]
    assert any(t.startswith("Repeat the following passage") for t in texts)
    assert any(t.startswith("Fix the spelling") for t in texts)
    assert Copy.body == {"temperature": 0}


def test_long_short_statistics_per_class_and_the_request_priority():
    server = FakeOpenAI(slots=1, **FAST).start()
    try:
        code, run, output = _load(
            server, "--workload", "long-short:short=16,fraction=0.3", "--concurrency", "2",
            "--max-requests", "30", "--class-priority", "short=0,long=1",
        )  # fmt: skip
    finally:
        server.stop()
    assert code == 0, output
    classes = run["steps"][0]["classes"]
    assert set(classes) == {"short", "long"} and sum(c["requests"] for c in classes.values()) == 30
    assert classes["long"]["ttft_ms"]["n"] == classes["long"]["completed"] > 0
    assert run["config"]["workload"]["spec"] == "long-short:short=16,factor=16,fraction=0.3"
    bodies = server.bodies[1:]
    assert {b["priority"] for b in bodies} == {0, 1}
    words = {b["priority"]: len(b["prompt"].split()) for b in bodies}
    assert words[1] > 8 * words[0]  # the long class carries priority 1


def test_agent_needs_chat_and_runs_as_sessions():
    server = FakeOpenAI(**FAST).start()
    try:
        code, _, output = _load(server, "--workload", "agent", "--concurrency", "1", "--max-requests", "2")
        assert code == 2 and "--api chat" in output
        code, _, output = _load(server, "--workload", "agent", "--prompt-len", "64", "--api", "chat")
        assert code == 2 and "not both" in output
        code, run, output = _load(
            server, "--workload", "agent:turns=2", "--api", "chat", "--concurrency", "2", "--max-requests", "6"
        )
    finally:
        server.stop()
    assert code == 0, output
    sent = [b["messages"] for b in server.bodies[1:] if "messages" in b]
    assert [len(m) for m in sent[-6:]].count(4) >= 2  # second turns: system, user, assistant, user


def test_copy_sends_greedy_requests():
    server = FakeOpenAI(**FAST).start()
    try:
        code, _, output = _load(server, "--workload", "copy", "--concurrency", "1", "--max-requests", "2")
    finally:
        server.stop()
    assert code == 0, output
    assert all(b["temperature"] == 0 for b in server.bodies)


def test_the_admission_gate_rejects_past_its_limit_and_counts():
    server = FakeOpenAI(slots=1, prefill_s=0.2, token_s=0.01).start()
    try:
        code, _, output = _load(server, "--concurrency", "4", "--admission", "2")
        assert code == 2 and "--rate" in output
        code, run, output = _load(
            server,
            "--rate",
            "20",
            "--admission",
            "2",
            "--max-requests",
            "30",
            "--step-seconds",
            "3",
            "--prompt-len",
            "8",
        )
    finally:
        server.stop()
    assert code == 0, output
    step = run["steps"][0]
    assert step["errors"]["rejected"] > 5 and step["completed"] + step["errors"]["rejected"] == step["requests"]
    assert "admission gate" in step["error_examples"]["rejected"]
    assert len(server.bodies) - 1 == step["completed"]  # a rejected request is never sent
