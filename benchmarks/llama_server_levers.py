#!/usr/bin/env python3
"""Levers of llama.cpp's own llama-server on loopback: `quantkit levers` with the CPU study
benchmarks/llama_server_levers.yaml on the demo model's F16 GGUF (one slot against four parallel
slots, the prompt cache off, speculative decoding with the Q4_0 GGUF of the same model as draft),
each lever a `quantkit load` staircase against a server quantkit starts and stops. Writes
benchmarks/results/llama_server_levers.json: the lever table (knee, its req/s against `one-slot`,
TTFT-P99 and TPOT-P99 at the knee, peak, goodput, what degraded first, the lightest step's P50s,
the share of prompt tokens cached and of drafts kept) and the prefix reference (the prompt cache's
TTFT ratio against the roofline's prefill of the shared prefix).

The GGUFs are made in --work from the demo model, once (a later run reuses them):
  quantkit export DEMO --format gguf --out WORK/demo-f16.gguf
  quantkit convert int4-w4a16-rtn --model demo --set steps[0].quantize.group_size=32 --out WORK/demo-int4-g32
  quantkit export WORK/demo-int4-g32 --format gguf --out WORK/demo-q4_0.gguf   # INT4 sym g32 -> Q4_0, exact
llama-server is the install's build (QUANTKIT_WITH_LLAMA_TOOLS=1 ./scripts/_install.sh).

  python benchmarks/llama_server_levers.py                          # prepare, run the study, tabulate
  python benchmarks/llama_server_levers.py --tabulate               # only tabulate the finished study in WORK/levers
  python benchmarks/llama_server_levers.py --quick --work runs/llama-server-quick # a smoke run (not a result to commit)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from common import QUANTKIT, RESULTS, write_result

HERE = Path(__file__).resolve().parent
STUDY = HERE / "llama_server_levers.yaml"
NAME = "llama_server_levers"
# --quick: the staircase cut to what shows every lever starts, answers and stops
QUICK_LOAD = {"concurrency": "1,2", "step_seconds": 3, "max_requests": 3}
QUICK_STUDY = "llama_server_levers.quick.yaml"


def note(study: dict) -> str:
    """What the staircase was, from the study that ran (a --quick run says it is no measurement)."""
    load, threads = study["study"]["load"], study["study"]["server"]["settings"]["threads"]
    quick = "A --quick smoke run: not a measurement. " if Path(study["source"]).name == QUICK_STUDY else ""
    return (
        f"{quick}llama-server (llama.cpp's build) with {threads} threads; each lever a staircase of concurrency "
        f"{load['concurrency'].replace(',', ', ')} ({load['step_seconds']:g} s or "
        f"{load['max_requests']} requests per step), "
        f"{load['shared_prefix']} shared + {load['prompt_len']} unique prompt tokens, {load['gen_len']} output tokens, "
        "the server's default sampling; the baseline `one-slot` caches each prompt (llama-server's default); "
        "`speculative` drafts with the Q4_0 GGUF of the same model (draft-simple). Ratios are against `one-slot`."
    )


def _columns(cols) -> list[dict]:
    return [{"key": k, "header": h, "fmt": f} for k, h, f in cols]


def lever_table(study: dict) -> dict:
    cols = [
        ("lever", "lever", "`{}`"),
        ("knee_offered", "knee (concurrency)", "{}"),
        ("knee_qps", "knee req/s", "{:.2f}"),
        ("knee_qps_ratio", "knee req/s vs one-slot", "×{:.2f}"),
        ("knee_ttft_p99_ms", "TTFT-P99 at knee ms", "{:.0f}"),
        ("knee_tpot_p99_ms", "TPOT-P99 at knee ms", "{:.0f}"),
        ("peak_qps", "peak req/s", "{:.2f}"),
        ("peak_qps_ratio", "peak vs one-slot", "×{:.2f}"),
        ("goodput_qps", "goodput req/s", "{:.2f}"),
        ("degraded_first", "degraded first", "{}"),
        ("first_ttft_p50_ms", "TTFT-P50 at 1 ms", "{:.0f}"),
        ("first_tpot_p50_ms", "TPOT-P50 at 1 ms", "{:.0f}"),
        ("first_cache_hit", "prompt cached at 1", "{:.0%}"),
        ("first_draft_acceptance", "drafts kept at 1", "{:.0%}"),
        ("errors", "errors", "{}"),
        ("stopped", "stopped", "{}"),
    ]
    rows = [{k: r.get(k) for k, _, _ in cols} for r in study["table"]]
    return {"columns": _columns(cols), "rows": rows}


def prefix_table(study: dict) -> dict:
    ref = study.get("prefix_reference") or {}
    rows = [r for r in ref.get("levers") or [] if r["lever"] == "one-slot"]  # one slot, the cache the only change
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
            f"Cache off: `{ref.get('baseline')}`; roofline: this machine's probed bf16 matmul rate, "
            f"{ref.get('compute_tflops', 0):.2f} TFLOPS, on the demo's shape; TTFT-P50 at concurrency 1."
        )
        if ref
        else ""
    )
    return {"columns": _columns(cols), "rows": rows, "note": note}


def _run(args: list[str], env: dict | None = None) -> None:
    print("+ " + " ".join(args[2:]), file=sys.stderr)
    subprocess.run(QUANTKIT + args, env=env, check=True)


def prepare(work: Path, demo: str) -> tuple[Path, Path]:
    """The demo's F16 GGUF and the Q4_0 GGUF of its INT4 RTN g32 artifact, made once in `work`
    (quantkit writes each into place only when complete, so a file there is a whole one)."""
    work.mkdir(parents=True, exist_ok=True)
    f16, q4_0, int4 = work / "demo-f16.gguf", work / "demo-q4_0.gguf", work / "demo-int4-g32"
    if not f16.is_file():
        _run(["export", demo, "--format", "gguf", "--out", str(f16)])
    if not q4_0.is_file():
        if not int4.is_dir():
            _run(
                [
                    "convert",
                    "int4-w4a16-rtn",
                    "--model",
                    "demo",
                    "--set",
                    "steps[0].quantize.group_size=32",
                    "--out",
                    str(int4),
                ]
            )
        _run(["export", str(int4), "--format", "gguf", "--out", str(q4_0)])
    return f16, q4_0


def quick_study(work: Path) -> Path:
    """The study with its staircase cut short (QUICK_LOAD), beside the GGUFs."""
    study = yaml.safe_load(STUDY.read_text())
    study["load"].update(QUICK_LOAD)
    path = work / QUICK_STUDY
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def measure(work: Path, quick: bool) -> None:
    demo = subprocess.run(
        QUANTKIT + ["models", "path", "demo"], capture_output=True, text=True, check=True
    ).stdout.strip()
    f16, q4_0 = prepare(work, demo)
    env = {**os.environ, "QK_DEMO_MODEL": demo, "QK_DEMO_F16": str(f16.resolve()), "QK_DEMO_Q4_0": str(q4_0.resolve())}
    study = quick_study(work) if quick else STUDY
    _run(["levers", str(study), "--out", str(work / "levers"), "--force"], env=env)


def llama_build() -> dict:
    """Which llama-server ran: its version line and the llama.cpp commit the install built."""
    from quantkit.gguf import tools

    return {
        "llama_server": tools.version("llama-server"),
        "llama_cpp_commit": (tools.build_info() or {}).get("llama_cpp_commit"),
    }


def summary(study: dict) -> dict:
    """study.json without its runs (each stays in WORK/levers as NN-LEVER.json), naming no path of this machine."""
    out = {k: v for k, v in study.items() if k != "runs"}
    source = Path(out.get("source", ""))
    out["source"] = str(source.relative_to(HERE.parent)) if source.is_relative_to(HERE.parent) else source.name
    if out.get("prefix_reference"):
        out["prefix_reference"] = {**out["prefix_reference"], "shape": "demo (quantkit models path demo)"}
    return out


def _previous() -> dict | None:
    path = RESULTS / f"{NAME}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--work", default="runs/llama-server-levers", help="the GGUFs, and the study's output in WORK/levers"
    )
    ap.add_argument("--tabulate", action="store_true", help="only tabulate the finished study in WORK/levers")
    ap.add_argument("--quick", action="store_true", help="a smoke run: concurrency 1, 2 and 3 requests per step")
    args = ap.parse_args()
    work = Path(args.work)
    if not args.tabulate:
        measure(work, args.quick)
    study = summary(json.loads((work / "levers" / "study.json").read_text()))
    # a re-tabulation keeps the command and date of the run that measured
    kept = {k: previous[k] for k in ("command", "date")} if args.tabulate and (previous := _previous()) else {}
    path = write_result(
        NAME,
        {
            **kept,
            "build": llama_build(),
            "study": study,
            "tables": {"main": {**lever_table(study), "note": note(study)}, "prefix": prefix_table(study)},
        },
    )
    print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
