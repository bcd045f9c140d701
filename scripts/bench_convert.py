#!/usr/bin/env python3
"""Conversion wall time, peak RSS and accuracy of each recipe on the demo model.

Each recipe is converted by its own `quantkit convert` process (so peak RSS is per recipe), then
evaluated with `quantkit eval` on held-out windows (the first half of the text; calibration
draws from the second half). Prints a markdown table; writes JSON next to the artifacts.

  .venv/bin/python scripts/bench_convert.py --text ../shared/data/wikitext2-valid.txt \
      --recipes int8-w8a16-gptq int4-w4a16-gptq-g64 int4-w4a16-rtn --max-tokens 8192
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
Q = [str(REPO / ".venv" / "bin" / "quantkit")]


def sh(args: list[str]) -> dict:
    proc = subprocess.run(Q + args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--text", required=True, help="a text file: calibration on its second half, evaluation on its first")
    ap.add_argument("--calib", default=None, help="calibration SPEC (default: file:TEXT)")
    ap.add_argument("--recipes", nargs="+", required=True, help="recipe names in recipes/ or paths")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra --set for every convert (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--out-dir", default="runs/bench-convert")
    ap.add_argument("--label-suffix", default="")
    args = ap.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    calib = args.calib or f"file:{args.text}"
    rows = []
    for r in args.recipes:
        recipe = Path(r) if Path(r).is_file() else REPO / "recipes" / f"{r}.yaml"
        name = recipe.stem + args.label_suffix
        art = out_dir / name
        extra = [x for s in args.sets for x in ("--set", s)]
        t = time.perf_counter()
        try:
            meta = sh(["convert", str(recipe), "--model", args.model, "--out", str(art), "--calib", calib, "--force", *extra, "--json"])
            ev = sh(["eval", str(art), "--baseline", args.model, "--text", f"file:{args.text}", "--max-tokens", str(args.max_tokens), "--json"])
        except RuntimeError as exc:
            rows.append({"recipe": name, "error": str(exc)})
            print(f"{name}: FAILED {exc}", file=sys.stderr)
            continue
        from quantkit.sizes import checkpoint_sizes

        row = {"recipe": name, "bits_per_weight": checkpoint_sizes(art)["bits_per_weight"], "convert_s": meta["wall_seconds"],
               "peak_rss_mb": meta["peak_rss_mb"], "ppl": ev["ppl"], "baseline_ppl": ev["baseline_ppl"], "delta_ppl_pct": ev["delta_ppl_pct"],
               "ci95_delta_ppl_pct": ev["ci95"]["delta_ppl_pct"], "kld_mean": ev["kld"]["mean"], "kld_p99": ev["kld"]["p99"],
               "top1": ev["top1_agreement"], "eval_windows": ev["windows"]["count"], "calib_tokens": (meta.get("calibration") or {}).get("tokens"),
               "wall_s": time.perf_counter() - t}
        rows.append(row)
        (out_dir / f"{name}.json").write_text(json.dumps({"convert": meta, "eval": ev, "row": row}, indent=2, default=str))
        print(f"{name}: {row['bits_per_weight']:.2f} bpw, {row['convert_s']:.0f} s, dPPL {row['delta_ppl_pct']:+.2f}%, KL {row['kld_mean']:.4f}", file=sys.stderr)
    print("| recipe | bits/weight | convert s | peak RSS MB | calib tokens | PPL | ΔPPL % (95% CI) | KL mean | KL p99 | top-1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['recipe']} | failed: {r['error'][:60]} |||||||||")
            continue
        lo, hi = r["ci95_delta_ppl_pct"]
        print(f"| {r['recipe']} | {r['bits_per_weight']:.2f} | {r['convert_s']:.0f} | {r['peak_rss_mb']:.0f} | {r['calib_tokens'] or 0} | {r['ppl']:.2f} | "
              f"{r['delta_ppl_pct']:+.2f} ({lo:+.1f}, {hi:+.1f}) | {r['kld_mean']:.4f} | {r['kld_p99']:.3f} | {r['top1'] * 100:.1f}% |")


if __name__ == "__main__":
    main()
