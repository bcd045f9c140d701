#!/usr/bin/env python3
"""Conversion wall time, peak RSS and accuracy of each recipe on the demo model, on several domains.

Each recipe is converted by its own `quantkit convert` process (so peak RSS is per recipe), then
evaluated with `quantkit eval` on held-out windows (the first half of each text; calibration
draws from the second half), once per `--text` and `--ood-text`. Prints a markdown table; writes
JSON next to the artifacts. `--threads N` runs every process with N CPU threads (OMP_NUM_THREADS),
so the same recipe can be compared at 1 and 2 threads.

  .venv/bin/python benchmarks/accuracy.py --text ../shared/data/wikitext2-valid.txt \
      --ood-text set:legal-licenses --recipes int4-w4a16-rtn int4-w4a16-spinquant-gptq-g64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
Q = [str(REPO / ".venv" / "bin" / "quantkit")]


def cpu_seconds() -> float:
    """User + system CPU time of the finished child processes so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sh(args: list[str], threads: int | None) -> dict:
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    cpu = cpu_seconds()
    proc = subprocess.run(Q + args, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["?"])[-1])
    # CPU seconds beside wall time: on a shared machine wall time grows with the other jobs, CPU time
    # much less (at 1 thread it is about the quiet wall time; at 2, OpenMP's spin-waits inflate it).
    return {**json.loads(proc.stdout), "_cpu_s": cpu_seconds() - cpu}


def accuracy(ev: dict) -> dict:
    return {"ppl": ev["ppl"], "baseline_ppl": ev["baseline_ppl"], "delta_ppl_pct": ev["delta_ppl_pct"],
            "ci95_delta_ppl_pct": ev["ci95"]["delta_ppl_pct"], "kld_mean": ev["kld"]["mean"], "ci95_kld_mean": ev["ci95"]["kld_mean"],
            "kld_p99": ev["kld"]["p99"], "top1": ev["top1_agreement"], "eval_windows": ev["windows"]["count"]}


def run_one(recipe: Path, name: str, args, texts: list[str]) -> dict:
    from quantkit.models.sizes import checkpoint_sizes

    art = Path(args.out_dir) / name
    extra = [x for s in args.sets for x in ("--set", s)]
    t = time.perf_counter()
    if args.eval_only:
        meta = json.loads((art / "quantkit.json").read_text())
    else:
        meta = sh(["convert", str(recipe), "--model", args.model, "--out", str(art), "--calib", args.calib or f"file:{args.text}",
                   "--force", *extra, "--json"], args.threads)
    evals = {spec: sh(["eval", str(art), "--baseline", args.model, "--text", spec, "--max-tokens", str(args.max_tokens), "--json"], args.threads)
             for spec in texts}
    domains = {spec: accuracy(ev) for spec, ev in evals.items()}
    row = {"recipe": name, "bits_per_weight": checkpoint_sizes(art)["bits_per_weight"], "convert_s": meta["wall_seconds"], "convert_cpu_s": meta.get("_cpu_s"),
           "peak_rss_mb": meta["peak_rss_mb"], "threads": (meta.get("runtime") or {}).get("torch_num_threads"),
           "calib": (meta.get("calibration") or {}).get("source"), "calib_tokens": (meta.get("calibration") or {}).get("tokens"),
           **domains[texts[0]], "domains": domains, "wall_s": time.perf_counter() - t}
    (Path(args.out_dir) / f"{name}.json").write_text(json.dumps({"convert": meta, "eval": evals, "row": row}, indent=2, default=str))
    return row


def table(rows: list[dict], texts: list[str]) -> list[str]:
    heads = " | ".join(f"ΔPPL % (95% CI) / KL / top-1, {t}" for t in texts)
    out = [f"| recipe | threads | bits/weight | convert s (CPU s) | peak RSS MB | calib tokens | {heads} |",
           "|---|---|---|---|---|---|" + "---|" * len(texts)]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['recipe']} | failed: {r['error'][:80]} |")
            continue
        cells = []
        for t in texts:
            d = r["domains"][t]
            lo, hi = d["ci95_delta_ppl_pct"]
            cells.append(f"{d['delta_ppl_pct']:+.2f} ({lo:+.1f}, {hi:+.1f}) / {d['kld_mean']:.4f} / {d['top1'] * 100:.1f}%")
        cpu = f" ({r['convert_cpu_s']:.0f})" if r.get("convert_cpu_s") is not None else ""
        out.append(f"| {r['recipe']} | {r['threads']} | {r['bits_per_weight']:.2f} | {r['convert_s']:.0f}{cpu} | {r['peak_rss_mb']:.0f} | "
                   f"{r['calib_tokens'] or 0} | {' | '.join(cells)} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--text", required=True, help="a text file: calibration on its second half, evaluation on its first")
    ap.add_argument("--ood-text", action="append", default=[], help="another text SPEC to evaluate on (repeatable), e.g. set:legal-licenses")
    ap.add_argument("--calib", default=None, help="calibration SPEC (default: file:TEXT)")
    ap.add_argument("--recipes", nargs="+", required=True, help="recipe names in recipes/ or paths")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra --set for every convert (repeatable)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for every process (OMP_NUM_THREADS); default: torch's")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the artifacts already in --out-dir, converting nothing")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--out-dir", default="runs/bench-convert")
    ap.add_argument("--label-suffix", default="")
    args = ap.parse_args()
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    texts = [f"file:{args.text}", *args.ood_text]
    rows = []
    for r in args.recipes:
        recipe = Path(r) if Path(r).is_file() else REPO / "recipes" / f"{r}.yaml"
        name = recipe.stem + args.label_suffix
        try:
            row = run_one(recipe, name, args, texts)
        except RuntimeError as exc:
            rows.append({"recipe": name, "error": str(exc)})
            print(f"{name}: FAILED {exc}", file=sys.stderr)
            continue
        rows.append(row)
        print(f"{name}: {row['bits_per_weight']:.2f} bpw, {row['convert_s']:.0f} s, "
              + ", ".join(f"{t}: dPPL {d['delta_ppl_pct']:+.2f}% KL {d['kld_mean']:.4f}" for t, d in row["domains"].items()), file=sys.stderr)
    print("\n".join(table(rows, texts)))


if __name__ == "__main__":
    main()
