"""quantkit.load.config parsing, quantkit.load.client's request bodies, quantkit.load.sse's chunk folding."""

from __future__ import annotations

import json
import random

import pytest

from quantkit.load.client import build_body
from quantkit.load.config import LoadConfig, LoadError, Slo, build_config, normalize_url, parse_levels, parse_slo
from quantkit.load.load_options import LoadOptions
from quantkit.load.prompts import make_prompt
from quantkit.load.request_timings import RequestRecord
from quantkit.load.sse import DONE, MalformedChunk, apply_chunk, finish_record, parse_line


def user_turn(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _cfg(**kw) -> LoadConfig:
    base = dict(url="http://127.0.0.1:8000", model="m", mode="concurrency", levels=(1, 2))
    return LoadConfig(**{**base, **kw})


def test_parse_levels_and_slo():
    assert parse_levels("1,2,4", integer=True, option="--concurrency") == (1, 2, 4)
    assert parse_levels("0.5, 1,2", integer=False, option="--rate") == (0.5, 1.0, 2.0)
    for bad in ("1,1", "4,2", "0,1", "a", "1.5", ""):
        with pytest.raises(LoadError, match="--concurrency"):
            parse_levels(bad, integer=True, option="--concurrency")
    assert parse_slo("ttft=500,tpot=50") == Slo(ttft_ms=500, tpot_ms=50)
    assert parse_slo("tpot=20ms") == Slo(tpot_ms=20)
    assert parse_slo(None).empty
    for bad in ("ttft", "e2e=5", "ttft=-1", "ttft=x"):
        with pytest.raises(LoadError, match="--slo"):
            parse_slo(bad)


def test_normalize_url():
    assert normalize_url("http://h:8000/v1/") == "http://h:8000"
    assert normalize_url("https://h") == "https://h"
    with pytest.raises(LoadError, match="URL"):
        normalize_url("localhost:8000")


def test_build_config_rejects_bad_combinations():
    common = dict(prompt_len=8, gen_len=8, step_seconds=1.0, timeout_s=5.0)

    def build(**kw):
        return build_config(LoadOptions(**{**common, **kw}), url="http://h:1", model="m")

    assert build().levels == (1, 2, 4, 8, 16, 32)
    assert build(rate="0.5,1").mode == "rate"
    with pytest.raises(LoadError, match="not both"):
        build(concurrency="1", rate="1")
    with pytest.raises(LoadError, match="--engine: unknown 'tgi'; choose one of llama-cpp-python, llamacpp, openai"):
        build(concurrency="1", engine="tgi")
    with pytest.raises(LoadError, match="--max-requests must be positive"):
        build(concurrency="1", max_requests=0)


def test_request_bodies_per_api_and_engine():
    body = build_body(_cfg(), user_turn("hello"))
    assert body["prompt"] == "hello" and body["max_tokens"] == 64 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and "ignore_eos" not in body
    assert build_body(_cfg(api="chat"), user_turn("hi"))["messages"] == [{"role": "user", "content": "hi"}]
    assert build_body(_cfg(engine="vllm"), user_turn("x"))["ignore_eos"] is True
    hf = build_body(_cfg(engine="transformers", gen_len=16), user_turn("x"))
    assert json.loads(hf["generation_config"]) == {"max_new_tokens": 16, "min_new_tokens": 16}
    assert "ignore_eos" not in hf  # transformers serve answers 422 to unknown fields
    assert build_body(_cfg(extra_body={"cache_prompt": False}), user_turn("x"))["cache_prompt"] is False


def test_sse_lines():
    assert parse_line(b"data: [DONE]") == DONE
    assert parse_line(b": keep-alive") is None and parse_line(b"") is None and parse_line(b"event: x") is None
    assert parse_line(b'data: {"choices": []}') == {"choices": []}
    with pytest.raises(MalformedChunk, match="not JSON"):
        parse_line(b"data: {not json")


def test_chunks_fold_into_a_record():
    rec = RequestRecord(t_send=0.0)
    apply_chunk(rec, {"choices": [{"delta": {"role": "assistant"}}]}, "chat", 0.05)  # no text yet
    apply_chunk(rec, {"choices": [{"delta": {"content": "a"}}]}, "chat", 0.1)
    apply_chunk(rec, {"choices": [{"delta": {"reasoning_content": "b"}}]}, "chat", 0.2)
    apply_chunk(
        rec,
        {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"prompt_tokens": 7, "completion_tokens": 5}},
        "chat",
        0.3,
    )
    finish_record(rec, 0.3)  # no [DONE], but a finish_reason and a clean end (transformers serve)
    assert rec.ok and rec.t_first == 0.1 and rec.chunk_times == [0.1, 0.2]
    assert rec.output_tokens == 5 and rec.prompt_tokens == 7 and rec.tokens_from_usage

    plain = RequestRecord(t_send=0.0, done=True, finish_reason="length")
    for i, t in enumerate((0.1, 0.2, 0.3)):
        apply_chunk(plain, {"choices": [{"text": f" w{i}"}]}, "completions", t)
    assert finish_record(plain, 0.3).output_tokens == 3 and not plain.tokens_from_usage  # chunks counted

    broken = RequestRecord(t_send=0.0)
    apply_chunk(broken, {"error": "CUDA out of memory"}, "completions", 0.1)
    assert finish_record(broken, 0.1).error == "stream_error" and "memory" in broken.detail
    empty = finish_record(RequestRecord(t_send=0.0, done=True, finish_reason="stop"), 0.1)
    assert empty.error == "stream_error" and not empty.ok


def test_prompts_are_reproducible_and_about_the_right_length():
    a = make_prompt(64, random.Random(1), 3)
    assert a == make_prompt(64, random.Random(1), 3) and a.startswith("Request 3:")
    assert 60 <= len(a.split()) <= 66


def test_shifted_record_moves_every_timestamp():
    rec = RequestRecord(t_send=10.0, t_first=10.1, t_end=10.5, chunk_times=[10.1, 10.3], t_scheduled=9.9)
    moved = rec.shifted(-10.0)
    assert moved.t_send == 0.0 and moved.t_end == pytest.approx(0.5) and moved.t_scheduled == pytest.approx(-0.1)
    assert moved.chunk_times == pytest.approx([0.1, 0.3]) and rec.t_send == 10.0
