#!/usr/bin/env python
"""The GQA ladder on the demo model: mean, calibrated, calibrated + recover, GQA + INT4.

Each stage is a `quantkit convert` of a shipped recipe (with --set overrides) followed by
`quantkit eval` against the FP16 demo model on the first half of the text (calibration and
recovery read the second half). Prints the table and the exact commands; writes
OUT/ladder.json. The recover stages each run up to their recipe's 10-minute bound.

    python benchmarks/gqa.py --text TEXT.txt --out runs/gqa
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from quantkit.core.eval_results import EvalResult

REPO = Path(__file__).resolve().parents[1]
QUANTKIT = [str(Path(sys.executable).with_name("quantkit"))]  # the console script beside this interpreter

NO_RECOVER = ["--set", "steps[0].gqa.recover=null"]
STAGES = {
    "mean": ("gqa", ["--set", "steps[0].gqa.merge=mean", "--set", "steps[0].gqa.grouping=contiguous", *NO_RECOVER]),
    "calibrated": ("gqa", NO_RECOVER),
    "calibrated+recover": ("gqa", []),
    "gqa+int4": ("gqa-int4", []),
}


def run(cmd: list[str], env: dict) -> tuple[dict, float, str]:
    shown = " ".join(shlex.quote(c) for c in ["quantkit", *cmd[len(QUANTKIT) :]])
    print(f"$ {shown}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {shown}")
    return json.loads(proc.stdout), time.perf_counter() - t0, shown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--text",
        required=True,
        help="a plain-text file: calibration and recovery read its second half, evaluation its first",
    )
    ap.add_argument("--model", default="demo")
    ap.add_argument("--out", default="runs/gqa", help="where artifacts and ladder.json go")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {', '.join(STAGES)}")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra --set for every convert")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    text = f"file:{Path(args.text).resolve()}"
    out = Path(args.out)
    env = {**os.environ, "QUANTKIT_NO_PROGRESS": "1"}
    rows = []
    for stage in args.stages.split(","):
        recipe, sets = STAGES[stage]
        art = out / stage.replace("+", "-")
        cmd = [
            *QUANTKIT,
            "convert",
            recipe,
            "--model",
            args.model,
            "--out",
            str(art),
            "--calib",
            text,
            *sets,
            *[a for s in args.extra for a in ("--set", s)],
            "--json",
        ] + (["--force"] if args.force else [])
        conv, conv_s, conv_cmd = run(cmd, env)
        ev, _, eval_cmd = run(
            [
                *QUANTKIT,
                "eval",
                str(art),
                "--baseline",
                args.model,
                "--text",
                text,
                "--seq-len",
                "512",
                "--max-tokens",
                "8192",
                "--region",
                "first-half",
                "--json",
            ],
            env,
        )
        g, rec = conv["gqa"], conv["gqa"].get("recover") or {}
        t = EvalResult.from_json(ev).primary
        rows.append(
            {
                "stage": stage,
                "kl": t.kld.mean,
                "kl_kind": t.kl_kind,
                "ppl": t.ppl,
                "baseline_ppl": t.baseline_ppl,
                "delta_ppl_pct": t.delta_ppl_pct,
                "top1": t.top1_agreement,
                "kv_bytes_per_token": [g["kv_bytes_per_token_before"], g["kv_bytes_per_token_after"]],
                "convert_minutes": round(conv_s / 60, 1),
                "recover": rec,
                "commands": [conv_cmd, eval_cmd],
            }
        )
        print(table(rows), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ladder.json").write_text(json.dumps(rows, indent=2))


def _kinds(rows: list[dict]) -> str:
    """The KL's kind of the rows (rows written before it was recorded: the top-256 bound)."""
    return ", ".join(sorted({r.get("kl_kind", "topk-256 lower bound") for r in rows})) or "exact"


def table(rows: list[dict]) -> str:
    lines = [
        f"| stage | KL ({_kinds(rows)}) | PPL | dPPL % | top-1 % | KV bytes/token | recover (steps, tokens, min) "
        "| convert min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rec = r["recover"]
        rec_s = f"{rec['steps']}, {rec['tokens']}, {rec['minutes']}" if rec else "-"
        lines.append(
            f"| {r['stage']} | {r['kl']:.3f} | {r['ppl']:.2f} | {r['delta_ppl_pct']:+.1f} | {100 * r['top1']:.1f} | "
            f"{r['kv_bytes_per_token'][0]} -> {r['kv_bytes_per_token'][1]} | {rec_s} | {r['convert_minutes']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
