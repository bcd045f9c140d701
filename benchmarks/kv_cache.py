#!/usr/bin/env python3
"""A quantized KV cache on the demo: what it costs in accuracy and what it buys at depth.

One artifact, the demo converted with `int4-w4a16-gptq-g64-kv-fp8` (INT4 GPTQ g64 weights, FP8 E4M3
K/V scales calibrated in the same pass), so every row has the same weights and differs in its cache:

- `--part eval`: the artifact scored against FP16 at whole windows by position in the window, in
  transformers with the checkpoint's FP8 K/V rounding and with it off (`--kv-cache f16`), and as
  its exact GGUF in llama.cpp with f16, q8_0 and q4_0 caches (flash attention on in every llama.cpp
  row, so the rows differ in the cache alone); each cache's KL beside its engine's 16-bit cache's.
- `--part bench`: TPOT at KV depths on llama.cpp with each cache type (`quantkit bench --kv-cache
  f16,q8_0,q4_0 --flash-attn on --depth ...`), each ratio to the f16 cache's at the same depth beside
  the roofline's (the bytes each step reads: the weights plus the cells attention spans at the
  cache type's bytes), and the compiled engine's 16-bit cache at the same depths.

  python benchmarks/kv_cache.py --out runs/kv-cache --part eval               # accuracy (no timing)
  python benchmarks/kv_cache.py --out runs/kv-cache --part bench --threads 2  # speed: a quiet machine
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.bench.bench_records import BenchResult
from quantkit.core.eval_results import EvalResult

RECIPE = "int4-w4a16-gptq-g64-kv-fp8"
# (eval engine, --kv-cache, --flash-attn): what each accuracy row scores with
EVALS = (
    ("transformers", None, None),  # the checkpoint's FP8 K/V rounding, as transformers loads it
    ("transformers", "f16", None),  # the same weights, the rounding off
    ("llamacpp", "f16", "on"),
    ("llamacpp", "q8_0", "on"),
    ("llamacpp", "q4_0", "on"),
)


def make_artifact(out: Path, a: argparse.Namespace) -> Path:
    art = out / RECIPE
    if not (art / "quantkit.json").is_file():
        args = ["convert", RECIPE, "--model", a.baseline, "--out", str(art), "--force"]
        args += [x for s in a.set for x in ("--set", s)]
        quantkit_json(args)
    return art


def eval_args(model: str, engine: str, cache: str | None, fa: str | None, a: argparse.Namespace) -> list[str]:
    args = ["eval", model, "--baseline", a.baseline, "--engine", engine, "--text", a.text]
    args += ["--seq-len", str(a.seq_len), "--max-tokens", str(a.max_tokens), "--position-buckets", a.buckets]
    args += ["--split", a.split]
    args += ["--kv-cache", cache] if cache else []
    return args + (["--flash-attn", fa] if fa else [])


def eval_rows(model: str, a: argparse.Namespace) -> list[dict]:
    rows = []
    for engine, cache, fa in EVALS:
        print(f"eval {model} on {engine}, cache {cache or 'the checkpoint'}", file=sys.stderr, flush=True)
        ev = EvalResult.from_json(quantkit_json(eval_args(model, engine, cache, fa, a)))
        t = ev.primary
        deep = t.positions[-1] if t.positions else None
        rows.append(
            {
                "engine": engine,
                "kv_cache": ev.scorer.get("kv_cache_type") or "16-bit",
                "flash_attn": ev.scorer.get("flash_attn"),
                "kld_mean": t.kld.mean,
                "kld_ci": list(t.ci95.kld_mean),
                "delta_ppl_pct": t.delta_ppl_pct,
                "top1_pct": t.top1_agreement * 100,
                "deep": deep.label if deep else None,
                "deep_kld": deep.kld.mean if deep else None,
                "deep_delta_ppl_pct": deep.delta_ppl_pct if deep else None,
                "deep_top1_pct": deep.top1_agreement * 100 if deep else None,
                "tokens": t.tokens,
                "windows": t.windows.count,
                "kl_kind": t.kl_kind,
            }
        )
    for r in rows:  # each cache beside its engine's 16-bit one: the same weights, the same windows
        ref = _sixteen_bit(rows, r["engine"])
        r["kld_over_16bit"] = r["kld_mean"] - ref["kld_mean"] if ref else None
        r["deep_kld_over_16bit"] = r["deep_kld"] - ref["deep_kld"] if ref and r["deep_kld"] is not None else None
    return rows


def _sixteen_bit(rows: list[dict], engine: str) -> dict | None:
    """The engine's row with a 16-bit cache: llama.cpp's f16, transformers' with the FP8 rounding off."""
    return next((x for x in rows if x["engine"] == engine and x["kv_cache"] in ("f16", "16-bit")), None)


def bench_args(model: str, engine: str, a: argparse.Namespace) -> list[str]:
    args = ["bench", model, "--engine", engine, "--depth", a.depths, "--gen-len", str(a.gen_len)]
    args += ["--repeats", str(a.repeats), "--min-seconds", str(a.min_seconds), "--threads", str(a.threads)]
    if engine == "llamacpp":  # the engine whose cache types are a setting (kv_cache_lever)
        args += ["--kv-cache", a.caches, "--flash-attn", "on"]
    return args


