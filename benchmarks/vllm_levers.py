#!/usr/bin/env python3
"""Load and levers against vLLM's OpenAI server on loopback: `quantkit levers` with the CPU study
benchmarks/vllm_levers.yaml (FP16 against INT4 W4A16, prefix caching, chunked prefill,
max_num_seqs) on the demo model, each lever a `quantkit load` staircase against a server quantkit
starts and stops. Writes benchmarks/results/vllm_levers.json: the lever table (knee, TTFT-P99 and
TPOT-P99 at the knee, peak, which latency degraded first, the lightest step's P50s) and the
prefix-cache reference (the measured TTFT ratio against the roofline's prefill of the prefix).

  python benchmarks/vllm_levers.py --int4 DIR --out levers-vllm-cpu        # DIR: an INT4 W4A16 artifact of the demo
  python benchmarks/vllm_levers.py --int4 DIR --out levers-vllm-cpu --tabulate   # only tabulate a finished study
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import QUANTKIT, RESULTS, write_result

HERE = Path(__file__).resolve().parent
STUDY = HERE / "vllm_levers.yaml"


def lever_table(study: dict) -> dict:
    rows = []
    for r in study["table"]:
        rows.append(
            {
                k: r.get(k)
                for k in (
                    "lever",
                    "knee_offered",
                    "knee_qps",
                    "knee_ttft_p99_ms",
                    "knee_tpot_p99_ms",
                    "peak_offered",
                    "peak_qps",
                    "goodput_qps",
                    "degraded_first",
                    "first_ttft_p50_ms",
                    "first_tpot_p50_ms",
                    "knee_qps_ratio",
                    "first_ttft_p50_ms_ratio",
                    "errors",
                    "stopped",
                )
            }
        )
    cols = [
        ("lever", "lever", "`{}`"),
        ("knee_offered", "knee (concurrency)", "{}"),
        ("knee_qps", "knee req/s", "{:.2f}"),
        ("knee_ttft_p99_ms", "TTFT-P99 at knee ms", "{:.0f}"),
        ("knee_tpot_p99_ms", "TPOT-P99 at knee ms", "{:.0f}"),
        ("peak_qps", "peak req/s", "{:.2f}"),
        ("goodput_qps", "goodput req/s", "{:.2f}"),
        ("degraded_first", "degraded first", "{}"),
        ("first_ttft_p50_ms", "TTFT-P50 at 1 ms", "{:.0f}"),
        ("first_tpot_p50_ms", "TPOT-P50 at 1 ms", "{:.0f}"),
        ("knee_qps_ratio", "knee vs fp16", "×{:.2f}"),
        ("errors", "errors", "{}"),
        ("stopped", "stopped", "{}"),
    ]
    return {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": rows}


def prefix_table(study: dict) -> dict:
    ref = study.get("prefix_reference") or {}
    rows = [r for r in ref.get("levers") or [] if r["lever"] == "prefix-caching"]
    cols = [
        ("lever", "lever", "`{}`"),
        ("prefix_tokens", "shared prefix tokens", "{}"),
        ("suffix_tokens", "unique tokens", "{}"),
        ("baseline_ttft_p50_ms", "TTFT-P50 cache off ms", "{:.0f}"),
        ("ttft_p50_ms", "TTFT-P50 cache on ms", "{:.0f}"),
        ("ttft_ratio", "TTFT ratio measured", "×{:.2f}"),
        ("roofline_ttft_ratio", "TTFT ratio roofline", "×{:.2f}"),
        ("roofline_prefix_prefill_ms", "roofline prefill of the prefix ms", "{:.1f}"),
        ("saved_ms", "saved ms", "{:.0f}"),
        ("saved_vs_roofline", "saved / roofline", "×{:.2f}"),
    ]
    note = (
        (
            "Roofline: this machine's probed bf16 matmul rate, "
            f"{ref.get('compute_tflops', 0):.2f} TFLOPS, on the demo's shape; "
            "TTFT-P50 at concurrency 1."
        )
        if ref
        else ""
    )
    return {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": rows, "note": note}


def _previous() -> dict | None:
    path = RESULTS / "vllm_levers.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--int4", required=True, help="an INT4 W4A16 artifact of the demo model")
    ap.add_argument("--out", default="levers-vllm-cpu")
    ap.add_argument("--tabulate", action="store_true", help="only tabulate the finished study in --out")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.tabulate:
        demo = subprocess.run(
            QUANTKIT + ["models", "path", "demo"], capture_output=True, text=True, check=True
        ).stdout.strip()
        env = {**os.environ, "QK_DEMO_MODEL": demo, "QK_DEMO_INT4": str(Path(args.int4).resolve())}
        subprocess.run(QUANTKIT + ["levers", str(STUDY), "--out", str(out), "--force"], env=env, check=True)
    study = json.loads((out / "study.json").read_text())
    summary = {k: v for k, v in study.items() if k != "runs"}  # each run stays in --out (NN-LEVER.json)
    if str(summary.get("source", "")).startswith(str(HERE.parent)):  # the study as the repository names it
        summary["source"] = str(Path(summary["source"]).relative_to(HERE.parent))
    note = (
        "vLLM's CPU build on 2 cores shared with other work; each lever a staircase of "
        "concurrency 1, 2, 4 (15 s or 8 requests "
        "per step), 256 shared + 32 unique prompt tokens, 16 output tokens; the baseline `fp16` has prefix caching off."
    )
    # a re-tabulation keeps the command and date of the run that measured
    kept = {k: previous[k] for k in ("command", "date")} if args.tabulate and (previous := _previous()) else {}
    path = write_result(
        "vllm_levers",
        {
            **kept,
            "study": summary,
            "tables": {"main": {**lever_table(summary), "note": note}, "prefix": prefix_table(summary)},
        },
    )
    print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
