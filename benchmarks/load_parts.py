#!/usr/bin/env python3
"""TTFT under load split into queueing, prefill and the rest, from the server's own timings:
llama.cpp's llama-server (per answer, its `timings`) and vLLM's CPU build (per step, the change of
its /metrics histograms), each on one core with one request decoding at a time (llama-server: one
slot; vLLM: --max-num-seqs 1), the client on the other core, concurrency 1, 2, 4, 8. With one
request served at a time, queue_ms should grow with concurrency while prefill_ms stays flat, and per
request queue + prefill + other equals the client's TTFT (llama-server: within 5%, `mismatched`
counts the requests outside). Writes benchmarks/results/load_parts.json.

  python benchmarks/load_parts.py                   # both engines (vLLM where its environment is installed)
  python benchmarks/load_parts.py --engine llama-server
  python benchmarks/load_parts.py --tabulate        # only tabulate WORK's finished runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from common import QUANTKIT, command, machine, write_result

REQUESTS = 24  # per level: queue growth is plain at this size; the P99s are near the maximum (fewer than 102)
LOAD = {
    "concurrency": "1,2,4,8",
    "no_stop": True,
    "repeats": 1,
    "prompt_len": 128,
    "gen_len": 16,
    "max_requests": REQUESTS,
    "step_seconds": 900,
    "timeout": 900,
    "rerun_disturbed": 2,
}
# vLLM's request-latency buckets (0.3 s and up) are too coarse for a small model's queue and
# prefill times: finer ones, from 10 ms
BUCKETS = {"request_latency": [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1, 1.5, 2, 3, 5, 8, 12, 20, 30, 60]}
STUDIES = {
    "llama-server": {
        "engine": "llama-server",
        "model": "${QK_GGUF}",
        "settings": {"threads": 1, "parallel": 1, "ctx_size": 2048},
    },
    "vllm": {
        "engine": "vllm",
        "model": "${QK_DEMO_MODEL}",
        "settings": {
            "dtype": "bfloat16",
            "enforce_eager": True,
            "max_model_len": 2048,
            "kv_cache_memory_bytes": 1 << 30,
            "max_num_seqs": 1,
            "enable_prefix_caching": False,
            "custom_histogram_buckets": BUCKETS,
        },
        "ready_timeout_s": 900,
    },
}


def study(engine: str) -> dict:
    server = {"cpus": "0", "ready_timeout_s": 300, **STUDIES[engine]}
    return {
        "name": f"parts-{engine}",
        "client_cpus": "1",
        "server": server,
        "load": LOAD,
        "levers": [{"name": engine}],
    }


def measure(engine: str, work: Path) -> None:
    demo = subprocess.run(QUANTKIT + ["models", "path", "demo"], capture_output=True, text=True, check=True)
    gguf = work / "demo-f16.gguf"
    if engine == "llama-server" and not gguf.is_file():
        subprocess.run(QUANTKIT + ["export", demo.stdout.strip(), "--format", "gguf", "--out", str(gguf)], check=True)
    path = work / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(study(engine), sort_keys=False))
    env = {**os.environ, "QK_DEMO_MODEL": demo.stdout.strip(), "QK_GGUF": str(gguf.resolve())}
    out = work / engine
    subprocess.run(QUANTKIT + ["levers", str(path), "--out", str(out), "--force"], env=env, check=True)
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "measured.json").write_text(json.dumps({"command": command(), "machine": machine(), "date": date}))


def _bucket(part: dict, q: str) -> str | None:
    bounds = part.get(f"{q}_bucket_ms")
    return None if not bounds else f"({bounds[0]:.0f}, {bounds[1]:.0f}]"


def table(run: dict) -> dict:
    rows = []
    for step in run["steps"]:
        p = step["ttft_parts"]
        if p.get("absent"):
            rows.append({"level": step["offered"], "queue_p50": None, "note": p["absent"]})
            continue
        rows.append(
            {
                "level": step["offered"],
                "answered": step["completed"],
                "ttft_p50": step["ttft_ms"]["p50"],
                "ttft_p99": step["ttft_ms"]["p99"],
                "queue_mean": p["queue_ms"]["mean"],
                "queue_p50": p["queue_ms"]["p50"],
                "queue_p99": p["queue_ms"]["p99"],
                "prefill_p50": p["prefill_ms"]["p50"],
                "prefill_p99": p["prefill_ms"]["p99"],
                "other_mean": p["other_ms"]["mean"],
                "shares": "/".join(f"{100 * p['share'][k]:.0f}" for k in ("queue", "prefill", "other")),
                "check": (
                    f"{p['check']['mismatched']} of {p['n']} (worst {p['check']['worst_pct']:.1f}%)"
                    if p["per_request"]
                    else f"{p['n']} server requests for {step['completed']} answered"
                ),
                "tpot_p50": step["tpot_ms"]["p50"],
                "others_cpu": (step.get("cpu") or {}).get("others"),
                "prefill_bucket": _bucket(p["prefill_ms"], "p50") if not p["per_request"] else None,
                "scheduler_queue": p["check"].get("scheduler_queue_mean_ms"),  # vLLM: its scheduler's own
            }
        )
    cols = [
        ("level", "concurrency", "{:g}"),
        ("answered", "answered", "{}"),
        ("ttft_p50", "TTFT-P50 ms", "{:.0f}"),
        ("ttft_p99", "TTFT-P99 ms", "{:.0f}"),
        ("queue_mean", "queue mean ms", "{:.0f}"),
        ("queue_p50", "queue P50 ms", "{:.0f}"),
        ("queue_p99", "queue P99 ms", "{:.0f}"),
        ("prefill_p50", "prefill P50 ms", "{:.0f}"),
        ("prefill_p99", "prefill P99 ms", "{:.0f}"),
        ("other_mean", "other mean ms", "{:.1f}"),
        ("shares", "queue/prefill/other share %", "{}"),
        ("check", "parts off TTFT by > 5%", "{}"),
        ("tpot_p50", "TPOT-P50 ms", "{:.1f}"),
        ("others_cpu", "others' CPU (cores)", "{:.2f}"),
    ]
    if any(r.get("scheduler_queue") is not None for r in rows):
        cols.append(("scheduler_queue", "scheduler's queue mean ms", "{:.0f}"))
    if any(r.get("prefill_bucket") for r in rows):
        cols.append(("prefill_bucket", "prefill P50's bucket ms", "{}"))
    first = run["analysis"]["degraded_first"]
    return {
        "columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols],
        "rows": rows,
        "note": f"{run['steps'][0]['ttft_parts'].get('source', {}).get('queue_ms', '')}. Degraded first: "
        f"{first['first']} ({first['cause']}): {first['evidence']}.",
    }


def tabulate(work: Path) -> dict:
    tables, runs = {}, {}
    for engine in STUDIES:
        path = work / engine / f"00-{engine}.json"
        if not path.is_file():
            continue
        run = json.loads(path.read_text())
        tables[engine.replace("-", "_")] = {
            **table(run),
            "source": json.loads((work / engine / "measured.json").read_text()),
        }
        runs[engine] = {k: run[k] for k in ("label", "config", "levels", "analysis", "cpu", "server")}
    return {"tables": tables, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=list(STUDIES), action="append", default=[])
    ap.add_argument("--work", default="runs/load-parts")
    ap.add_argument("--tabulate", action="store_true")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for engine in [] if args.tabulate else (args.engine or list(STUDIES)):
        measure(engine, work)
    found = tabulate(work)
    print(write_result("load_parts", found), file=sys.stderr)


if __name__ == "__main__":
    main()
