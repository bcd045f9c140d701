"""A scripted OpenAI-compatible SSE server for tests: known timings, a fixed number of slots.

Requests beyond `slots` wait for a free slot (a queue, like a server without batching), so a
staircase past `slots` saturates at slots / service time. Every `fail_every`-th request answers
HTTP 500 and every `hang_every`-th sends headers, then nothing for 30 s (a timeout). Every
`bad_every`-th request (never the first, the warm-up) misbehaves as `misbehave` names (see
load_fixtures/hostile.py). `context` is reported as vLLM does (`/v1/models` max_model_len) or, with
`context_at="props"`, as llama.cpp's server does (`/props` n_ctx). `cache="usage"` reports the words a
prompt shares with the best earlier prompt as `usage.prompt_tokens_details.cached_tokens`,
`cache="timings"` as llama.cpp's `timings.cache_n`/`prompt_n`. `timings=True` sends llama.cpp's clock
(`timings.prompt_ms` from taking a slot to the first token, `predicted_ms` from there to the last),
`metrics=True` keeps vLLM's queue, prefill and TTFT histograms at /metrics. Stdlib only.

    python tests/load_fixtures/fake_server.py --slots 2   # prints the port, serves until killed
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HISTOGRAMS = (
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:time_to_first_token_seconds",
)
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))


class FakeOpenAI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        *,
        slots=2,
        prefill_s=0.08,
        token_s=0.01,
        fail_every=0,
        hang_every=0,
        usage=True,
        misbehave=None,
        bad_every=0,
        context=None,
        context_at="models",
        cache=None,
        done=True,
        timings=False,
        metrics=False,
        drafts=None,
        port=0,
    ):
        super().__init__(("127.0.0.1", port), _Handler)
        self.slots = threading.Semaphore(slots)
        self.prefill_s, self.token_s, self.usage = prefill_s, token_s, usage
        self.fail_every, self.hang_every = fail_every, hang_every
        self.misbehave, self.bad_every = misbehave, bad_every
        self.context, self.context_at, self.cache, self.done = context, context_at, cache, done
        self.timings, self.metrics = timings, metrics
        self.drafts = drafts  # (drafted, accepted) per answer: vLLM's speculative decoding counters
        self.drafted = self.accepted = 0
        self.lock = threading.Lock()
        # vLLM's histograms (seconds): name -> [(bound, count)...], sum, count
        self.histograms = {name: ([0] * len(BUCKETS), [0.0, 0]) for name in HISTOGRAMS}
        self.counter = itertools.count(1)
        self.bodies: list[dict] = []
        self.headers_seen: list[dict] = []
        self.seen_prompts: list[str] = []  # for `cache`: the longest earlier prompt sharing a prefix

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> "FakeOpenAI":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            return self._reply(200, {"status": "ok"})
        if self.path == "/metrics":
            if not self.server.metrics:
                return self._reply(404, {"detail": "Not Found"})
            return self._text(self._metrics_page())
        context = self.server.context
        if self.path == "/props":
            if self.server.context_at != "props":
                return self._reply(404, {"detail": "Not Found"})
            return self._reply(200, {"default_generation_settings": {"n_ctx": context}, "total_slots": 1})
        stated = {"max_model_len": context} if context and self.server.context_at == "models" else {}
        self._reply(200, {"object": "list", "data": [{"id": "m", "object": "model", **stated}]})

    def _metrics_page(self) -> str:
        lines = ["# HELP vllm:num_requests_running Number of requests running.", "vllm:num_requests_running 0.0"]
        with self.server.lock:
            for name, (counts, (total, n)) in self.server.histograms.items():
                lines.append(f"# TYPE {name} histogram")
                cumulative = 0
                for bound, count in zip(BUCKETS, counts):
                    cumulative += count
                    le = "+Inf" if bound == float("inf") else f"{bound}"
                    lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="m"}} {float(cumulative)}')
                lines.append(f'{name}_sum{{engine="0",model_name="m"}} {total}')
                lines.append(f'{name}_count{{engine="0",model_name="m"}} {float(n)}')
            if self.server.drafts:
                lines.append(f"vllm:spec_decode_num_draft_tokens_total {float(self.server.drafted)}")
                lines.append(f"vllm:spec_decode_num_accepted_tokens_total {float(self.server.accepted)}")
        return "\n".join(lines) + "\n"

    def _observe(self, name: str, seconds: float) -> None:
        with self.server.lock:
            counts, totals = self.server.histograms[name]
            counts[next(i for i, b in enumerate(BUCKETS) if seconds <= b)] += 1
            totals[0] += seconds
            totals[1] += 1

    def _text(self, text: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        self.server.headers_seen.append(dict(self.headers))
        n = next(self.server.counter)
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._reply(404, {"detail": "Not Found"})
        if self.server.fail_every and n % self.server.fail_every == 0:
            return self._reply(500, {"detail": "scripted failure"})
        if self.server.hang_every and n % self.server.hang_every == 0:
            self._headers()
            time.sleep(30)  # outlives any test's --timeout; holds no slot
            return
        if self.server.bad_every and n > 1 and n % self.server.bad_every == 0:
            from load_fixtures.hostile import MISBEHAVIOURS

            return MISBEHAVIOURS[self.server.misbehave](self, body)
        arrived = time.perf_counter()
        with self.server.slots:
            self._stream(body, chat=self.path.endswith("chat/completions"), arrived=arrived)

    def _chunk(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

    def _stream(
        self, body: dict, chat: bool, *, tokens: int | None = None, extra=None, done=None, arrived=None
    ) -> None:
        """A well-formed stream; `tokens` stops it early (no finish, no [DONE]); `extra` is a list of
        (position, chunk) to insert; `done=False` leaves out [DONE]."""
        started = time.perf_counter()  # the slot is taken: the prompt starts
        self._headers()
        n_tokens = int(body.get("max_tokens") or 16)
        extra = dict(extra or [])
        time.sleep(self.server.prefill_s)
        first = time.perf_counter()
        if arrived is not None and self.server.drafts:
            with self.server.lock:
                self.server.drafted += self.server.drafts[0]
                self.server.accepted += self.server.drafts[1]
        if arrived is not None and self.server.metrics:
            self._observe(HISTOGRAMS[0], started - arrived)
            self._observe(HISTOGRAMS[1], first - started)
            self._observe(HISTOGRAMS[2], first - arrived)
        if chat:
            self._chunk({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        for i in range(n_tokens if tokens is None else tokens):
            if i:
                time.sleep(self.server.token_s)
            if i in extra:
                self._raw(extra[i])
            text = f" t{i}"
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            self._chunk({"choices": [choice]})
        if tokens is not None:
            return
        last = time.perf_counter()
        final = {"choices": [{"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}]}
        if self.server.timings:  # llama.cpp's clock: the prompt from its slot, the tokens after the first
            final["timings"] = {
                "prompt_n": 16,
                "prompt_ms": 1e3 * (first - started),
                "predicted_ms": 1e3 * (last - first),
            }
        if self.server.usage:
            final["usage"] = self._usage(body, n_tokens)
            if self.server.cache == "timings":  # llama.cpp: usage without details, timings beside it
                cached = final["usage"].pop("prompt_tokens_details")["cached_tokens"]
                final["timings"] = {"cache_n": cached, "prompt_n": final["usage"]["prompt_tokens"] - cached}
        self._chunk(final)
        if self.server.done if done is None else done:
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _raw(self, item) -> None:
        self.wfile.write(item if isinstance(item, bytes) else f"data: {json.dumps(item)}\n\n".encode())
        self.wfile.flush()

    def _usage(self, body: dict, n_tokens: int) -> dict:
        if "prompt" in body:
            text = body["prompt"]
        else:
            text = " ".join(m["content"] for m in body.get("messages") or [])
        words = text.split()
        usage = {"prompt_tokens": len(words), "completion_tokens": n_tokens, "total_tokens": len(words) + n_tokens}
        if self.server.cache:  # a prefix cache: words shared with the best earlier prompt are cached
            best = max((_common(words, seen) for seen in self.server.seen_prompts), default=0)
            self.server.seen_prompts.append(words)
            usage["prompt_tokens_details"] = {"cached_tokens": best}
        return usage


def _common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--token-s", type=float, default=0.01)
    parser.add_argument("--prefill-s", type=float, default=0.08)
    parser.add_argument("--port", type=int, default=0, help="0: any free port, printed on stdout")
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--cache", choices=["usage", "timings"])
    args = parser.parse_args()
    server = FakeOpenAI(
        slots=args.slots,
        token_s=args.token_s,
        prefill_s=args.prefill_s,
        fail_every=args.fail_every,
        cache=args.cache,
        port=args.port,
    )
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
