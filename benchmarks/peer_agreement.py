#!/usr/bin/env python3
"""quantkit load against a peer (NVIDIA's AIPerf, PyPI `aiperf`) on the same server and the same prompts.

llama.cpp's llama-server serves the demo's F16 GGUF on one core (one thread, one slot, no host
prompt cache), started and stopped here; each client runs on the other core. At every concurrency
level quantkit sends N requests, then AIPerf sends the same N prompts (quantkit's own, handed to it
as a single-turn input file, in the same order), the order of the two alternating from level to
level. Both ask for `max_tokens` tokens with EOS ignored and take token counts from the server.
Compared per level: TTFT P50/P99, quantkit's TPOT against AIPerf's ITL (both the per-request mean
gap after the first token: (latency - TTFT) / (tokens - 1)), and output tokens/s. Percentiles of
both are computed here from each tool's per-request values with one rule (numpy's linear), and
AIPerf's own summary is kept beside them; a P99 difference comes with the 95% interval of its
bootstrap. Each client's CPU share (cores busy) and what other processes used are measured.

AIPerf lives in an environment of its own (never quantkit's), e.g.
  python3 -m venv ~/.cache/qk-peers/aiperf && ~/.cache/qk-peers/aiperf/bin/pip install aiperf

  python benchmarks/peer_agreement.py --aiperf ~/.cache/qk-peers/aiperf/bin/aiperf
  python benchmarks/peer_agreement.py --tabulate     # only tabulate WORK's finished runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from common import QUANTKIT, RESULTS, write_result

from quantkit.gguf import tools
from quantkit.load.cpu import DISTURBED
from quantkit.load.process import free_port, running
from quantkit.load.workload import RequestSource, build_workload

NAME = "peer_agreement"
WITHIN = 0.10  # the agreement asked for: within 10% at every level
DRAWS = 1000
PROMPT_EVAL = re.compile(r"prompt eval time =\s*([0-9.]+) ms")
DECODE_EVAL = re.compile(r"\|\s+eval time =\s*([0-9.]+) ms /\s*(\d+) tokens")
RERUNS = 2  # times a tool's run that other processes disturbed (others > DISTURBED cores) is measured again
QUIET_WAIT_S = 120.0  # before that: wait until the others leave the cores


def prompts(prompt_len: int, seed: int, n: int) -> list[str]:
    """quantkit's own prompts of a run with this seed (workload.RequestSource, completions API)."""
    source = RequestSource(build_workload(prompt_len, 0, 1, "completions"), seed)
    return [" ".join(m["content"] for m in source.next().messages) for _ in range(n)]


def _cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process tree (the server: the supervisor and llama-server)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _children_cpu_s() -> float:
    """CPU seconds of every child this process has waited for (and the children they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _wait_quiet(server_pid: int) -> None:
    """Until other processes than the server's use at most DISTURBED cores (2 s windows), or QUIET_WAIT_S."""
    server = psutil.Process(server_pid)
    deadline = time.perf_counter() + QUIET_WAIT_S
    while time.perf_counter() < deadline:
        busy, served, mine, start = _busy_s(), _cpu_s(server), _cpu_s(psutil.Process()), time.perf_counter()
        time.sleep(2.0)
        wall = time.perf_counter() - start
        others = (_busy_s() - busy - (_cpu_s(server) - served) - (_cpu_s(psutil.Process()) - mine)) / wall
        if others <= DISTURBED:
            return


