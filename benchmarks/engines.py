#!/usr/bin/env python3
"""The demo at batch 1 on every CPU engine, in one table: quantkit's compiled PyTorch engine, llama.cpp
(llama-cpp-python, with llama-bench's own figures for the same GGUF beside it) and vLLM's CPU build,
on the FP16 model and on one INT4 artifact that every engine runs with the same weights (INT4 RTN g32
symmetric: compressed-tensors for PyTorch and vLLM, its exact Q4_0 GGUF for llama.cpp).

Each cell is one `quantkit bench --json` process (same prompt, lengths and threads), run one after the
other in this run; the roofline column is each row's measured TPOT against bytes per token over this
machine's probed bandwidth (quantkit's own accounting, so engines compare on the same footing).

  python benchmarks/engines.py --fp16 demo --fp16-gguf F16.gguf --int4 INT4_G32_DIR --int4-gguf Q4_0.gguf --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time

from common import quantkit_json, write_result

from quantkit.bench.bench_records import BenchResult
from quantkit.bench.row_parts import Anchor

ENGINES = ("compiled", "llamacpp", "vllm")


def cell(path: str, engine: str, args) -> dict:
    t0 = time.monotonic()
    try:
        out = quantkit_json(
            [
                "bench",
                path,
                "--engine",
                engine,
                "--threads",
                str(args.threads),
                "--prompt-len",
                str(args.prompt_len),
                "--gen-len",
                str(args.gen_len),
                "--repeats",
                str(args.repeats),
                "--no-self-check",
            ]
        )
    except RuntimeError as exc:
        return {"error": str(exc)}
    row = BenchResult.from_json(out).rows[0]
    anchor = row.anchor if isinstance(row.anchor, Anchor) else None
    return {
        k: getattr(row, k)
        for k in (
            "kernel",
            "kind",
            "dtype",
            "threads",
            "ttft_ms",
            "tpot_ms",
            "predicted_tpot_ms",
            "tpot_efficiency",
            "bytes_per_token",
            "notes",
        )
    } | {
        "llama_bench_tpot_ms": anchor.tpot_ms if anchor else None,
        "llama_bench_tpot_ratio": anchor.ratio_tpot if anchor else None,
        "llama_bench_ttft_ratio": anchor.ratio_ttft if anchor else None,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp16", default="demo")
    ap.add_argument("--fp16-gguf", required=True)
    ap.add_argument("--int4", required=True, help="an INT4 W4A16 RTN g32 symmetric artifact")
    ap.add_argument("--int4-gguf", required=True, help="its exact Q4_0 GGUF (quantkit export)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    inputs = {
        "fp16": {"compiled": args.fp16, "vllm": args.fp16, "llamacpp": args.fp16_gguf},
        "int4-g32": {"compiled": args.int4, "vllm": args.int4, "llamacpp": args.int4_gguf},
    }
    rows = []
    for variant, paths in inputs.items():
        for engine in ENGINES:
            r = {"variant": variant, "engine": engine, **cell(paths[engine], engine, args)}
            print(r, file=sys.stderr, flush=True)
            rows.append(r)
    cols = [
        ("variant", "weights", "{}"),
        ("engine", "engine", "`{}`"),
        ("kernel", "kernel", "{}"),
        ("ttft_ms", "TTFT ms", "{:.0f}"),
        ("tpot_ms", "TPOT ms", "{:.1f}"),
        ("tpot_efficiency", "TPOT vs roofline", "{:.0%}"),
        ("llama_bench_tpot_ms", "llama-bench TPOT ms", "{:.1f}"),
        ("llama_bench_tpot_ratio", "quantkit / llama-bench", "{:.2f}"),
        ("error", "error", "{}"),
    ]
    note = (
        f"Batch 1, {args.prompt_len}-token prompt, {args.gen_len} tokens, "
        f"{args.threads} thread(s) per engine, medians of "
        f"{args.repeats} repeats, one engine at a time. INT4: RTN g32 symmetric, the same integers in every engine."
    )
    print(
        write_result(
            "engines",
            {
                "rows": rows,
                "tables": {
                    "main": {
                        "columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols],
                        "rows": rows,
                        "note": note,
                    }
                },
            },
        )
    )


if __name__ == "__main__":
    main()
