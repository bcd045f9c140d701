"""Server-sent events of an OpenAI-compatible stream, read defensively: bytes -> lines -> chunks -> a record.

Pure apart from mutating the `RequestRecord` it is given, so every way a server can misbehave is
testable without a network. Anything that breaks the protocol raises `MalformedChunk`; the client
turns it into a counted `stream_error` for that one request.

The stream's shape follows the OpenAI API reference (chat/completions streaming, `stream_options.
include_usage`): `data: {json}` lines, the last chunk carrying `usage`, then `data: [DONE]`.
An answer is complete when a choice carried a `finish_reason` and the stream then ended cleanly,
with or without [DONE] (transformers serve sends none). llama.cpp's server adds `timings`
({cache_n, prompt_n, ...}, and draft_n, draft_n_accepted when it decodes speculatively) to its
last chunk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from quantkit.load.request_timings import RequestRecord

DONE = "[DONE]"
# One SSE line longer than this is refused: a streamed chunk is a token or a few, and an unbounded
# line (garbage without newlines, a runaway server) would otherwise grow the client's memory.
MAX_LINE_BYTES = 4 << 20
# Lines that are SSE fields the client has no use for: comments (": ping"), event:, id:, retry:
# and any other `name: value` (the SSE spec says unknown fields are ignored).
_FIELD = re.compile(rb"[A-Za-z_-]*(:|$)")


_DECODE = json.JSONDecoder().decode


class MalformedChunk(ValueError):
    """A line or chunk that breaks the streaming protocol; the message says how."""


class LineSplitter:
    """Bytes as they arrive -> complete lines (ended by \\n, \\r\\n or \\r), without the ending."""

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        self._rest: list[bytes] = []  # pieces of an unfinished line (joined once, not per read)
        self._size = 0
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data and b"\r" not in data:
            self._rest.append(data)
            self._size += len(data)
            if self._size > self._max:
                raise MalformedChunk(f"a line longer than {self._max >> 20} MiB without a line break")
            return []
        if self._rest:
            data = b"".join(self._rest) + data
        lines = data.splitlines(keepends=True)
        last = lines[-1]
        if last.endswith((b"\n", b"\r")):
            self._rest, self._size = [], 0
        else:
            lines.pop()
            self._rest, self._size = [last], len(last)
            if self._size > self._max:
                raise MalformedChunk(f"a line longer than {self._max >> 20} MiB without a line break")
        return [line.rstrip(b"\r\n") for line in lines]

    def close(self) -> list[bytes]:
        """The last line when the stream ended without a line break after it."""
        rest, self._rest, self._size = b"".join(self._rest), [], 0
        return [rest] if rest else []


def parse_line(line: bytes) -> dict | str | None:
    """One SSE line -> a chunk (dict), DONE, or None for blank lines and fields without data."""
    if not line.startswith(b"data:"):
        if _FIELD.match(line):
            return None
        raise MalformedChunk(f"a line that is not a server-sent event: {_show(line)}")
    data = line[5:].strip()
    if not data:
        return None
    if data == b"[DONE]":
        return DONE
    try:
        # UTF-8 as the SSE spec says (bad bytes raise UnicodeDecodeError, a ValueError); decoding
        # first skips json.loads' encoding sniffing, a fifth of its time on a token-sized chunk
        payload = _DECODE(data.decode("utf-8"))
    except ValueError:
        raise MalformedChunk(f"data that is not JSON: {_show(data)}") from None
    if not isinstance(payload, dict):
        raise MalformedChunk(f"a chunk that is a JSON {type(payload).__name__}, not an object: {_show(data)}")
    return payload


def _show(data: bytes) -> str:
    return repr(data[:60])[1:] + ("..." if len(data) > 60 else "")


def _count(obj: dict, key: str, where: str) -> int | None:
    """A token count: a non-negative integer or absent; anything else is malformed."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedChunk(f"{where}.{key} is {value!r}, not a token count")
    return value


def _object(obj: dict, key: str, where: str) -> dict | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise MalformedChunk(f"{where}.{key} is a {type(value).__name__}, not an object")
    return value