def run_quantkit(url: str, level: int, args, out: Path) -> dict:
    cmd = QUANTKIT + [
        "load", url, "--model", "m", "--engine", "llamacpp", "--concurrency", str(level), "--prompt-len",
        str(args.prompt_len), "--gen-len", str(args.gen_len), "--max-requests", str(args.requests),
        "--step-seconds", "3600", "--timeout", "600", "--seed", str(level), "--out", str(out), "--force", "--json",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    run = json.loads(out.read_text())
    step = run["steps"][0]
    return {
        "requests": step["completed"],
        "errors": step["error_count"],
        "ttft_ms": step["samples"]["ttft_ms"],
        "tpot_ms": [v for v in step["samples"]["tpot_ms"] if v is not None],
        "output_tokens_per_s": step["output_tokens_per_s"],
        "client_cpu_share": step["cpu"]["client"],
        "server_cpu_share": step["cpu"]["server"],
        "others_cpu_share": step["cpu"]["others"],
        "duration_s": step["duration_s"],
    }


# AIPerf 0.13 given only --concurrency runs its request-rate scheduler with a zero gap
# (timing/intervals.py CONCURRENCY_BURST): while every slot is busy its loop retries without
# sleeping (timing/strategies/request_rate.py execute_phase), so its timing process spins a whole
# core for the run, and on two vCPUs that share a physical core it slows the server beside it. A
# rate far above what the server serves keeps --concurrency the cap and lets the loop sleep between
# ticks: at most 1 ms before a freed slot is refilled (about 0.1% of a request here).
AIPERF_TICKS_PER_S = 1000


def aiperf_command(url: str, level: int, args, data: Path, out: Path) -> list[str]:
    """The `aiperf profile` command for one level: quantkit's prompts, the same lengths, one core."""
    return [
        args.aiperf, "profile", "--model", "m", "--url", url, "--endpoint-type", "completions", "--streaming",
        "--input-file", str(data), "--custom-dataset-type", "single_turn", "--dataset-sampling-strategy",
        "sequential", "--concurrency", str(level), "--request-count", str(args.requests), "--warmup-request-count",
        "1", "--use-legacy-max-tokens", "--extra-inputs", f"max_tokens:{args.gen_len}", "--extra-inputs",
        "ignore_eos:true", "--use-server-token-count", "--tokenizer", args.tokenizer, "--output-artifact-dir",
        str(out), "--ui-type", "none", "--request-timeout-seconds", "600",
        # its processes share one core: one worker and one record processor carry 4 requests in flight,
        # and nothing it polls (llama-server has no /metrics unless asked; there is no GPU)
        "--workers-max", "1", "--record-processors", "1", "--no-server-metrics", "--no-gpu-telemetry",
        "--request-rate", str(AIPERF_TICKS_PER_S), "--arrival-pattern", "constant",  # no spinning (above)
    ]  # fmt: skip


def run_aiperf(url: str, level: int, args, work: Path, server_pid: int) -> dict:
    """AIPerf with quantkit's prompts; its per-request records, its own summary, its CPU."""
    data = work / f"prompts-{level}.jsonl"
    data.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts(args.prompt_len, level, args.requests)))
    out = work / f"aiperf-{level}"
    cmd = aiperf_command(url, level, args, data, out)
    server = psutil.Process(server_pid)
    busy, served, start, before = _busy_s(), _cpu_s(server), time.perf_counter(), _children_cpu_s()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    client = _children_cpu_s() - before  # AIPerf and every worker process it started and waited for
    if proc.returncode:
        raise SystemExit(f"aiperf failed at concurrency {level}: {proc.stderr[-600:]}")
    server_share = (_cpu_s(server) - served) / wall
    machine = (_busy_s() - busy) / wall
    return {
        **read_aiperf(out),
        "client_cpu_share": client / wall,  # over AIPerf's whole run, its start-up included
        "server_cpu_share": server_share,
        "others_cpu_share": max(0.0, machine - server_share - client / wall),
        "duration_s": wall,
    }


