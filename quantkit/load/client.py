"""Async SSE client for /v1/completions and /v1/chat/completions: one RequestRecord per request.

Per request it stamps the send, every chunk that carries generated text (the first one is the
TTFT point), and the end; it takes token counts from the server's `usage` where present, and it
times its own parsing and bookkeeping so the report can show the client's overhead. Whatever the
server sends, a request ends as a record: HTTP errors, timeouts, dropped connections, truncated
streams and malformed chunks are counted kinds of failure (request_timings.ERROR_KINDS), never a crash.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import aiohttp

from quantkit.load.config import APIS, ENGINES, LoadConfig, LoadError, ServerUnreachable
from quantkit.load.load_stats import VLLM_ACCEPTED, VLLM_DRAFTED
from quantkit.load.metrics import Scrape, parse_counters, parse_histograms
from quantkit.load.parts import VLLM_PREFILL, VLLM_QUEUE, VLLM_TTFT
from quantkit.load.request_timings import RequestRecord
from quantkit.load.sse import DONE, LineSplitter, MalformedChunk, apply_chunk, finish_record, parse_line

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


def build_body(cfg: LoadConfig, messages: Messages, max_tokens: int | None = None, cls: str | None = None) -> dict:
    gen_len = max_tokens or cfg.gen_len
    body = {
        "model": cfg.model,
        "stream": True,
        "max_tokens": gen_len,
        # vLLM and SGLang send usage in the last chunk only when asked; others ignore it.
        "stream_options": {"include_usage": True},
    }
    body.update(API_BODIES[cfg.api](messages))
    body.update(ENGINES[cfg.engine].fields(gen_len))
    body.update(cfg.workload.body)
    body.update(cfg.extra_body)
    if cls in cfg.class_priority:  # vLLM's request priority (lower first) under --scheduling-policy priority
        body["priority"] = cfg.class_priority[cls]
    return body


def make_http(cfg: LoadConfig) -> aiohttp.ClientSession:
    """The client's HTTP session (aiohttp: its C HTTP parser costs about a fifth of httpx's CPU per
    streamed request here, see docs/LOAD.md *The client's own ceiling*; vLLM's and SGLang's
    benchmark clients use it for the same reason). Call inside the event loop."""
    # No pool limit: a client-side queue would show up as server TTFT. No proxies from the
    # environment (trust_env=False): a proxy between client and server would be measured as the server.
    # An engine whose server drops connections after a streamed answer gets one per request.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=not ENGINES[cfg.engine].keeps_alive)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, headers=cfg.headers)


async def _head(response: aiohttp.ClientResponse) -> str:
    """The first ERROR_BODY_BYTES of a body, as one line of text."""
    data = await response.content.read(ERROR_BODY_BYTES)
    return " ".join(data.decode("utf-8", "replace").split())


def _not_a_stream(response: aiohttp.ClientResponse) -> str | None:
    """Why a response cannot be read as an event stream, or None when it can."""
    status, ctype = response.status, response.headers.get("Content-Type", "")
    if not 200 <= status < 300:
        where = f" to {response.headers.get('Location')}" if response.headers.get("Location") else ""
        return f"HTTP {status}{where}, not a streamed answer"
    if ctype and "text/event-stream" not in ctype.lower():
        return f"Content-Type {ctype!r}, not an event stream (does the server stream with stream=true?)"
    return None


async def _read_events(response: aiohttp.ClientResponse, api: str, rec: RequestRecord, keep_text: bool) -> None:
    splitter, parts = LineSplitter(), []
    async with asyncio.timeout(None) as drain:
        async for data in response.content.iter_any():
            now = time.perf_counter()
            for line in splitter.feed(data):
                if line:  # every event ends with a blank line: half the lines
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


async def _stream(
    http: aiohttp.ClientSession, cfg: LoadConfig, body: dict, rec: RequestRecord, keep_text: bool, headers: dict | None
) -> None:
    async with http.post(cfg.url + APIS[cfg.api], json=body, allow_redirects=False, headers=headers) as response:
        rec.status = response.status
        if response.status >= 400:
            rec.error = "http_4xx" if response.status < 500 else "http_5xx"
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
    http: aiohttp.ClientSession,
    cfg: LoadConfig,
    messages: Messages,
    rec: RequestRecord,
    max_tokens: int | None = None,
    keep_text: bool = False,
    headers: dict | None = None,
) -> RequestRecord:
    """Send one streaming request and fill `rec`; every failure becomes a counted error kind."""
    body = build_body(cfg, messages, max_tokens, rec.cls)
    rec.t_send = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(http, cfg, body, rec, keep_text, headers), cfg.timeout_s)
    except TimeoutError:  # asyncio's, and aiohttp's socket timeouts (subclasses of it)
        rec.error, rec.detail = "timeout", f"no complete answer within {cfg.timeout_s:g} s"
    except MalformedChunk as exc:
        rec.error, rec.detail = "stream_error", str(exc)[:200]
    except (aiohttp.ClientError, OSError) as exc:
        # after the headers, a dropped connection or a broken body cut the answer short; before them,
        # there was no HTTP answer at all (refused, reset, bytes that are not HTTP)
        rec.error = "truncated" if rec.status else "connection"
        rec.detail = f"{type(exc).__name__}: {exc}"[:200]
    return finish_record(rec, time.perf_counter())


async def check_reachable(http: aiohttp.ClientSession, cfg: LoadConfig) -> None:
    """Fail fast, with one line, when nothing answers at the URL."""
    try:
        async with http.get(cfg.url + "/health", timeout=aiohttp.ClientTimeout(total=cfg.connect_timeout_s)):
            pass
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ServerUnreachable(
            f"cannot reach {cfg.url} within {cfg.connect_timeout_s:g} s ({type(exc).__name__}); "
            "is the server running and the URL right?"
        ) from None


def _models_max_len(data, model: str) -> int | None:
    # vLLM and SGLang: GET /v1/models -> {"data": [{"id": ..., "max_model_len": N}]}
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    entries = [e for e in entries if isinstance(e, dict)]
    mine = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    value = mine[0].get("max_model_len") if mine else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _props_n_ctx(data, model: str) -> int | None:
    # llama.cpp's server: GET /props -> {"default_generation_settings": {"n_ctx": N}} (a slot's context)
    settings = data.get("default_generation_settings") if isinstance(data, dict) else None
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# (path, what it is called there, reader): the places servers state their context length
CONTEXT_SOURCES = (
    ("/v1/models", "/v1/models max_model_len", _models_max_len),
    ("/props", "/props n_ctx", _props_n_ctx),
)


async def server_context(http: aiohttp.ClientSession, cfg: LoadConfig) -> tuple[int | None, str | None]:
    """The server's context length in tokens and where it came from; (None, None) if it does not say."""
    for path, name, read in CONTEXT_SOURCES:
        try:
            async with http.get(cfg.url + path, timeout=aiohttp.ClientTimeout(total=cfg.connect_timeout_s)) as response:
                data = json.loads(await response.content.read(1 << 20)) if response.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            continue
        tokens = read(data, cfg.model)
        if tokens:
            return tokens, name
    return None, None


