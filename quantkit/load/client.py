"""Async SSE client for /v1/completions and /v1/chat/completions: one RequestRecord per request.

Per request it stamps the send, every chunk that carries generated text (the first one is the
TTFT point), and the end; it takes token counts from the server's `usage` where present, and it
times its own parsing and bookkeeping so the report can show the client's overhead. Whatever the
server sends, a request ends as a record: HTTP errors, timeouts, dropped connections, truncated
streams and malformed chunks are counted kinds of failure (records.ERROR_KINDS), never a crash.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from .config import APIS, ENGINES, LoadConfig, LoadError, ServerUnreachable
from .records import RequestRecord
from .sse import DONE, LineSplitter, MalformedChunk, apply_chunk, finish_record, parse_line

# After [DONE] the stream should end at once; wait this long for it, so data sent after [DONE]
# is caught, without holding a worker on a server that keeps the response open.
DRAIN_S = 1.0
# Read at most this much of an error body or of a response that is not an event stream.
ERROR_BODY_BYTES = 64 << 10

Messages = list[dict]


def _completions_body(messages: Messages) -> dict:
    # /v1/completions takes one text: the turns' contents in order (a shared prefix stays a prefix).
    return {"prompt": " ".join(m["content"] for m in messages)}


def _chat_body(messages: Messages) -> dict:
    return {"messages": messages}


# API name -> messages -> the body fields that carry the prompt
API_BODIES: dict[str, Callable[[Messages], dict]] = {"completions": _completions_body, "chat": _chat_body}


def user_turn(prompt: str) -> Messages:
    return [{"role": "user", "content": prompt}]


def build_body(cfg: LoadConfig, messages: Messages, max_tokens: int | None = None) -> dict:
    gen_len = max_tokens or cfg.gen_len
    body = {
        "model": cfg.model,
        "stream": True,
        "max_tokens": gen_len,
        # vLLM and SGLang send usage in the last chunk only when asked; others ignore it.
        "stream_options": {"include_usage": True},
    }
    body.update(API_BODIES[cfg.api](messages))
    body.update(ENGINES[cfg.engine](gen_len))
    body.update(cfg.extra_body)
    return body


def make_http(cfg: LoadConfig) -> httpx.AsyncClient:
    # No pool limit: a client-side queue would show up as server TTFT. No proxies from the
    # environment: a proxy between client and server would be measured as the server.
    timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=cfg.url, timeout=timeout, limits=limits, trust_env=False)


async def _head(response: httpx.Response) -> str:
    """The first ERROR_BODY_BYTES of a body, as one line of text."""
    data = b""
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) >= ERROR_BODY_BYTES:
            break
    return " ".join(data[:ERROR_BODY_BYTES].decode("utf-8", "replace").split())


def _not_a_stream(response: httpx.Response) -> str | None:
    """Why a response cannot be read as an event stream, or None when it can."""
    status, ctype = response.status_code, response.headers.get("content-type", "")
    if not 200 <= status < 300:
        where = f" to {response.headers.get('location')}" if response.headers.get("location") else ""
        return f"HTTP {status}{where}, not a streamed answer"
    if ctype and "text/event-stream" not in ctype.lower():
        return f"Content-Type {ctype!r}, not an event stream (does the server stream with stream=true?)"
    return None


async def _read_events(response: httpx.Response, api: str, rec: RequestRecord, keep_text: bool) -> None:
    splitter, parts = LineSplitter(), []
    drain = None
    async with asyncio.timeout(None) as drain:
        chunks = response.aiter_bytes()
        async for data in chunks:
            now = time.perf_counter()
            for line in splitter.feed(data):
                _line(line, api, rec, now, parts if keep_text else None, drain)
                if rec.error:
                    return
            rec.client_s += time.perf_counter() - now
        for line in splitter.close():
            _line(line, api, rec, time.perf_counter(), parts if keep_text else None, drain)
    if keep_text:
        rec.text = "".join(parts)


def _line(line: bytes, api: str, rec: RequestRecord, now: float, parts: list | None, drain) -> None:
    payload = parse_line(line)
    if payload is None:
        return
    if rec.done:
        raise MalformedChunk(f"data after [DONE]: {line[:60]!r}")
    if payload == DONE:
        rec.done, rec.t_end = True, now
        drain.reschedule(asyncio.get_running_loop().time() + DRAIN_S)
        return
    text = apply_chunk(rec, payload, api, now)
    if parts is not None and text:
        parts.append(text)


async def _stream(http: httpx.AsyncClient, cfg: LoadConfig, body: dict, rec: RequestRecord, keep_text: bool) -> None:
    async with http.stream("POST", APIS[cfg.api], json=body) as response:
        rec.status = response.status_code
        if response.status_code >= 400:
            rec.error = "http_4xx" if response.status_code < 500 else "http_5xx"
            rec.detail = (await _head(response))[:200]
            return
        why = _not_a_stream(response)
        if why:
            rec.error, rec.detail = "stream_error", f"{why}: {await _head(response)}"[:200]
            return
        try:
            await _read_events(response, cfg.api, rec, keep_text)
        except TimeoutError:
            if not rec.done:
                raise
            # the server held the response open after [DONE]: the answer was complete


async def stream_request(
    http: httpx.AsyncClient,
    cfg: LoadConfig,
    messages: Messages,
    rec: RequestRecord,
    max_tokens: int | None = None,
    keep_text: bool = False,
) -> RequestRecord:
    """Send one streaming request and fill `rec`; every failure becomes a counted error kind."""
    body = build_body(cfg, messages, max_tokens)
    rec.t_send = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(http, cfg, body, rec, keep_text), cfg.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec.error, rec.detail = "timeout", f"no complete answer within {cfg.timeout_s:g} s"
    except MalformedChunk as exc:
        rec.error, rec.detail = "stream_error", str(exc)[:200]
    except httpx.DecodingError as exc:  # a body that does not decode as its Content-Encoding says
        rec.error, rec.detail = "stream_error", f"{type(exc).__name__}: {exc}"[:200]
    except httpx.HTTPError as exc:
        # after the headers, a dropped connection cut the answer short; before them, none came
        rec.error = "truncated" if rec.status else "connection"
        rec.detail = f"{type(exc).__name__}: {exc}"[:200]
    return finish_record(rec, time.perf_counter())


async def probe(http: httpx.AsyncClient, cfg: LoadConfig, messages: Messages) -> RequestRecord:
    """One short request before the staircase: a warm-up, and a clear error if the server is unusable."""
    try:
        await http.get("/health", timeout=cfg.connect_timeout_s)
    except httpx.TransportError as exc:
        raise ServerUnreachable(
            f"cannot reach {cfg.url} within {cfg.connect_timeout_s:g} s ({type(exc).__name__}); "
            "is the server running and the URL right?"
        ) from None
    rec = await stream_request(http, cfg, messages, RequestRecord(t_send=0.0), max_tokens=min(cfg.gen_len, 8))
    if rec.error == "connection":
        raise ServerUnreachable(f"{cfg.url}: {rec.detail}")
    if rec.error:
        where = f"{cfg.url}{APIS[cfg.api]}"
        status = f" HTTP {rec.status}" if rec.status else ""
        raise LoadError(f"warm-up request to {where} failed ({rec.error}{status}): {rec.detail}")
    return rec
