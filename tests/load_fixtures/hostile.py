"""Ways an OpenAI-compatible server can misbehave, by kind, for FakeOpenAI(misbehave=NAME, bad_every=K).

MISBEHAVIOURS: name -> handler(request_handler, body) that answers one request badly.
EXPECTED: name -> the error kind `quantkit load` must count for it (None: the request succeeds).
"""

from __future__ import annotations

import socket
import struct
import time


def _chat(h) -> bool:
    return h.path.endswith("chat/completions")


def _sse_headers(h, ctype: str = "text/event-stream", chunked: bool = False) -> None:
    h.send_response(200)
    h.send_header("Content-Type", ctype)
    if chunked:
        h.send_header("Transfer-Encoding", "chunked")
    else:
        h.send_header("Connection", "close")
    h.end_headers()


def _mutant(chunk) -> callable:
    """A well-formed stream with one bad chunk after two tokens."""
    return lambda h, body: h._stream(body, _chat(h), extra=[(2, chunk)])


def _garbage_lines(h, body) -> None:
    _sse_headers(h)
    h._raw({"choices": [{"index": 0, "text": " t0"}]})
    h.wfile.write(b"\xff\xfe\x00\x9c binary \x80\x81\n\n" * 3)
    h.wfile.flush()


def _garbage_data(h, body) -> None:
    _sse_headers(h)
    h.wfile.write(b"data: \xff\xfe{\x80\x81}\n\n")
    h.wfile.flush()


def _not_http(h, body) -> None:
    h.wfile.write(b"\x00\x01\x02 this is not HTTP \xff\r\n\r\n")
    h.wfile.flush()
    h.close_connection = True


def _status(code: int, ctype: str, payload: bytes, headers: dict | None = None):
    def answer(h, body) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(payload)))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()
        h.wfile.write(payload)

    return answer


def _slow_loris(h, body) -> None:
    _sse_headers(h)
    for _ in range(150):  # a keep-alive comment every 0.2 s for 30 s, never a token
        try:
            h.wfile.write(b": ping\n\n")
            h.wfile.flush()
        except OSError:
            return
        time.sleep(0.2)


def _no_headers(h, body) -> None:
    time.sleep(30)


def _closed_early(h, body) -> None:
    h._stream(body, _chat(h), tokens=2)  # Connection: close, so the close ends the body cleanly


def _reset_mid_chunk(h, body) -> None:
    _sse_headers(h, chunked=True)
    data = b'data: {"choices": [{"index": 0, "text": " t0"}]}\n\n'
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.write(b'400\r\ndata: {"choi')  # a chunk of 1024 bytes announced, 17 sent
    h.wfile.flush()
    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    h.close_connection = True


def _json_not_stream(h, body) -> None:
    _status(200, "application/json", b'{"choices": [{"index": 0, "text": " all at once", "finish_reason": "length"}]}')(
        h, body
    )


def _huge_line(h, body) -> None:
    _sse_headers(h)
    piece = b"x" * (1 << 16)
    try:
        for _ in range(80):  # 5 MiB without a line break
            h.wfile.write(piece)
        h.wfile.flush()
    except OSError:
        pass


def _huge_chunk(h, body) -> None:
    text = " word" * 50_000  # one valid 250 KB chunk, then the rest of a normal stream
    h._stream(body, _chat(h), extra=[(1, {"choices": [{"index": 0, "text": text, "delta": {"content": text}}]})])


def _after_done(h, body) -> None:
    h._stream(body, _chat(h))
    h._raw({"choices": [{"index": 0, "text": " late", "delta": {"content": " late"}}]})


def _no_text(h, body) -> None:
    _sse_headers(h)
    h._raw({"choices": [{"index": 0, "finish_reason": "length", "text": "", "delta": {}}]})
    h._raw(b"data: [DONE]\n\n")


def _no_usage(h, body) -> None:
    usage, h.server.usage = h.server.usage, False
    try:
        h._stream(body, _chat(h))
    finally:
        h.server.usage = usage


def _done_early(h, body) -> None:
    h._stream(body, _chat(h), tokens=2)  # then [DONE] with no finish_reason (llama-cpp-python's interrupt)
    h._raw(b"data: [DONE]\n\n")


def _no_done_but_finished(h, body) -> None:
    h._stream(body, _chat(h), done=False)  # transformers serve's shape: a finish_reason, no [DONE]


MALFORMED_CHUNKS = {
    "usage-lots": {"choices": [], "usage": {"completion_tokens": "lots", "prompt_tokens": 3}},
    "usage-bool": {"choices": [], "usage": {"completion_tokens": True}},
    "usage-float": {"choices": [], "usage": {"prompt_tokens": 2.5}},
    "usage-list": {"choices": [], "usage": [1, 2]},
    "details-string": {"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": "cached"}},
    "cached-negative": {"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": -1}}},
    "timings-string": {"choices": [], "timings": "fast"},
    "cache-n-string": {"choices": [], "timings": {"cache_n": "all", "prompt_n": 1}},
    "choices-string": {"choices": "abc"},
    "choices-object": {"choices": {"0": {"text": "x"}}},
    "choice-number": {"choices": [7]},
    "choice-null": {"choices": [None]},
    "text-number": {"choices": [{"index": 0, "text": 5, "delta": {"content": 5}}]},
    "delta-list": {"choices": [{"index": 0, "text": ["x"], "delta": ["x"]}]},
    "finish-number": {"choices": [{"index": 0, "finish_reason": 3}]},
    "chunk-array": b"data: [1, 2, 3]\n\n",
    "chunk-string": b'data: "just a string"\n\n',
    "chunk-null": b"data: null\n\n",
    "not-json": b"data: {'single': 'quotes'}\n\n",
    "error-object": {"error": {"message": "CUDA out of memory", "type": "server_error"}},
}

MISBEHAVIOURS = {
    **{name: _mutant(chunk) for name, chunk in MALFORMED_CHUNKS.items()},
    "garbage-lines": _garbage_lines,
    "garbage-data": _garbage_data,
    "not-http": _not_http,
    "http-429": _status(429, "application/json", b'{"error": "rate limited"}', {"Retry-After": "1"}),
    "http-503-html": _status(503, "text/html", b"<html><body>Bad gateway</body></html>"),
    "redirect": _status(302, "text/html", b"moved", {"Location": "http://127.0.0.1:1/elsewhere"}),
    "json-not-stream": _json_not_stream,
    "slow-loris": _slow_loris,
    "no-headers": _no_headers,
    "closed-early": _closed_early,
    "done-early": _done_early,
    "reset-mid-chunk": _reset_mid_chunk,
    "huge-line": _huge_line,
    "after-done": _after_done,
    "no-text": _no_text,
    "huge-chunk": _huge_chunk,
    "no-usage": _no_usage,
    "no-done-but-finished": _no_done_but_finished,
}

EXPECTED = {
    **{name: "stream_error" for name in MALFORMED_CHUNKS},
    "garbage-lines": "stream_error",
    "garbage-data": "stream_error",
    "not-http": "connection",
    "http-429": "http_4xx",
    "http-503-html": "http_5xx",
    "redirect": "stream_error",
    "json-not-stream": "stream_error",
    "slow-loris": "timeout",
    "no-headers": "timeout",
    "closed-early": "truncated",
    "done-early": "truncated",
    "reset-mid-chunk": "truncated",
    "huge-line": "stream_error",
    "after-done": "stream_error",
    "no-text": "stream_error",
    "huge-chunk": None,
    "no-usage": None,
    "no-done-but-finished": None,
}
