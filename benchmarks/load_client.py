"""The ceiling of `quantkit load` itself: how many requests/s and streamed tokens/s the client sustains.

Starts an instant OpenAI-compatible stub server in a separate process (raw asyncio: it answers
every request at once, one SSE chunk per write, as a server streaming tokens does), then drives it
with `quantkit load` at rising concurrency, one client process per level, and reports per level:
achieved req/s and output tokens/s, the client's CPU per request and per streamed token, the
client's and the stub's CPU share (1.0 = one core busy), and the latency the client + loopback
add on their own (TTFT and TPOT against a server that takes no time).

    python benchmarks/load_client.py --concurrency 1,4,16,64,256 --rate 100,400 --gen-len 64 --step-seconds 10
Writes benchmarks/results/NAME.json (--name, default load-client): the levels' table and the ceiling.

The client is the bottleneck when its CPU share nears 1.0 (one asyncio loop, one core). Its
ceiling on one core is 1 / (client CPU per request); on a shared machine, read the CPU figures,
not the req/s. Chunks are sized like vLLM's (~210 bytes), since parsing cost grows with size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, write_result
from render import cell

# ---------------------------------------------------------------- the instant stub (separate process)


def _chunk(payload: dict) -> bytes:
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)  # one HTTP/1.1 chunk per SSE event


def _stream_body(n_tokens: int, chat: bool) -> list[bytes]:
    """Every write of one answer, precomputed: the stub spends its time on I/O, not on JSON."""
    head = {
        "id": "cmpl-8d2f3c9a41b7",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 1717000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
    }
    writes = []
    for i in range(n_tokens):
        choice = {"index": 0, "logprobs": None, "finish_reason": None, "stop_reason": None}
        choice.update({"delta": {"content": f" tok{i % 10}"}} if chat else {"text": f" tok{i % 10}"})
        writes.append(_chunk({**head, "choices": [choice], "usage": None}))
    final = {"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}
    usage = {"prompt_tokens": 128, "completion_tokens": n_tokens, "total_tokens": 128 + n_tokens}
    writes.append(_chunk({**head, "choices": [final], "usage": usage}))
    writes.append(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
    return writes


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cache: dict, gap_s: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = next((int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")), 0)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if method == "GET":
                data = b'{"status":"ok"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(data), data)
                )
                continue
            key = (int(body.get("max_tokens") or 16), path.endswith("chat/completions"))
            if key not in cache:
                cache[key] = _stream_body(*key)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i, piece in enumerate(cache[key]):
                if gap_s and i:
                    await asyncio.sleep(gap_s)  # tokens spaced in time: each arrives in a read of its own
                writer.write(piece)
                await writer.drain()  # one write per token, as a streaming server sends them
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port_file: str, gap_s: float) -> None:
    cache: dict = {}
    server = await asyncio.start_server(lambda r, w: _serve_one(r, w, cache, gap_s), "127.0.0.1", 0, backlog=4096)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------- the driver


def _start_stub(token_ms: float) -> tuple[subprocess.Popen, str]:
    port_file = Path(f"/tmp/qk-bench-stub-{os.getpid()}.port")
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), "--token-ms", str(token_ms)])
    for _ in range(100):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}"
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the stub server did not start")


def _one_level(url: str, mode: str, level: float, args, stub) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "quantkit",
        "load",
        url,
        "--model",
        "stub",
        f"--{mode}",
        f"{level:g}",
        "--gen-len",
        str(args.gen_len),
        "--prompt-len",
        str(args.prompt_len),
        "--step-seconds",
        str(args.step_seconds),
        "--timeout",
        "120",
        "--api",
        args.api,
        "--json",
    ]
    stub_cpu = sum(stub.cpu_times()[:2])
    source = str(args.quantkit or REPO)  # `python -m` puts the working directory first on sys.path
    out = subprocess.run(cmd, cwd=source, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": source})
    stub_cpu = sum(stub.cpu_times()[:2]) - stub_cpu
    if out.returncode:
        raise SystemExit(f"quantkit load failed at {mode} {level:g}: {out.stderr.strip()[-400:]}")
    step = json.loads(out.stdout)["steps"][0]
    cpu_s = step["client"]["cpu_share"] * step["duration_s"]
    tokens = step["output_tokens_per_s"] * step["duration_s"]
    lag = step["client"]["send_lag_ms"]
    return {
        "mode": mode,
        "level": level,
        "requests": step["completed"],
        "errors": step["error_count"],
        "req_per_s": step["achieved_qps"],
        "tokens_per_s": step["output_tokens_per_s"],
        "client_cpu_share": step["client"]["cpu_share"],
        "client_cpu_ms_per_request": 1e3 * cpu_s / step["completed"],
        "client_cpu_us_per_token": 1e6 * cpu_s / tokens,
        # the stub is idle while the client process starts; its CPU is charged to the step's wall time
        "stub_cpu_share": stub_cpu / step["duration_s"],
        "ttft_ms_p50": step["ttft_ms"]["p50"],
        "ttft_ms_p99": step["ttft_ms"]["p99"],
        "tpot_ms_p50": step["tpot_ms"]["p50"],
        "parse_ms_p50": step["client"]["parse_ms"]["p50"],
        # open loop: how late the client sent against the Poisson schedule
        "send_lag_ms_p99": lag["p99"] if lag else None,
    }


COLUMNS = [
    {"key": "load", "header": "load", "fmt": "{}"},
    {"key": "req_per_s", "header": "req/s", "fmt": "{:.0f}"},
    {"key": "tokens_per_s", "header": "tokens/s", "fmt": "{:.0f}"},
    {"key": "client_cpu_share", "header": "client CPU (cores)", "fmt": "{:.2f}"},
    {"key": "client_cpu_ms_per_request", "header": "client CPU ms/request", "fmt": "{:.2f}"},
    {"key": "client_cpu_us_per_token", "header": "client CPU µs/token", "fmt": "{:.1f}"},
    {"key": "stub_cpu_share", "header": "stub CPU (cores)", "fmt": "{:.2f}"},
    {"key": "ttft", "header": "TTFT P50 / P99 ms", "fmt": "{0:.1f} / {1:.1f}"},
    {"key": "send_lag_ms_p99", "header": "send lag P99 ms", "fmt": "{:.1f}"},
]


def _row(r: dict) -> dict:
    return {**r, "load": f"{r['mode']}={r['level']:g}", "ttft": [r["ttft_ms_p50"], r["ttft_ms_p99"]]}


def _table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(c["header"] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in map(_row, rows):
        cells = ["-" if r[c["key"]] is None else cell(r[c["key"]], c["fmt"]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", default="1,4,16,64,256", help="closed-loop levels (empty: none)")
    parser.add_argument(
        "--rate", default="", help="open-loop levels in req/s: the latency the client adds at a given rate"
    )
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--api", default="completions", choices=["completions", "chat"])
    parser.add_argument(
        "--token-ms",
        type=float,
        default=0.0,
        help="the stub's gap between tokens (0: all at once; > 0: each token arrives on its own, "
        "as from a real server, and TTFT is still instant)",
    )
    parser.add_argument("--name", default="load-client", help="the result's name: benchmarks/results/NAME.json")
    parser.add_argument(
        "--quantkit",
        metavar="DIR",
        help="import quantkit from this source tree (e.g. `git archive REV quantkit | tar -x -C DIR`): "
        "another version's client, measured in the same run [default: this repository]",
    )
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.token_ms / 1e3))
        return
    import psutil

    proc, url = _start_stub(args.token_ms)
    try:
        stub = psutil.Process(proc.pid)
        load_before = os.getloadavg()
        rows = []
        levels = [("concurrency", float(x)) for x in args.concurrency.split(",") if x.strip()]
        levels += [("rate", float(x)) for x in args.rate.split(",") if x.strip()]
        for mode, level in levels:
            rows.append(_one_level(url, mode, level, args, stub))
            print(json.dumps(rows[-1]), file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        proc.kill()
        proc.wait()
    best = max(rows, key=lambda r: r["req_per_s"])
    ceiling = {
        "measured_req_per_s": best["req_per_s"],
        "measured_tokens_per_s": best["tokens_per_s"],
        "at": f"{best['mode']}={best['level']:g}",
        # one core fully busy with the client: 1 / (CPU per request) at the busiest level
        "one_core_req_per_s": 1e3 / best["client_cpu_ms_per_request"],
        "one_core_tokens_per_s": 1e6 / best["client_cpu_us_per_token"],
    }
    note = (
        f"Ceiling: {ceiling['measured_req_per_s']:.0f} req/s and {ceiling['measured_tokens_per_s']:.0f} streamed "
        f"tokens/s measured ({ceiling['at']}); one client core: {ceiling['one_core_req_per_s']:.0f} req/s, "
        f"{ceiling['one_core_tokens_per_s']:.0f} tokens/s at {args.gen_len} tokens per answer. Load average "
        f"(1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs."
    )
    print(_table(rows))
    print("\n" + note)
    body = {
        "settings": vars(args) | {"serve": None},
        "load_average": {"before": load_before[0], "after": load_after[0], "cpus": os.cpu_count()},
        "levels": rows,
        "ceiling": ceiling,
        "tables": {"levels": {"columns": COLUMNS, "rows": [_row(r) for r in rows], "note": note}},
    }
    print(write_result(args.name, body), file=sys.stderr)


if __name__ == "__main__":
    main()