def bench_rows(model: str, a: argparse.Namespace, out: Path) -> tuple[list[dict], dict]:
    rows, benches = [], {}
    for engine in [e for e in a.engines.split(",") if e]:
        print(f"bench {model} on {engine} at depths {a.depths}", file=sys.stderr, flush=True)
        res = BenchResult.from_json(
            quantkit_json([*bench_args(model, engine, a), "--out", str(out / f"{engine}.json")])
        )
        benches[engine] = res.to_json()
        ref = {r.depth: r for r in res.rows if r.kv_cache in ("f16", "bfloat16")}
        for r in res.rows:
            b = ref.get(r.depth)
            rows.append(
                {
                    "engine": engine,
                    "kv_cache": r.kv_cache,
                    "depth": r.depth,
                    "kv_bytes_per_token": r.kv_bytes_per_token,
                    "mb_per_step": r.bytes_per_token / 1e6,
                    "tpot_ms": r.tpot_ms,
                    "tpot_p90_ms": r.stats["tpot_ms"]["p90"],
                    "predicted_tpot_ms": r.predicted_tpot_ms,
                    "tpot_ratio": r.tpot_ms / b.tpot_ms if b else None,
                    "bytes_ratio": r.bytes_per_token / b.bytes_per_token if b else None,
                    "lb_tpot_ms": (r.anchor or {}).get("tpot_ms"),
                    "notes": list(r.notes),
                }
            )
    return rows, benches


EVAL_COLUMNS = [
    {"key": "engine", "header": "engine"},
    {"key": "kv_cache", "header": "KV cache"},
    {"key": "kld_mean", "header": "KL to FP16", "fmt": "{:.4f}"},
    {"key": "kld_ci", "header": "95% CI", "fmt": "{0:.4f}–{1:.4f}"},
    {"key": "kld_over_16bit", "header": "KL − 16-bit cache's", "fmt": "{:+.4f}"},
    {"key": "deep", "header": "deepest positions"},
    {"key": "deep_kld", "header": "KL there", "fmt": "{:.4f}"},
    {"key": "deep_kld_over_16bit", "header": "KL there − 16-bit cache's", "fmt": "{:+.4f}"},
    {"key": "deep_delta_ppl_pct", "header": "ΔPPL % there", "fmt": "{:+.2f}"},
    {"key": "deep_top1_pct", "header": "top-1 there", "fmt": "{:.1f}%"},
]
BENCH_COLUMNS = [
    {"key": "engine", "header": "engine"},
    {"key": "kv_cache", "header": "KV cache"},
    {"key": "depth", "header": "depth"},
    {"key": "kv_bytes_per_token", "header": "KV B/token", "fmt": "{:,.0f}"},
    {"key": "mb_per_step", "header": "MB/step", "fmt": "{:.1f}"},
    {"key": "tpot_ms", "header": "TPOT ms", "fmt": "{:.2f}"},
    {"key": "predicted_tpot_ms", "header": "roofline ms", "fmt": "{:.2f}"},
    {"key": "tpot_ratio", "header": "TPOT ÷ 16-bit cache's", "fmt": "{:.3f}"},
    {"key": "bytes_ratio", "header": "bytes ÷ 16-bit cache's", "fmt": "{:.3f}"},
    {"key": "lb_tpot_ms", "header": "llama-bench ms/token", "fmt": "{:.2f}"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the artifact and the bench JSON go")
    ap.add_argument("--part", choices=("eval", "bench"), required=True)
    ap.add_argument("--model", default=None, help=f"the KV-quantized artifact (default: {RECIPE} of --baseline)")
    ap.add_argument("--baseline", default="demo")
    ap.add_argument("--set", action="append", default=[], help="a convert --set, repeatable (the artifact's recipe)")
    ap.add_argument("--text", default="set:world-factbook")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=32768)
    ap.add_argument("--buckets", default="512,4096")
    ap.add_argument("--split", default="all")
    ap.add_argument("--engines", default="llamacpp,compiled", help="--part bench: the engines")
    ap.add_argument("--caches", default="f16,q8_0,q4_0", help="--part bench: llama.cpp's cache types")
    ap.add_argument("--depths", default="0,4096,8128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--name", default=None, help="the result file (default: kv-cache-eval or kv-cache-depth)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model = a.model or str(make_artifact(a.out, a))
    if a.part == "eval":
        rows = eval_rows(model, a)
        note = (
            f"The artifact `{RECIPE}` of {a.baseline} against {a.baseline} (FP16), {a.text} ({a.split}), "
            f"{rows[0]['windows']} windows of {a.seq_len} tokens; KL {rows[0]['kl_kind']}; the same INT4 weights in "
            "every row: transformers rounds K and V to FP8 with the checkpoint's scales (or not: 16-bit), llama.cpp "
            "caches them in its own types with flash attention on; each KL beside its engine's 16-bit cache's."
        )
        body = {"model": model, "rows": rows, "tables": {"main": {"columns": EVAL_COLUMNS, "rows": rows, "note": note}}}
    else:
        rows, benches = bench_rows(model, a, a.out)
        note = (
            f"batch 1, {a.gen_len} generated tokens per repeat after one prefill of each depth, {a.repeats} repeats, "
            f"{a.threads} threads; llama.cpp with flash attention on at every cache type (a quantized V cache needs "
            "it); each ratio to the same engine's 16-bit cache at the same depth, beside the ratio of the bytes a step "
            "reads (weights + the cells attention spans, at the cache type's bytes)."
        )
        body = {
            "model": model,
            "depths": [int(d) for d in a.depths.split(",")],
            "rows": rows,
            "benches": benches,
            "tables": {"main": {"columns": BENCH_COLUMNS, "rows": rows, "note": note}},
        }
    print(write_result(a.name or f"kv-cache-{'eval' if a.part == 'eval' else 'depth'}", body, results=a.results))


if __name__ == "__main__":
    main()
