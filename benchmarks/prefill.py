#!/usr/bin/env python3
"""TTFT at batch 1 attributed: a prompt sweep from 128 tokens to the context on each engine, split
by `quantkit bench --sweep` into a + b·P + c·P² (the fixed part, the weights' matmuls, attention over
the prompt; each term >= 0), the prompt length where attention passes the weights, and the
prefill's FLOPs at the probe's fastest matmul beside each length. Each engine is one `quantkit
bench` process (its own probes), one after the other.

  python benchmarks/prefill.py --model demo --threads 2      # 128..8,064 tokens, llama.cpp and compiled
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.bench.bench_records import BenchResult

COLUMNS = [
    {"key": "engine", "header": "engine"},
    {"key": "prompt_len", "header": "prompt tokens"},
    {"key": "ttft_ms", "header": "TTFT ms", "fmt": "{:.0f}"},
    {"key": "model_ms", "header": "a + bP + cP² ms", "fmt": "{:.0f}"},
    {"key": "linear_ms", "header": "bP (weights) ms", "fmt": "{:.0f}"},
    {"key": "quadratic_ms", "header": "cP² (attention) ms", "fmt": "{:.0f}"},
    {"key": "floor_ms", "header": "FLOPs at the probe's matmul ms", "fmt": "{:.0f}"},
]


def rows_of(engine: str, res: BenchResult) -> tuple[list[dict], dict]:
    r = res.rows[0]
    f = r.prefill_fit
    rows = [
        {
            "engine": engine,
            "prompt_len": p.prompt_len,
            "ttft_ms": p.ttft_ms.median,
            "model_ms": f.model_ms(p.prompt_len) if f else None,
            "linear_ms": f.per_token_ms * p.prompt_len if f else None,
            "quadratic_ms": f.per_token2_ms * p.prompt_len**2 if f else None,
            "floor_ms": p.predicted_ttft_ms,
        }
        for p in r.prompt_sweep
    ]
    return rows, (f.to_json() if f else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--engines", default="llamacpp,compiled")
    ap.add_argument("--sweep", default="128,256,512,1024,2048,4096,8064")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/prefill"))
    ap.add_argument("--name", default="prefill")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows, fits, benches = [], {}, {}
    for engine in [e for e in a.engines.split(",") if e]:
        print(f"bench {a.model} on {engine}, prompts {a.sweep}", file=sys.stderr, flush=True)
        args = ["bench", a.model, "--engine", engine, "--sweep", a.sweep, "--threads", str(a.threads)]
        args += ["--repeats", str(a.repeats), "--gen-len", "8", "--out", str(a.out / f"{engine}.json"), "--force"]
        res = BenchResult.from_json(quantkit_json(args))
        mine, fits[engine] = rows_of(engine, res)
        rows += mine
        benches[engine] = res.to_json()
    lines = [
        f"{e}: TTFT = {f['fixed_ms']:.0f} ms + {f['per_token_ms']:.3f} ms·P + {f['per_token2_ms']:.2e} ms·P² "
        f"(R² {f['r2']:.3f})"
        + (
            f", attention passes the weights at {f['crossover_tokens']:,.0f} tokens"
            if f.get("crossover_tokens")
            else ""
        )
        for e, f in fits.items()
        if f
    ]
    note = (
        f"batch 1, {a.threads} threads, the median of at least 5 prefills per length after one untimed; "
        "non-negative least squares over the sweep. " + "; ".join(lines)
    )
    path = write_result(
        a.name,
        {"model": a.model, "rows": rows, "fits": fits, "benches": benches,
         "tables": {"main": {"columns": COLUMNS, "rows": rows, "note": note}}},
        results=a.results,
    )  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
