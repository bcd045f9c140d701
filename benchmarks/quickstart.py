#!/usr/bin/env python3
"""The quickstart as a new user meets it: a fresh clone, `./scripts/quickstart.sh`, the main table.

Clones the repository's HEAD into a temp dir and runs its quickstart there with a new .venv and an
empty QUANTKIT_HOME (so the demo model is built as on a new machine). llama-cpp-python's wheel is
compiled once per machine and kept in a wheelhouse (scripts/_install.sh): by default the run reuses
this machine's, as every install after the first does; --cold-wheel starts from an empty one, so
llama.cpp is compiled too. pip's own download cache is shared either way. Before the run,
`quantkit run demo --plan` predicts its time; after it, the install, the demo pull and the run are
timed apart from the log's own marks. Writes benchmarks/results/quickstart.json: the wall times,
the prediction and the run's table (accuracy on each domain, llama.cpp's TTFT/TPOT, the rule check).

  python benchmarks/quickstart.py                  # the cold run
  python benchmarks/quickstart.py --run-dir runs/demo --no-clone   # only tabulate a finished run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, write_result

from quantkit.pipeline.accuracy import AccuracyRow, kl_header


def cold_run(keep: bool, cold_wheel: bool) -> tuple[Path, dict]:
    work = Path(tempfile.mkdtemp(prefix="qk-quickstart-"))
    clone = work / "quantkit"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    wheelhouse = (
        work / "wheels"
        if cold_wheel
        else Path(os.environ.get("QUANTKIT_WHEELHOUSE", Path.home() / ".cache" / "quantkit" / "wheels"))
    )
    env = dict(os.environ, QUANTKIT_HOME=str(work / "home"), QUANTKIT_WHEELHOUSE=str(wheelhouse))
    env.pop("VIRTUAL_ENV", None)
    marks, t0 = {}, time.time()
    proc = subprocess.Popen(
        ["./scripts/quickstart.sh"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log = []
    for line in proc.stdout:
        log.append(line)
        sys.stdout.write(line)
        now = time.time() - t0
        if "installing quantkit" in line:
            marks.setdefault("install_start", now)
        if "building llama-cpp-python" in line:
            marks.setdefault("llamacpp_build_start", now)
        if line.startswith("[fp16]"):  # the run's first step: install and `models pull demo` are done
            marks.setdefault("install_and_pull_done", now)
        if "waiting for llama.cpp's build" in line:
            marks.setdefault("waiting_for_llamacpp", now)
        if line.startswith("bench ("):
            marks.setdefault("bench_start", now)
    if proc.wait() != 0:
        raise SystemExit("the quickstart failed:\n" + "".join(log[-20:]))
    total = time.time() - t0
    plan = subprocess.run(
        [
            str(clone / ".venv" / "bin" / "quantkit"),
            "run",
            "demo",
            "--model",
            "demo",
            "--calib",
            "mix:default",
            "--out",
            str(work / "plan-only"),
            "--plan",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    predicted = json.loads(plan.stdout).get("time_s") if plan.returncode == 0 else None
    run_dir = work / "run"
    shutil.copytree(clone / "runs" / "demo", run_dir)
    timing = {
        "total_s": round(total),
        "marks_s": {k: round(v) for k, v in marks.items()},
        "plan_predicted_run_s": predicted,
        "llamacpp_wheel": "compiled in the run"
        if cold_wheel
        else "this machine's wheelhouse (compiled once per machine)",
    }
    if not keep:
        shutil.rmtree(clone, ignore_errors=True)
    return run_dir, timing


def main_table(report: dict) -> dict:
    rows_acc = [AccuracyRow.from_json(a) for a in report.get("accuracy") or []]
    domains = list(dict.fromkeys(a.domain for a in rows_acc))
    acc = {(a.name, a.domain): a for a in rows_acc}
    baselines = {
        name for name, v in (report.get("variants") or {}).items() if not v.get("steps")
    }  # the unmodified checkpoint
    fp16 = next((r["tpot_ms"] for r in report["rows"] if r["name"] in baselines and r.get("tpot_ms")), None)
    rows = []
    for r in report["rows"]:
        row = {
            "variant": r["name"],
            "bits": r.get("bits_per_weight"),
            "mb": (r.get("bytes_per_token") or 0) / 1e6 or None,
            "tpot": r.get("tpot_ms"),
            "speedup": fp16 / r["tpot_ms"] if fp16 and r.get("tpot_ms") else None,
            "ttft": r.get("ttft_ms"),
            "eff": r.get("tpot_efficiency_pct"),
        }
        for d in domains:
            a = acc.get((r["name"], d))
            row[d] = None if a is None else f"{a.delta_ppl_pct:+.1f}% / {a.kld_mean:.3f} / {a.top1_pct:.1f}%"
        rows.append(row)
    cols = [
        {"key": "variant", "header": "variant", "fmt": "{}"},
        {"key": "bits", "header": "bits/weight", "fmt": "{:.2f}"},
    ]
    kl = kl_header(a.kl_kind for a in rows_acc)
    cols += [{"key": d, "header": f"{d}: ΔPPL / {kl} / top-1", "fmt": "{}"} for d in domains]
    cols += [
        {"key": "mb", "header": "MB/token", "fmt": "{:.1f}"},
        {"key": "tpot", "header": "TPOT ms", "fmt": "{:.1f}"},
        {"key": "speedup", "header": "vs FP16", "fmt": "{:.2f}×"},
        {"key": "ttft", "header": "TTFT ms", "fmt": "{:.0f}"},
        {"key": "eff", "header": "roofline eff.", "fmt": "{:.0f}%"},
    ]
    return {"columns": cols, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default=None, help="tabulate this finished run instead of running a cold quickstart")
    ap.add_argument("--no-clone", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its .venv) after the run")
    ap.add_argument("--cold-wheel", action="store_true", help="an empty wheelhouse: llama.cpp is compiled in the run")
    args = ap.parse_args()
    if args.no_clone:
        run_dir, timing = Path(args.run_dir or "runs/demo"), {}
    else:
        run_dir, timing = cold_run(args.keep, args.cold_wheel)
        (run_dir / "timing.json").write_text(json.dumps(timing))  # kept with the run, so a re-tabulation keeps it
    if not timing and (run_dir / "timing.json").is_file():
        timing = json.loads((run_dir / "timing.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    timing["run_s"] = round(report.get("wall_seconds") or 0)
    fit = report.get("rule_check") or {}
    table = main_table(report)
    notes = []
    if timing.get("total_s"):
        build = "llama.cpp's build included" if args.cold_wheel else "llama.cpp's wheel from the machine's wheelhouse"
        notes.append(
            f"Fresh clone to table: {timing['total_s'] / 60:.1f} min on this machine (install included; {build})"
            + (
                f" (`quantkit run --plan` predicted {timing['plan_predicted_run_s'] / 60:.1f} min for the run itself)"
                if timing.get("plan_predicted_run_s")
                else ""
            )
            + "."
        )
    m = timing.get("marks_s") or {}
    if {"install_and_pull_done", "bench_start"} <= m.keys() and timing.get("total_s"):
        notes.append(
            f"Install and demo model {m['install_and_pull_done'] / 60:.1f} min; convert, score and export"
            f" {(m['bench_start'] - m['install_and_pull_done']) / 60:.1f} min"
            + (" while llama.cpp compiled" if "llamacpp_build_start" in m else "")
            + f"; the llama.cpp benches {(timing['total_s'] - m['bench_start']) / 60:.1f} min."
        )
    else:
        notes.append(f"`quantkit run demo` itself: {timing['run_s'] / 60:.1f} min.")
    notes.append(
        "Accuracy: ΔPPL / KL / top-1 against FP16 on "
        f"{', '.join(dict.fromkeys(a['domain'] for a in report.get('accuracy') or []))} (confirmation windows); speed: "
        "llama.cpp at batch 1, each variant's exact GGUF."
    )
    table["note"] = " ".join(notes)
    path = write_result(
        "quickstart",
        {
            "timing": timing,
            "rule_check": fit,
            "report": {k: report.get(k) for k in ("rows", "accuracy", "engines")},
            "tables": {"main": table},
        },
    )
    print(path)


if __name__ == "__main__":
    main()
