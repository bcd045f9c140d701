#!/usr/bin/env python3
"""Automatic mixed precision beyond the demo: on checkpoints in the shapes of larger models, does
`auto:` run, hold its bits/weight budget, and does `convert --plan` predict its time?

The checkpoints are RANDOM-WEIGHT ones in the exact shapes of public models
(benchmarks/shaped_checkpoint.py): their KL and accuracy mean nothing; the budget arithmetic, the
sensitivity pass's cost and the prediction carry over. The recipe is INT4 RTN g64 with `auto:` at
4.5 bits/weight (benchmarks/recipes/rtn-g64-auto.yaml), so the pass dominates the convert. For each
shape: `convert --plan --json` (predicted seconds, probing this machine in the same run), then the
convert itself (`--json`: wall time, the artifact's bits/weight, the pass's own time).

  python benchmarks/auto_scale.py --shapes qwen2.5-0.5b llama3.2-1b
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, quantkit_json, write_result

RECIPE = "benchmarks/recipes/rtn-g64-auto.yaml"


def one(shape: str, work: Path, calib: str) -> dict:
    model, art = work / shape, work / f"{shape}-auto"
    if not (model / "config.json").is_file():
        subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "shaped_checkpoint.py"), shape, "--out", str(model)], check=True
        )
    shutil.rmtree(art, ignore_errors=True)
    args = ["convert", RECIPE, "--model", str(model), "--out", str(art), "--calib", calib]
    plan = quantkit_json([*args, "--plan"])
    t0 = time.time()
    meta = quantkit_json(args)
    wall = time.time() - t0
    mp = meta.get("mixed_precision") or {}
    predicted = plan["seconds"]
    measured = mp.get("measured_bits_per_weight")  # the saved artifact's, from its headers (quantize/auto.py)
    return {
        "shape": shape,
        "budget_bits": mp.get("budget_bits"),
        "bits_per_weight": measured,
        "searched_bits_per_weight": mp.get("bits_per_weight"),
        "under_budget_by": None if measured is None else mp["budget_bits"] - measured,
        "raised_units": len(mp.get("picked") or []),
        "units": len(mp.get("ranking") or []),
        "pass_s": mp.get("wall_seconds"),
        "convert_s": round(wall, 1),
        "predicted_s": round(predicted, 1),
        "predicted_pass_s": plan["time_breakdown"].get("sensitivity"),
        "ratio": round(wall / predicted, 2),
        "plan_machine": {k: plan["machine"].get(k) for k in ("read_bps", "bf16_flops", "fp32_flops")},
        "mixed_precision": mp,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b", "llama3.2-1b"])
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "benchmarks" / "auto-scale")
    ap.add_argument("--calib", default="mix:default")
    ap.add_argument("--name", default="auto-scale")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes:
        rows.append(one(shape, args.work, args.calib))
        r = rows[-1]
        print(
            f"{shape}: {r['bits_per_weight']} b/w (budget {r['budget_bits']}), convert {r['convert_s']} s, "
            f"predicted {r['predicted_s']} s, pass {r['pass_s']} s",
            file=sys.stderr,
        )
    cols = [
        {"key": "shape", "header": "shape (random weights)", "fmt": "{}"},
        {"key": "budget_bits", "header": "budget bits/weight", "fmt": "{:.2f}"},
        {"key": "bits_per_weight", "header": "artifact bits/weight", "fmt": "{:.4f}"},
        {"key": "raised_units", "header": "units raised to INT8", "fmt": "{}"},
        {"key": "pass_s", "header": "sensitivity pass s", "fmt": "{:.0f}"},
        {"key": "predicted_pass_s", "header": "pass predicted s", "fmt": "{:.0f}"},
        {"key": "convert_s", "header": "convert s", "fmt": "{:.0f}"},
        {"key": "predicted_s", "header": "--plan predicted s", "fmt": "{:.0f}"},
        {"key": "ratio", "header": "measured / predicted", "fmt": "{:.2f}"},
    ]
    table = {
        "columns": cols,
        "rows": rows,
        "note": "Random-weight checkpoints in the shapes of the named models: the budget and the times carry over, "
        "no accuracy does. Recipe: INT4 RTN g64 with auto at 4.5 bits/weight, choices int8, calibration mix:default.",
    }
    print(
        write_result(args.name, {"recipe": RECIPE, "calibration": args.calib, "rows": rows, "tables": {"main": table}})
    )


if __name__ == "__main__":
    main()
