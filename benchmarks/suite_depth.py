#!/usr/bin/env python3
"""A suite's decode at KV depth, as `quantkit run` reports it: each variant's TPOT at each depth on
each engine with its ratio to the baseline's beside the roofline's (the bytes a step reads over the
baseline's), and the long-context table (bits per weight, the cache's bytes per token and size at
the model's context, TPOT at each depth, the deepest position bucket's accuracy).

It runs `quantkit run SUITE` (finished steps are reused from --out) and writes the report's
`depths` and `long_context` rows, plus each engine's ratios at the deepest depth, to one result file.

  python benchmarks/suite_depth.py --suite suite-gqa --out runs/suite-gqa --name gqa-depth
  python benchmarks/suite_depth.py --suite long-context --out runs/long-context --name long-context
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.pipeline.depths import ContextRow, DepthRow

DEPTH_COLUMNS = [
    {"key": "name", "header": "variant"},
    {"key": "engine", "header": "engine"},
    {"key": "depth", "header": "depth", "fmt": "{:,}"},
    {"key": "kv_cache", "header": "KV cache"},
    {"key": "kv_bytes_per_token", "header": "KV B/token", "fmt": "{:,.0f}"},
    {"key": "mb_per_step", "header": "MB/step", "fmt": "{:.1f}"},
    {"key": "tpot_ms", "header": "TPOT ms", "fmt": "{:.2f}"},
    {"key": "tpot_ratio", "header": "TPOT ÷ baseline's", "fmt": "{:.3f}"},
    {"key": "predicted_ratio", "header": "bytes ÷ baseline's (roofline)", "fmt": "{:.3f}"},
]


def depth_row(d: DepthRow) -> dict:
    return {**d.to_json(), "mb_per_step": d.bytes_per_token / 1e6}


def context_columns(rows: list[ContextRow]) -> list[dict]:
    depths = sorted({x.depth for r in rows for x in r.decode})
    context = max((r.context for r in rows), default=0)
    return [
        {"key": "name", "header": "variant"},
        {"key": "engine", "header": "engine"},
        {"key": "bits_per_weight", "header": "bits/weight", "fmt": "{:.2f}"},
        {"key": "kv_cache", "header": "KV cache"},
        {"key": "kv_bytes_per_token", "header": "KV B/token", "fmt": "{:,.0f}"},
        {"key": "kv_cache_mb", "header": f"KV MB at {context:,}", "fmt": "{:.1f}"},
        *({"key": f"tpot_{d}", "header": f"TPOT ms at {d:,}", "fmt": "{:.2f}"} for d in depths),
        {"key": "positions", "header": "positions"},
        {"key": "deep_delta_ppl_pct", "header": "ΔPPL % there", "fmt": "{:+.2f}"},
        {"key": "deep_kld", "header": "KL there", "fmt": "{:.4f}"},
        {"key": "deep_top1_pct", "header": "top-1 there", "fmt": "{:.1f}%"},
        {"key": "eval_engine", "header": "scored by"},
    ]


def context_row(c: ContextRow) -> dict:
    b = c.bucket
    return {
        **c.to_json(),
        **{f"tpot_{x.depth}": x.tpot_ms for x in c.decode},
        "positions": b.label if b else None,
        "deep_delta_ppl_pct": b.delta_ppl_pct if b else None,
        "deep_kld": b.kld.mean if b else None,
        "deep_top1_pct": b.top1_agreement * 100 if b else None,
    }


def deepest(rows: list[DepthRow]) -> list[dict]:
    """Each variant's ratios at its engine's deepest depth: the figure a summary quotes."""
    at = {}
    for d in rows:
        if d.reference is not None and d.depth >= at.get(d.engine, -1):
            at[d.engine] = d.depth
    return [
        {
            "name": d.name,
            "engine": d.engine,
            "depth": d.depth,
            "tpot_ratio": d.tpot_ratio,
            "predicted": d.predicted_ratio,
        }
        for d in rows
        if d.reference is not None and d.depth == at.get(d.engine) and d.name != d.reference
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True, help="a suite with bench.depths (suite-gqa, long-context, a file)")
    ap.add_argument("--out", type=Path, required=True, help="the run directory (finished steps are reused)")
    ap.add_argument("--model", default=None, help="the suite's model:, or this")
    ap.add_argument("--calib", default=None)
    ap.add_argument("--set", action="append", default=[], help="a `quantkit run --set`, repeatable")
    ap.add_argument("--name", required=True, help="the result file: benchmarks/results/NAME.json")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args()
    args = ["run", a.suite, "--out", str(a.out)]
    args += ["--model", a.model] if a.model else []
    args += ["--calib", a.calib] if a.calib else []
    args += [x for s in a.set for x in ("--set", s)]
    print(f"quantkit {' '.join(args)}", file=sys.stderr, flush=True)
    report = quantkit_json(args)
    depths = [DepthRow.from_json(d) for d in report["depths"]]
    context = [ContextRow.from_json(c) for c in report["long_context"]]
    if not depths:
        raise SystemExit(f"{a.suite}: the run measured no depths (its bench section has no depths)")
    settings = report.get("bench_settings") or {}
    note = (
        f"`quantkit run {a.suite}`: batch 1, {settings.get('gen_len')} generated tokens per repeat after one prefill "
        f"of each depth, {settings.get('repeats')} repeats, llama.cpp flash attention {settings.get('flash_attn')}; "
        "each ratio to the baseline on the same engine at the same depth, beside the ratio of the bytes a step reads "
        "as that engine's cache reads them (the compiled engine: every slot of its static cache; llama.cpp: the used "
        "cells padded to 256)."
    )
    path = write_result(
        a.name,
        {
            "suite": a.suite,
            "run": str(a.out),
            "failed": report.get("failed"),
            "deepest": deepest(depths),
            "tables": {
                "depth": {"columns": DEPTH_COLUMNS, "rows": [depth_row(d) for d in depths], "note": note},
                "context": {"columns": context_columns(context), "rows": [context_row(c) for c in context]},
            },
        },
        results=a.results,
    )
    print(path)


if __name__ == "__main__":
    main()
