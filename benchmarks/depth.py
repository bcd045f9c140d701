#!/usr/bin/env python3
"""Decode at depth: TPOT of the demo's INT4 model with 0 to 8128 tokens already in its KV cache, on
llama.cpp (flash attention off and on, llama-bench's figure beside each depth) and on the compiled
PyTorch engine, in one run. Each engine is one `quantkit bench --depth` process (its own probes
before and after, its own rule check across depths), one after the other.

The model: --model, else the demo's INT4 RTN g32 symmetric artifact, made once under --out
(`quantkit convert int4-w4a16-rtn --model demo --set steps[0].quantize.group_size=32`); llama.cpp
benches its exact Q4_0 GGUF (exported on the fly into quantkit's cache), PyTorch the artifact.

  python benchmarks/depth.py --out runs/depth --threads 2            # the demo, depths 0,1024,4096,8128
  python benchmarks/depth.py --out runs/depth --threads 2 --plan     # each engine's --plan estimate only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.bench.records import BenchResult

LB_TOLERANCE = 0.05  # quantkit's rows should agree with llama-bench's within this at every depth


def make_int4(out: Path) -> Path:
    art = out / "int4-g32"
    if not (art / "quantkit.json").is_file():
        quantkit_json(
            [
                "convert",
                "int4-w4a16-rtn",
                "--model",
                "demo",
                "--set",
                "steps[0].quantize.group_size=32",
                "--out",
                str(art),
            ]
        )
    return art


def bench_args(model: str, engine: str, a: argparse.Namespace) -> list[str]:
    args = ["bench", model, "--engine", engine, "--depth", a.depths, "--gen-len", str(a.gen_len)]
    args += ["--repeats", str(a.repeats), "--min-seconds", str(a.min_seconds), "--threads", str(a.threads)]
    if engine == "llamacpp":  # the engine with the flash-attention lever (engine_class(...).flash_attn_lever)
        args += ["--flash-attn", a.flash_attn]
    return args


def rows_of(engine: str, res: BenchResult) -> list[dict]:
    out = []
    for r in res.rows:
        lb = r.anchor if r.anchor and "tpot_ms" in r.anchor else {}
        ratio = lb.get("ratio_tpot")
        out.append(
            {
                "engine": engine,
                "model": r.name,
                "depth": r.depth,
                "flash_attn": "-" if r.flash_attn is None else ("on" if r.flash_attn else "off"),
                "ttft_ms": r.ttft_ms,
                "tpot_ms": r.tpot_ms,
                "tpot_p90_ms": r.stats["tpot_ms"]["p90"],
                "tpot_std_ms": r.stats["tpot_ms"]["std"],
                "repeats": r.stats["repeats"],
                "predicted_tpot_ms": r.predicted_tpot_ms,
                "efficiency_pct": r.tpot_efficiency * 100,
                "mb_per_token": r.bytes_per_token / 1e6,
                "lb_tpot_ms": lb.get("tpot_ms"),
                "ratio_lb": ratio,
                "within_5pct": None if ratio is None else abs(ratio - 1) <= LB_TOLERANCE,
                "attention_compute": "attention_compute" in r.flags,
                "notes": list(r.notes),
            }
        )
    return out


MAIN = [
    {"key": "engine", "header": "engine"},
    {"key": "flash_attn", "header": "flash attn"},
    {"key": "depth", "header": "depth"},
    {"key": "ttft_ms", "header": "TTFT ms", "fmt": "{:.0f}"},
    {"key": "tpot_ms", "header": "TPOT ms", "fmt": "{:.2f}"},
    {"key": "tpot_p90_ms", "header": "TPOT p90 ms", "fmt": "{:.2f}"},
    {"key": "predicted_tpot_ms", "header": "roofline ms", "fmt": "{:.2f}"},
    {"key": "efficiency_pct", "header": "efficiency", "fmt": "{:.0f}%"},
    {"key": "lb_tpot_ms", "header": "llama-bench ms/token", "fmt": "{:.2f}"},
    {"key": "ratio_lb", "header": "quantkit / llama-bench", "fmt": "{:.3f}"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the INT4 artifact, plots and bench JSON go")
    ap.add_argument("--model", default=None, help="what to bench (default: the demo's INT4 g32 artifact)")
    ap.add_argument("--engines", default="llamacpp,compiled")
    ap.add_argument("--depths", default="0,1024,4096,8128")
    ap.add_argument("--flash-attn", default="both", help="llama.cpp's setting: on | off | both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--name", default="depth", help="the result file: benchmarks/results/NAME.json")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--plan", action="store_true", help="print each engine's `bench --plan` estimate and stop")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model = a.model or str(make_int4(a.out))
    engines = [e for e in a.engines.split(",") if e]
    if a.plan:
        for engine in engines:
            plan = quantkit_json([*bench_args(model, engine, a), "--plan"])
            print(f"{engine}: about {plan['seconds']:.0f} s ({', '.join(plan['notes'])})")
        return
    rows, benches, fits = [], {}, {}
    for engine in engines:
        print(f"bench {model} on {engine} at depths {a.depths}", file=sys.stderr, flush=True)
        data = quantkit_json(
            [
                *bench_args(model, engine, a),
                "--out",
                str(a.out / f"{engine}.json"),
                "--plot",
                str(a.out / f"{engine}.png"),
            ]
        )
        res = BenchResult.from_json(data)
        benches[engine] = res.to_json()
        rows += rows_of(engine, res)
        fits[engine] = res.fit
    lines = [
        f"{e}: TPOT = {f.overhead_ms:.2f} ms + bytes / {f.effective_gbps:.1f} GB/s across depths (R² {f.r2:.3f})"
        for e, f in fits.items()
        if f.effective_gbps
    ]
    note = (
        f"batch 1, {a.gen_len} generated tokens per repeat ({a.gen_len - 1} timed steps), {a.repeats} repeats after "
        f"one prefill of each depth, {a.threads} threads; llama-bench: `-p 0 -n {a.gen_len} -d DEPTH -fa 0|1`; "
        + "; ".join(lines)
    )
    path = write_result(
        a.name,
        {
            "model": model,
            "depths": [int(d) for d in a.depths.split(",")],
            "rows": rows,
            "fits": {e: f.to_json() for e, f in fits.items()},
            "benches": benches,
            "tables": {"main": {"columns": MAIN, "rows": rows, "note": note}},
        },
        results=a.results,
    )
    print(path)
    off = [r for r in rows if r["within_5pct"] is False]
    for r in off:
        print(
            f"beyond {LB_TOLERANCE:.0%} of llama-bench: {r['engine']} depth {r['depth']} flash attn {r['flash_attn']}: "
            f"{r['tpot_ms']:.2f} ms vs {r['lb_tpot_ms']:.2f} ms",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
