#!/usr/bin/env python3
"""Decode at depth, attributed: TPOT of the demo's variants (FP16, INT8, INT4) with 0 to 8,000 tokens
already in the KV cache, on llama.cpp (flash attention off and on, llama-bench's figure beside each
depth) and on the compiled PyTorch engine, in one run; each row split into its causes (weights'
bytes, the kernels' arithmetic beyond them, the KV cache, fixed overhead: quantkit bench's
attribution) and the rule check across variants and depths with non-negative terms. Each engine is
one `quantkit bench --depth` process over every variant (its own probes before and after, its own
rule check), one after the other.

The variants: --models, else the demo (FP16) and its INT8 RTN and INT4 RTN g32 symmetric artifacts,
made once under --out; llama.cpp benches their exact GGUFs (F16, Q8_0, Q4_0; exported on the fly
into quantkit's cache), PyTorch the checkpoints.

  python benchmarks/depth.py --out runs/depth --threads 2            # depths 0,2048,8000, both engines
  python benchmarks/depth.py --out runs/depth --threads 2 --plan     # each engine's --plan estimate only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.bench.bench_records import BenchResult
from quantkit.bench.row_parts import Anchor
from quantkit.bench.rows import point_of
from quantkit.core.fits import GOOD_FIT, describe_fit

LB_TOLERANCE = 0.05  # quantkit's rows should agree with llama-bench's within this at every depth
VARIANTS = {  # name -> (recipe, --set overrides)
    "int8-rtn": ("int8-w8a16-rtn", []),
    "int4-rtn-g32": ("int4-w4a16-rtn", ["--set", "steps[0].quantize.group_size=32"]),
}


def make_variants(out: Path) -> list[str]:
    """The demo and its INT8 and INT4 artifacts (made once under `out`)."""
    models = ["demo"]
    for name, (recipe, extra) in VARIANTS.items():
        art = out / name
        if not (art / "quantkit.json").is_file():
            quantkit_json(["convert", recipe, "--model", "demo", *extra, "--out", str(art)])
        models.append(str(art))
    return models


def bench_args(models: list[str], engine: str, a: argparse.Namespace) -> list[str]:
    args = ["bench", *models, "--engine", engine, "--depth", a.depths, "--gen-len", str(a.gen_len)]
    args += ["--repeats", str(a.repeats), "--min-seconds", str(a.min_seconds), "--threads", str(a.threads)]
    if engine == "llamacpp":  # the engine with the flash-attention lever (engine_class(...).flash_attn_lever)
        args += ["--flash-attn", a.flash_attn]
    return args


def rows_of(engine: str, res: BenchResult) -> list[dict]:
    out = []
    fitted = iter(res.fit.measured_over_model)
    for r in res.rows:
        ratio = r.anchor.ratio_tpot if isinstance(r.anchor, Anchor) else None
        a = r.attribution
        model = res.fit.model_s(point_of(r))
        out.append(
            {
                "engine": engine,
                "model": r.name,
                "depth": r.depth,
                "flash_attn": "-" if r.flash_attn is None else ("on" if r.flash_attn else "off"),
                "ttft_ms": r.ttft_ms,
                "tpot_ms": r.tpot_ms,
                "tpot_p90_ms": r.stats.tpot_ms.p90,
                "repeats": r.stats.repeats,
                "predicted_tpot_ms": r.predicted_tpot_ms,
                "efficiency_pct": r.tpot_efficiency * 100,
                "mb_per_token": r.bytes_per_token / 1e6,
                "weights_ms": a.weights_ms if a else None,
                "compute_ms": a.compute_ms if a else None,
                "kv_ms": a.kv_ms if a else None,
                "overhead_ms": a.overhead_ms if a else None,
                "attributed_pct": a.explained * 100 if a else None,
                "bound": a.bound if a else None,
                "fit_ms": model * 1e3 if model is not None and not r.disturbed else None,
                "measured_over_fit": next(fitted) if not r.disturbed and res.fit.coef else None,
                "disturbed": "; ".join(r.disturbed) or None,
                "lb_tpot_ms": r.anchor.tpot_ms if isinstance(r.anchor, Anchor) else None,
                "ratio_lb": ratio,
                "within_5pct": None if ratio is None else abs(ratio - 1) <= LB_TOLERANCE,
                "notes": list(r.notes),
            }
        )
    return out


MAIN = [
    {"key": "engine", "header": "engine"},
    {"key": "model", "header": "variant"},
    {"key": "flash_attn", "header": "flash attn"},
    {"key": "depth", "header": "depth"},
    {"key": "tpot_ms", "header": "TPOT ms", "fmt": "{:.2f}"},
    {"key": "weights_ms", "header": "weights ms", "fmt": "{:.2f}"},
    {"key": "compute_ms", "header": "compute ms", "fmt": "{:.2f}"},
    {"key": "kv_ms", "header": "KV ms", "fmt": "{:.2f}"},
    {"key": "overhead_ms", "header": "overhead ms", "fmt": "{:.2f}"},
    {"key": "attributed_pct", "header": "attributed / measured", "fmt": "{:.0f}%"},
    {"key": "bound", "header": "bound"},
    {"key": "measured_over_fit", "header": "measured / rule check", "fmt": "{:.3f}"},
    {"key": "efficiency_pct", "header": "bytes-only roofline", "fmt": "{:.0f}%"},
    {"key": "ratio_lb", "header": "quantkit / llama-bench", "fmt": "{:.3f}"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the artifacts, plots and bench JSON go")
    ap.add_argument("--models", default=None, help="comma-separated models (default: the demo's FP16, INT8, INT4)")
    ap.add_argument("--engines", default="llamacpp,compiled")
    ap.add_argument("--depths", default="0,2048,8000")
    ap.add_argument("--flash-attn", default="both", help="llama.cpp's setting: on | off | both")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--name", default="depth", help="the result file: benchmarks/results/NAME.json")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--plan", action="store_true", help="print each engine's `bench --plan` estimate and stop")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    models = a.models.split(",") if a.models else make_variants(a.out)
    engines = [e for e in a.engines.split(",") if e]
    if a.plan:
        for engine in engines:
            plan = quantkit_json([*bench_args(models, engine, a), "--plan"])
            print(f"{engine}: about {plan['seconds']:.0f} s ({', '.join(plan['notes'])})")
        return
    rows, benches, fits = [], {}, {}
    for engine in engines:
        print(f"bench {', '.join(models)} on {engine} at depths {a.depths}", file=sys.stderr, flush=True)
        data = quantkit_json(
            [
                *bench_args(models, engine, a),
                "--out",
                str(a.out / f"{engine}.json"),
                "--plot",
                str(a.out / f"{engine}.png"),
                "--force",
            ]
        )
        res = BenchResult.from_json(data)
        benches[engine] = res.to_json()
        rows += rows_of(engine, res)
        fits[engine] = res.fit
    lines = [f"{e}: {describe_fit(f)}" for e, f in fits.items() if f.coef]
    note = (
        f"batch 1, {a.gen_len} generated tokens per repeat ({a.gen_len - 1} timed steps), {a.repeats} repeats after "
        f"one prefill of each depth, {a.threads} threads; llama-bench: `-p 0 -n {a.gen_len} -d DEPTH -fa 0|1`. "
        "weights: the weights' bytes at the streaming rate; compute: the engine's kernels on the weights beyond "
        "it; KV: the engine's time for the cells read (the model's twin decoding at each row's depth); "
        "overhead: the twin's fixed time per step. " + " ".join(f"{line}." for line in lines)
    )
    path = write_result(
        a.name,
        {
            "models": models,
            "depths": [int(d) for d in a.depths.split(",")],
            "rows": rows,
            "fits": {e: f.to_json() for e, f in fits.items()},
            "benches": benches,
            "tables": {"main": {"columns": MAIN, "rows": rows, "note": note}},
        },
        results=a.results,
    )
    print(path)
    for r in rows:
        where = f"{r['engine']} {r['model']} depth {r['depth']} flash attn {r['flash_attn']}"
        if r["within_5pct"] is False:
            print(f"beyond {LB_TOLERANCE:.0%} of llama-bench: {where}: {r['tpot_ms']:.2f} vs {r['lb_tpot_ms']:.2f} ms")
        if r["attributed_pct"] is not None and abs(r["attributed_pct"] - 100) > 10:
            print(f"attribution beyond 10%: {where}: {r['attributed_pct']:.0f}%")
        if r["measured_over_fit"] is not None and abs(r["measured_over_fit"] - 1) > GOOD_FIT:
            print(f"beyond the rule check's {GOOD_FIT:.0%}: {where}: {r['measured_over_fit']:.3f}")


if __name__ == "__main__":
    main()