def read_aiperf(out: Path) -> dict:
    """AIPerf's per-request records of its profiling phase (not the warm-up), as quantkit counts them:
    TTFT and ITL per answered request, output tokens over first send to last end; its summary beside."""
    lines = (out / "profile_export.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    profiled = [r for r in records if r["metadata"].get("benchmark_phase") == "profiling"]
    ok = [r for r in profiled if not r.get("error")]
    if not ok:
        raise SystemExit(f"aiperf answered no request in its profiling phase ({len(profiled)} sent): {out}")
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    span_ns = max(r["metadata"]["request_end_ns"] for r in ok) - min(r["metadata"]["request_start_ns"] for r in ok)
    tokens = sum(r["metrics"]["output_sequence_length"]["value"] for r in ok)
    return {
        "requests": len(ok),
        "errors": len(profiled) - len(ok),
        "ttft_ms": [r["metrics"]["time_to_first_token"]["value"] for r in ok],
        "tpot_ms": [r["metrics"]["inter_token_latency"]["value"] for r in ok if "inter_token_latency" in r["metrics"]],
        "output_tokens_per_s": tokens / (span_ns / 1e9),
        "summary": {
            k: summary.get(k) for k in ("time_to_first_token", "inter_token_latency", "output_token_throughput")
        },
    }


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _diff_ci(a: list[float], b: list[float], q: float, seed: int) -> list[float]:
    """95% interval of P_q(b) - P_q(a) by resampling each tool's requests."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a, float), np.asarray(b, float)
    draws = [
        np.percentile(b[rng.integers(b.size, size=b.size)], q) - np.percentile(a[rng.integers(a.size, size=a.size)], q)
        for _ in range(DRAWS)
    ]
    return [float(x) for x in np.percentile(draws, [2.5, 97.5])]


def compare(level: int, ours: dict, peer: dict) -> list[dict]:
    rows = []
    for metric, peer_metric in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms")):
        for q in (50, 99):
            a, b = _p(ours[metric], q), _p(peer[peer_metric], q)
            low, high = _diff_ci(ours[metric], peer[peer_metric], q, seed=level * 100 + q)
            rows.append(
                {
                    "level": level,
                    "metric": f"{'TTFT' if metric == 'ttft_ms' else 'TPOT vs ITL'} P{q} ms",
                    "quantkit": a,
                    "peer": b,
                    "difference": (a - b) / b,
                    "within": abs(a - b) / b <= WITHIN,
                    "peer_minus_ours_ci95_ms": [low, high],
                }
            )
    a, b = ours["output_tokens_per_s"], peer["output_tokens_per_s"]
    rows.append(
        {
            "level": level,
            "metric": "output tokens/s",
            "quantkit": a,
            "peer": b,
            "difference": (a - b) / b,
            "within": abs(a - b) / b <= WITHIN,
            "peer_minus_ours_ci95_ms": None,
        }
    )
    return rows


def server_timings(ran: list[dict], log: str, requests: int) -> None:
    """Each run's prompt time and decode time per token as llama-server logged them (`prompt eval
    time`, `eval time`: a line each per request, in the order served): a run is its warm-up and its
    requests, so the log splits by count. Where the count differs (an error, a line lost), no run
    gets the server's figures."""
    prompt = [float(m.group(1)) for m in PROMPT_EVAL.finditer(log)]
    decode = [float(ms) / int(n) for ms, n in DECODE_EVAL.findall(log) if int(n)]
    if len(prompt) != len(ran) * (1 + requests) or len(decode) != len(prompt):
        print(
            f"server log: {len(prompt)} prompt lines for {len(ran)} runs of 1 + {requests}: not split", file=sys.stderr
        )
        return
    for i, run in enumerate(ran):
        start = i * (1 + requests) + 1  # after the run's warm-up
        run["server_prefill_ms"] = prompt[start : start + requests]
        run["server_decode_ms"] = decode[start : start + requests]


def measure(args, work: Path) -> dict:
    server_bin = tools.locate("llama-server", "peer agreement")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(server_bin), "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-np", "1",
           "-c", "2048", "--cache-ram", "0"]  # fmt: skip
    cores = tuple(int(c) for c in args.server_cpus.split(","))
    os.sched_setaffinity(0, [int(c) for c in args.client_cpus.split(",")])  # both clients inherit it
    levels = [int(x) for x in args.levels.split(",")]
    raw: dict = {"levels": {}}
    ran: list[dict] = []  # every tool's run in order, disturbed ones included: the server's log in the same order
    with running(cmd, url, work / "server.log", {}, "/health", 300, cores) as server:
        for i, level in enumerate(levels):
            order = ("quantkit", "aiperf") if i % 2 == 0 else ("aiperf", "quantkit")
            found = {}
            for tool in order:
                for attempt in range(1 + RERUNS):
                    print(f"concurrency {level}: {tool}", file=sys.stderr)
                    if tool == "quantkit":
                        found[tool] = run_quantkit(url, level, args, work / f"quantkit-{level}.json")
                    else:
                        found[tool] = run_aiperf(url, level, args, work, server.proc.pid)
                    found[tool]["attempts"] = attempt + 1
                    ran.append(found[tool])
                    if found[tool]["others_cpu_share"] <= DISTURBED:
                        break
                    print(f"  disturbed: others used {found[tool]['others_cpu_share']:.2f} cores", file=sys.stderr)
                    _wait_quiet(server.proc.pid)
            raw["levels"][str(level)] = {"order": list(order), **found}
    server_timings(ran, (work / "server.log").read_text(errors="replace"), args.requests)
    (work / "raw.json").write_text(json.dumps(raw))
    return raw


def tabulate(raw: dict, args) -> dict:
    rows, clients = [], []
    for level, found in raw["levels"].items():
        rows += compare(int(level), found["quantkit"], found["aiperf"])
        for tool in ("quantkit", "aiperf"):
            f = found[tool]
            clients.append(
                {
                    "level": int(level),
                    "tool": tool,
                    "requests": f["requests"],
                    "errors": f["errors"],
                    "client_cpu_share": f["client_cpu_share"],
                    "server_cpu_share": f["server_cpu_share"],
                    "others_cpu_share": f["others_cpu_share"],
                    "server_prefill_p50": _p(f["server_prefill_ms"], 50) if f.get("server_prefill_ms") else None,
                    "server_prefill_p99": _p(f["server_prefill_ms"], 99) if f.get("server_prefill_ms") else None,
                    "server_decode_p50": _p(f["server_decode_ms"], 50) if f.get("server_decode_ms") else None,
                    "server_decode_p99": _p(f["server_decode_ms"], 99) if f.get("server_decode_ms") else None,
                    "runs": f.get("attempts", 1),
                    "disturbed": "yes" if f["others_cpu_share"] > DISTURBED else "no",
                }
            )
    fmt = {"level": "{}", "metric": "{}", "quantkit": "{:.1f}", "peer": "{:.1f}", "difference": "{:+.1%}"}
    columns = [
        {"key": "level", "header": "concurrency", "fmt": fmt["level"]},
        {"key": "metric", "header": "metric", "fmt": fmt["metric"]},
        {"key": "quantkit", "header": "quantkit", "fmt": fmt["quantkit"]},
        {"key": "peer", "header": "AIPerf", "fmt": fmt["peer"]},
        {"key": "difference", "header": "quantkit vs AIPerf", "fmt": fmt["difference"]},
        {"key": "ci", "header": "AIPerf - quantkit, 95% ms", "fmt": "{}"},
        {"key": "verdict", "header": "within 10%", "fmt": "{}"},
    ]
    shown = [
        {
            **r,
            "ci": "-"
            if not r["peer_minus_ours_ci95_ms"]
            else "[{:+.1f}, {:+.1f}]".format(*r["peer_minus_ours_ci95_ms"]),
            "verdict": "yes" if r["within"] else "no",
        }
        for r in rows
    ]
    client_cols = [
        {"key": "level", "header": "concurrency", "fmt": "{}"},
        {"key": "tool", "header": "client", "fmt": "{}"},
        {"key": "requests", "header": "answered", "fmt": "{}"},
        {"key": "errors", "header": "errors", "fmt": "{}"},
        {"key": "client_cpu_share", "header": "client CPU (cores)", "fmt": "{:.2f}"},
        {"key": "server_cpu_share", "header": "server CPU (cores)", "fmt": "{:.2f}"},
        {"key": "others_cpu_share", "header": "others' CPU (cores)", "fmt": "{:.2f}"},
        {"key": "server_prefill_p50", "header": "server's prefill P50 ms (its log)", "fmt": "{:.0f}"},
        {"key": "server_prefill_p99", "header": "server's prefill P99 ms", "fmt": "{:.0f}"},
        {"key": "server_decode_p50", "header": "server's decode P50 ms/token", "fmt": "{:.1f}"},
        {"key": "server_decode_p99", "header": "server's decode P99 ms/token", "fmt": "{:.1f}"},
        {"key": "runs", "header": "runs (disturbed ones measured again)", "fmt": "{}"},
        {"key": "disturbed", "header": f"kept run disturbed (others > {DISTURBED} cores)", "fmt": "{}"},
    ]
    note = (
        f"llama-server (the demo's F16 GGUF, one thread, one slot, --cache-ram 0) on core {args.server_cpus}, "
        f"each client on core {args.client_cpus}; {args.requests} requests per level and tool, the same "
        f"{args.prompt_len}-word prompts (quantkit's, in the same order), {args.gen_len} tokens each with EOS ignored. "
        "Percentiles of both from their per-request values (numpy, linear)."
    )
    return {
        "tables": {
            "agreement": {"columns": columns, "rows": shown, "note": note},
            "clients": {"columns": client_cols, "rows": clients},
        },
        "all_within": all(r["within"] for r in rows),
        "levels": sorted(int(k) for k in raw["levels"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aiperf", default=str(Path.home() / ".cache/qk-peers/aiperf/bin/aiperf"))
    ap.add_argument("--model", help="a GGUF [default: the demo's F16, exported into WORK]")
    ap.add_argument("--levels", default="1,2,4")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--work", default="runs/peer-agreement")
    ap.add_argument("--tabulate", action="store_true", help="only tabulate WORK/raw.json")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    demo = subprocess.run(QUANTKIT + ["models", "path", "demo"], capture_output=True, text=True, check=True).stdout
    args.tokenizer = demo.strip()
    if args.tabulate:
        raw = json.loads((work / "raw.json").read_text())
        ran = [raw["levels"][level][tool] for level in raw["levels"] for tool in raw["levels"][level]["order"]]
        if all(run.get("attempts", 1) == 1 for run in ran):  # the log's runs in order: split it again
            server_timings(ran, (work / "server.log").read_text(errors="replace"), int(args.requests))
    else:
        if not args.model:
            args.model = work / "demo-f16.gguf"
            if not args.model.is_file():
                subprocess.run(
                    QUANTKIT + ["export", args.tokenizer, "--format", "gguf", "--out", str(args.model)], check=True
                )
        random.seed(0)
        raw = measure(args, work)
    previous = RESULTS / f"{NAME}.json"
    kept = (
        {k: json.loads(previous.read_text())[k] for k in ("command", "date")}
        if args.tabulate and previous.is_file()
        else {}
    )
    build = {"llama_server": tools.version("llama-server"), "aiperf": _aiperf_version(args.aiperf)}
    path = write_result(
        NAME, {**kept, "build": build, "settings": {k: str(v) for k, v in vars(args).items()}, **tabulate(raw, args)}
    )
    print(path, file=sys.stderr)


def _aiperf_version(binary: str) -> str | None:
    try:
        return (
            subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
            .stdout.strip()
            .splitlines()[-1]
        )
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


if __name__ == "__main__":
    main()
