"""quantkit.load.sse: line splitting across network reads, and every chunk shape it must refuse."""

from __future__ import annotations

import pytest
from load_fixtures.hostile import MALFORMED_CHUNKS

from quantkit.load.request_timings import RequestRecord
from quantkit.load.sse import DONE, LineSplitter, MalformedChunk, apply_chunk, finish_record, parse_line


def test_lines_split_across_reads_and_line_endings():
    split = LineSplitter()
    assert split.feed(b'data: {"a"') == []
    assert split.feed(b": 1}\r\ndata: [DO") == [b'data: {"a": 1}']
    assert split.feed(b"NE]\r") == [b"data: [DONE]"]
    assert split.feed(b"\n: ping\rdata: x") == [b"", b": ping"]  # \r\n split over two reads: one blank line
    assert split.close() == [b"data: x"] and split.close() == []


def test_an_endless_line_is_refused():
    split = LineSplitter(max_line=1000)
    split.feed(b"x" * 600)
    with pytest.raises(MalformedChunk, match="without a line break"):
        split.feed(b"y" * 600)
    with pytest.raises(MalformedChunk):
        LineSplitter(max_line=1000).feed(b"ok\n" + b"z" * 1001)


@pytest.mark.parametrize("line", [b"\xff\xfe\x00 binary", b'{"raw": "json without data:"}', b"<html>"])
def test_lines_that_are_not_events(line):
    with pytest.raises(MalformedChunk, match="not a server-sent event"):
        parse_line(line)


def test_fields_the_client_ignores():
    for line in (b"", b": comment", b"event: message", b"id: 7", b"retry: 100", b"data:", b"data:   "):
        assert parse_line(line) is None
    assert parse_line(b"data:[DONE]") == DONE


@pytest.mark.parametrize("name", sorted(MALFORMED_CHUNKS))
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_malformed_chunks_are_refused(name, api):
    chunk = MALFORMED_CHUNKS[name]
    rec = RequestRecord(t_send=0.0)
    if name == "error-object":  # well-formed: the server reports its own failure
        apply_chunk(rec, chunk, api, 0.1)
        assert rec.error == "stream_error" and "CUDA out of memory" in rec.detail
        return
    with pytest.raises(MalformedChunk) as caught:
        payload = parse_line(chunk.rstrip(b"\n")) if isinstance(chunk, bytes) else chunk
        apply_chunk(rec, payload, api, 0.1)
    assert str(caught.value) and "\n" not in str(caught.value)


def test_llama_cpp_timings_and_openai_cached_tokens():
    rec = RequestRecord(t_send=0.0, done=True, finish_reason="length")
    apply_chunk(rec, {"choices": [{"text": "a"}]}, "completions", 0.1)
    apply_chunk(
        rec, {"choices": [], "timings": {"cache_n": 96, "prompt_n": 32, "predicted_ms": 1.5}}, "completions", 0.2
    )
    assert (rec.prompt_tokens, rec.cached_tokens) == (128, 96)  # llama.cpp: cache_n + prompt_n
    apply_chunk(
        rec,
        {"usage": {"prompt_tokens": 130, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 64}}},
        "completions",
        0.3,
    )
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (130, 64, 1)  # usage wins
    assert finish_record(rec, 0.3).ok


def test_when_a_stream_counts_as_complete():
    def record(**kw):
        rec = RequestRecord(t_send=0.0, t_first=0.1, chunk_times=[0.1, 0.2], **kw)
        return finish_record(rec, 0.3)

    assert record(done=True, finish_reason="stop").ok
    assert record(finish_reason="length").ok  # clean end after a finish_reason (transformers serve)
    cut = record()
    assert cut.error == "truncated" and "after 2 text chunks" in cut.detail and cut.output_tokens == 2
    early = record(done=True)  # [DONE] without a finish_reason: an interrupted answer
    assert early.error == "truncated" and early.detail.startswith("[DONE] came")
    odd = record(done=True, finish_reason="length", prompt_tokens=10, cached_tokens=11)
    assert odd.error == "stream_error" and "exceed" in odd.detail


def test_an_answer_of_tokens_that_are_no_text_is_a_stream_error_that_says_so():
    """llama-server holds back bytes until they complete a UTF-8 character; a random model's answer
    can be all such bytes: usage counts its tokens, and no chunk carried text to time the first."""
    rec = RequestRecord(t_send=0.0)
    apply_chunk(rec, {"choices": [{"text": "", "finish_reason": "length"}]}, "completions", 0.2)
    apply_chunk(rec, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 8}}, "completions", 0.2)
    rec.done = True
    rec = finish_record(rec, 0.3)
    assert rec.error == "stream_error" and rec.detail.endswith(
        "without generated text (8 tokens by usage, none of them text)"
    )
    bare = finish_record(RequestRecord(t_send=0.0, done=True, finish_reason="stop"), 0.3)  # nothing at all
    assert bare.error == "stream_error" and bare.detail == "the stream ended without generated text"