def _string(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedChunk(f"{where}.{key} is {type(value).__name__} {value!r:.40}, not a string")
    return value


def completions_text(choice: dict) -> str:
    return _string(choice, "text", "choice")


def chat_text(choice: dict) -> str:
    delta = _object(choice, "delta", "choice") or {}
    # Reasoning models stream their thinking in a separate field (vLLM: reasoning_content, newer
    # servers: reasoning); it is generated tokens too.
    return (
        _string(delta, "content", "choice.delta")
        + _string(delta, "reasoning_content", "choice.delta")
        + _string(delta, "reasoning", "choice.delta")
    )


# API name -> streamed choice -> generated text (the request bodies are built in client.py)
CHOICE_TEXT: dict[str, Callable[[dict], str]] = {"completions": completions_text, "chat": chat_text}


def _choices_text(payload: dict, api: str, rec: RequestRecord) -> str:
    choices = payload.get("choices")
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise MalformedChunk(f"choices is a {type(choices).__name__}, not a list")
    text = ""
    for choice in choices:
        if not isinstance(choice, dict):
            raise MalformedChunk(f"a choice that is {type(choice).__name__} {choice!r:.40}, not an object")
        text += CHOICE_TEXT[api](choice)
        finish = choice.get("finish_reason")
        if finish is not None:
            if not isinstance(finish, str):
                raise MalformedChunk(f"choice.finish_reason is {finish!r:.40}, not a string")
            rec.finish_reason = finish
    return text


def _ms(obj: dict, key: str, where: str) -> float | None:
    """A duration in milliseconds: a finite non-negative number or absent; anything else is malformed."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise MalformedChunk(f"{where}.{key} is {value!r:.40}, not a duration in milliseconds")
    return float(value)


def _fold_usage(payload: dict, rec: RequestRecord) -> None:
    usage = _object(payload, "usage", "chunk")
    # llama.cpp's server: timings.cache_n prompt tokens reused from the slot's cache, prompt_n processed
    timings = _object(payload, "timings", "chunk")
    cached = prompt = None
    if usage is not None:
        completion = _count(usage, "completion_tokens", "usage")
        if completion is not None:
            rec.output_tokens, rec.tokens_from_usage = completion, True
        prompt = _count(usage, "prompt_tokens", "usage")
        details = _object(usage, "prompt_tokens_details", "usage")
        if details is not None:
            cached = _count(details, "cached_tokens", "usage.prompt_tokens_details")
    if timings is not None:
        cache_n, prompt_n = _count(timings, "cache_n", "timings"), _count(timings, "prompt_n", "timings")
        cached = cache_n if cached is None else cached
        if prompt is None and cache_n is not None and prompt_n is not None:
            prompt = cache_n + prompt_n
        drafted, accepted = _count(timings, "draft_n", "timings"), _count(timings, "draft_n_accepted", "timings")
        if drafted is not None:
            rec.draft_tokens, rec.draft_accepted = drafted, accepted
        prompt_ms, predicted_ms = _ms(timings, "prompt_ms", "timings"), _ms(timings, "predicted_ms", "timings")
        if prompt_ms is not None and predicted_ms is not None:
            rec.server_prompt_ms, rec.server_predicted_ms = prompt_ms, predicted_ms
    if prompt is not None:
        rec.prompt_tokens = prompt
    if cached is not None:
        rec.cached_tokens = cached


def apply_chunk(rec: RequestRecord, payload: dict, api: str, now: float) -> str:
    """Fold one chunk into the record; returns the generated text it carried. Raises MalformedChunk."""
    error = payload.get("error")
    if error:
        rec.error, rec.detail = "stream_error", f"the server sent an error: {error}"[:200]
        return ""
    text = _choices_text(payload, api, rec)
    if text:
        if rec.t_first is None:
            rec.t_first = now
        rec.chunk_times.append(now)
    _fold_usage(payload, rec)
    return text


def finish_record(rec: RequestRecord, now: float) -> RequestRecord:
    """Close the record: token counts, and whether a stream that raised nothing was complete."""
    if rec.t_end is None:
        rec.t_end = now
    if not rec.tokens_from_usage:
        # Without usage, each text chunk counts as one token (true for vLLM, SGLang, llama.cpp).
        rec.output_tokens = len(rec.chunk_times)
    if rec.error is not None:
        return rec
    if rec.finish_reason is None:
        # Every OpenAI-compatible server ends an answer with a finish_reason ("stop", "length");
        # [DONE] alone is not enough: llama-cpp-python's server cuts a stream with an early [DONE]
        # when another request arrives (its --interrupt_requests, on by default).
        rec.error = "truncated"
        ended = "[DONE] came" if rec.done else "the stream ended"
        rec.detail = f"{ended} after {len(rec.chunk_times)} text chunks without a finish_reason"
    elif rec.t_first is None:
        rec.error, rec.detail = "stream_error", "the stream ended without generated text"
        if rec.tokens_from_usage and rec.output_tokens:
            # tokens were generated but none became text: special tokens, or bytes a server holds back
            # until they complete a UTF-8 character (llama-server); no chunk times the first token
            rec.detail += f" ({rec.output_tokens} tokens by usage, none of them text)"
    elif rec.cached_tokens is not None and rec.prompt_tokens is not None and rec.cached_tokens > rec.prompt_tokens:
        rec.error = "stream_error"
        rec.detail = f"cached prompt tokens ({rec.cached_tokens}) exceed the prompt ({rec.prompt_tokens})"
    elif rec.draft_accepted is not None and rec.draft_accepted > (rec.draft_tokens or 0):
        rec.error = "stream_error"
        rec.detail = f"accepted draft tokens ({rec.draft_accepted}) exceed the drafted ({rec.draft_tokens})"
    return rec
