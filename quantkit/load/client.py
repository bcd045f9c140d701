"""Async SSE client for /v1/completions and /v1/chat/completions: one RequestRecord per request.

Per request it stamps the send, every chunk that carries generated text (the first one is the
TTFT point), and the end; it takes token counts from the server's `usage` where present, and it
times its own parsing and bookkeeping so the report can show the client's overhead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from .config import APIS, ENGINES, LoadConfig, LoadError, ServerUnreachable
from .records import RequestRecord

DONE = "[DONE]"


def _completions_body(prompt: str) -> dict:
    return {"prompt": prompt}


def _chat_body(prompt: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}]}


def _completions_text(choice: dict) -> str:
    return choice.get("text") or ""


def _chat_text(choice: dict) -> str:
    delta = choice.get("delta") or {}
    # Reasoning models stream their thinking in a separate field; it is generated tokens too.
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


# API name -> (prompt -> body fields, streamed choice -> generated text)
API_FORMATS: dict[str, tuple[Callable[[str], dict], Callable[[dict], str]]] = {
    "completions": (_completions_body, _completions_text),
    "chat": (_chat_body, _chat_text),
}


def build_body(cfg: LoadConfig, prompt: str, max_tokens: int | None = None) -> dict:
    gen_len = max_tokens or cfg.gen_len
    body = {
        "model": cfg.model,
        "stream": True,
        "max_tokens": gen_len,
        # vLLM and SGLang send usage in the last chunk only when asked; others ignore it.
        "stream_options": {"include_usage": True},
    }
    body.update(API_FORMATS[cfg.api][0](prompt))
    body.update(ENGINES[cfg.engine](gen_len))
    return body


def parse_sse_line(line: str) -> dict | str | None:
    """One SSE line -> the JSON payload, DONE, or None (comments, blank lines, other fields)."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if data == DONE:
        return DONE
    if not data:
        return None
    try:
        payload = json.loads(data)
    except json.JSONDecodeError:
        return {"error": f"unparseable chunk: {data[:80]}"}
    return payload if isinstance(payload, dict) else None


def apply_chunk(rec: RequestRecord, payload: dict, api: str, now: float) -> None:
    """Fold one streamed chunk into the record (pure apart from mutating `rec`)."""
    if payload.get("error"):
        rec.error = "stream_error"
        rec.detail = str(payload["error"])[:200]
        return
    text = "".join(API_FORMATS[api][1](choice) for choice in payload.get("choices") or [])
    if text:
        if rec.t_first is None:
            rec.t_first = now
        rec.chunk_times.append(now)
    usage = payload.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        rec.output_tokens = int(usage["completion_tokens"])
        rec.prompt_tokens = usage.get("prompt_tokens")
        rec.tokens_from_usage = True


def finish_record(rec: RequestRecord, now: float) -> RequestRecord:
    rec.t_end = now
    if not rec.tokens_from_usage:
        # Without usage, each text chunk counts as one token (true for vLLM, SGLang, llama.cpp).
        rec.output_tokens = len(rec.chunk_times)
    if rec.error is None and rec.t_first is None:
        rec.error = "stream_error"
        rec.detail = rec.detail or "the stream ended without generated text"
    return rec


def make_http(cfg: LoadConfig) -> httpx.AsyncClient:
    # No pool limit: a client-side queue would show up as server TTFT. No proxies from the
    # environment: a proxy between client and server would be measured as the server.
    timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=cfg.url, timeout=timeout, limits=limits, trust_env=False)


async def _stream(http: httpx.AsyncClient, cfg: LoadConfig, body: dict, rec: RequestRecord) -> None:
    async with http.stream("POST", APIS[cfg.api], json=body) as response:
        rec.status = response.status_code
        if response.status_code >= 400:
            rec.error = "http_4xx" if response.status_code < 500 else "http_5xx"
            text = (await response.aread()).decode("utf-8", "replace")
            rec.detail = " ".join(text.split())[:200]
            return
        async for line in response.aiter_lines():
            now = time.perf_counter()
            payload = parse_sse_line(line)
            if payload == DONE:
                break
            if payload is not None:
                apply_chunk(rec, payload, cfg.api, now)
            rec.client_s += time.perf_counter() - now
            if rec.error:
                return


async def stream_request(
    http: httpx.AsyncClient,
    cfg: LoadConfig,
    prompt: str,
    t_scheduled: float | None = None,
    max_tokens: int | None = None,
) -> RequestRecord:
    """Send one streaming request; HTTP errors, timeouts and dropped connections become records."""
    body = build_body(cfg, prompt, max_tokens)
    rec = RequestRecord(t_send=time.perf_counter(), t_scheduled=t_scheduled)
    try:
        await asyncio.wait_for(_stream(http, cfg, body, rec), cfg.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec.error, rec.detail = "timeout", f"no complete answer within {cfg.timeout_s:g} s"
    except httpx.HTTPError as exc:
        rec.error, rec.detail = "connection", f"{type(exc).__name__}: {exc}"[:200]
    return finish_record(rec, time.perf_counter())


async def probe(http: httpx.AsyncClient, cfg: LoadConfig, prompt: str) -> RequestRecord:
    """One short request before the staircase: a warm-up, and a clear error if the server is unusable."""
    try:
        await http.get("/health", timeout=cfg.connect_timeout_s)
    except httpx.TransportError as exc:
        raise ServerUnreachable(
            f"cannot reach {cfg.url} within {cfg.connect_timeout_s:g} s ({type(exc).__name__}); "
            "is the server running and the URL right?"
        ) from None
    rec = await stream_request(http, cfg, prompt, max_tokens=min(cfg.gen_len, 8))
    if rec.error == "connection":
        raise ServerUnreachable(f"{cfg.url}: {rec.detail}")
    if rec.error:
        where = f"{cfg.url}{APIS[cfg.api]}"
        status = f" HTTP {rec.status}" if rec.status else ""
        raise LoadError(f"warm-up request to {where} failed ({rec.error}{status}): {rec.detail}")
    return rec