# A /metrics page larger than this is not read (vLLM's is about 100 KB).
METRICS_BYTES = 8 << 20


async def server_metrics(http: aiohttp.ClientSession, cfg: LoadConfig) -> Scrape | None:
    """The server's queue, prefill and TTFT histograms (vLLM's names, parts.py) and its speculative
    decoding counters from its /metrics, or None when it has no queue histogram (llama.cpp's server
    splits TTFT per answer instead)."""
    try:
        async with http.get(
            cfg.url + "/metrics", timeout=aiohttp.ClientTimeout(total=cfg.connect_timeout_s)
        ) as response:
            if response.status != 200:
                return None
            text = (await response.content.read(METRICS_BYTES)).decode("utf-8", "replace")
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    found = {name: h for name, h in parse_histograms(text).items() if name in (VLLM_QUEUE, VLLM_PREFILL, VLLM_TTFT)}
    counters = {name: v for name, v in parse_counters(text).items() if name in (VLLM_DRAFTED, VLLM_ACCEPTED)}
    return Scrape(found, counters) if VLLM_QUEUE in found else None


async def warm_up(http: aiohttp.ClientSession, cfg: LoadConfig, messages: Messages) -> RequestRecord:
    """One short request before the staircase: a warm-up, and a clear error if the server is unusable."""
    rec = await stream_request(http, cfg, messages, RequestRecord(t_send=0.0), max_tokens=min(cfg.gen_len, 8))
    if rec.error == "connection":
        raise ServerUnreachable(f"{cfg.url}: {rec.detail}")
    if rec.error:
        where = f"{cfg.url}{APIS[cfg.api]}"
        status = f" HTTP {rec.status}" if rec.status else ""
        raise LoadError(f"warm-up request to {where} failed ({rec.error}{status}): {rec.detail}")
    return rec
