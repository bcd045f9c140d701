#!/usr/bin/env python3
"""The quickstart as a new user meets it: a fresh clone, `./scripts/quickstart.sh`, the main table;
and the full install (llama.cpp's tools and vLLM's environment) the same way.

Clones the repository's HEAD into a temp dir and runs its quickstart there with a new .venv and an
empty QUANTKIT_HOME (so the demo model is built as on a new machine). llama-cpp-python's wheel is
compiled once per machine and kept in a wheelhouse (scripts/_install.sh): by default the run reuses
this machine's, as every install after the first does; --cold-wheel starts from an empty one, so
llama.cpp is compiled too. pip's own download cache is shared either way. The stages are timed from
the lines the quickstart prints (install and demo model, the torch steps, the wait for llama.cpp,
the benches) and the run's own step times. Writes benchmarks/results/NAME.json (--name: one file
per CPU kind, `quickstart` for the one the README's table comes from): the wall times, the CPU
(model, SIMD levels, the llama.cpp variant and the torch dtypes it ran), the run's table, and a
table of every CPU kind's quickstart*.json.

--install times `QUANTKIT_WITH_LLAMA_TOOLS=1 QUANTKIT_WITH_VLLM=1 ./scripts/_install.sh` in a fresh
clone with an empty home and wheelhouse (llama.cpp's tools compiled, vLLM's environment built) and
writes results/install.json.

  python benchmarks/quickstart.py --cold-wheel     # the cold run
  python benchmarks/quickstart.py --install        # the full install
  python benchmarks/quickstart.py --run-dir runs/demo --no-clone   # only tabulate a finished run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, write_result

from quantkit.pipeline.accuracy import AccuracyRow, kl_header

# a line the quickstart prints -> the mark it sets (the first time it appears)
MARKS = (
    ("installing quantkit", "install_start"),
    ("building llama-cpp-python", "llamacpp_build_start"),
    ("[fp16]", "install_and_pull_done"),  # the run's first step: install and `models pull demo` are done
    ("waiting for llama.cpp's build", "waiting_for_llamacpp"),
    ("bench (", "bench_start"),
)
INSTALL_MARKS = (
    ("installing quantkit", "install_start"),
    ("building vLLM's environment", "vllm_start"),
    ("building llama.cpp's tools", "tools_start"),
    ("llama.cpp's tools built", "tools_done"),
    ("waiting for vLLM's environment", "vllm_wait"),
)


def clone() -> tuple[Path, Path]:
    work = Path(tempfile.mkdtemp(prefix="qk-quickstart-"))
    subprocess.run(["git", "clone", "-q", str(REPO), str(work / "quantkit")], check=True)
    return work, work / "quantkit"


def follow(argv: list[str], cwd: Path, env: dict, marks, on_line=None) -> tuple[dict, float]:
    """Run `argv`, echo its output, and time the first line holding each mark's text."""
    found, t0 = {}, time.time()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    for line in proc.stdout:
        log.append(line)
        sys.stdout.write(line)
        for text, mark in marks:
            if text in line if not text.startswith("[") else line.startswith(text):
                found.setdefault(mark, time.time() - t0)
        if on_line is not None:
            on_line(line)
    if proc.wait() != 0:
        raise SystemExit(f"{argv[0]} failed:\n" + "".join(log[-20:]))
    return found, time.time() - t0


def cold_run(keep: bool, cold_wheel: bool) -> tuple[Path, dict]:
    work, repo = clone()
    wheelhouse = (
        work / "wheels"
        if cold_wheel
        else Path(os.environ.get("QUANTKIT_WHEELHOUSE", Path.home() / ".cache" / "quantkit" / "wheels"))
    )
    env = dict(os.environ, QUANTKIT_HOME=str(work / "home"), QUANTKIT_WHEELHOUSE=str(wheelhouse))
    env.pop("VIRTUAL_ENV", None)
    report = repo / "runs" / "demo" / "report.json"
    torch_report = work / "report-torch-steps.json"

    def keep_first_report(line: str) -> None:  # the --skip-bench run's report, before the second run rewrites it
        if "reusing" in line and report.is_file() and not torch_report.is_file():
            shutil.copy(report, torch_report)

    marks, total = follow(["./scripts/quickstart.sh"], repo, env, MARKS, keep_first_report)
    run_dir = work / "run"
    shutil.copytree(repo / "runs" / "demo", run_dir)
    timing = {
        "total_s": round(total),
        "marks_s": {k: round(v) for k, v in marks.items()},
        "llamacpp_wheel": "compiled in the run"
        if cold_wheel
        else "this machine's wheelhouse (compiled once per machine)",
        "torch_steps_s": _steps(torch_report if torch_report.is_file() else report),
    }
    if not keep:
        shutil.rmtree(repo, ignore_errors=True)
    return run_dir, timing


def _steps(report: Path) -> dict:
    """Each step's seconds as the run timed it (convert, eval, export per variant)."""
    timings = json.loads(report.read_text()).get("timings") or {}
    return {k: round(v, 1) for k, v in timings.items() if k != "bench" and v >= 0.05}


def install_run(keep: bool) -> dict:
    """The full install in a fresh clone: empty home (vLLM's environment) and wheelhouse (llama.cpp)."""
    work, repo = clone()
    env = dict(
        os.environ,
        QUANTKIT_HOME=str(work / "home"),
        QUANTKIT_WHEELHOUSE=str(work / "wheels"),
        QUANTKIT_WITH_LLAMA_TOOLS="1",
        QUANTKIT_WITH_VLLM="1",
    )
    env.pop("VIRTUAL_ENV", None)
    marks, total = follow(["./scripts/_install.sh"], repo, env, INSTALL_MARKS)
    built = next((work / "wheels").glob("llama.cpp-tools-*/BUILD.json"), None)
    vllm = work / "home" / "engines" / "vllm" / "venv" / ".quantkit-engine.json"
    out = {
        "total_s": round(total),
        "marks_s": {k: round(v) for k, v in marks.items()},
        "tools_build": json.loads(built.read_text()) if built else None,
        "vllm_env": json.loads(vllm.read_text()) if vllm.is_file() else None,
    }
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


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
            "split": r.get("time_split"),
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
        {"key": "split", "header": "TPOT goes to", "fmt": "{}"},
    ]
    return {"columns": cols, "rows": rows}


def cpu_kind(report: dict, run_dir: Path) -> dict:
    """What this CPU ran: llama.cpp's variant (the bench rows'), the precision each torch step
    computed in (the artifacts' calibration, the evaluation), and torch's matmul rates that chose them."""
    rows = report.get("rows") or []
    variants = sorted({r.get("cpu_variant") for r in _bench_rows(report) if r.get("cpu_variant")})
    calib = sorted(
        {
            json.loads(m.read_text()).get("device", {}).get("dtype")
            for m in (run_dir / "artifacts").glob("*/quantkit.json")
        }
        - {None}
    )
    evals = sorted({(v.get("eval") or {}).get("dtype") for v in (report.get("variants") or {}).values()} - {None})
    probe = ((report.get("engines") or {}).get("llamacpp") or {}).get("device", {}).get("probe") or {}
    return {
        "llamacpp_variant": ", ".join(variants) or None,
        "calibration_dtype": ", ".join(calib) or None,
        "eval_dtype": ", ".join(evals) or None,
        "matmul_tflops": probe.get("matmul_tflops"),
        "rows": len(rows),
    }


def _bench_rows(report: dict) -> list[dict]:
    return [v["bench"] for v in (report.get("variants") or {}).values() if isinstance(v.get("bench"), dict)]


def stages(timing: dict) -> dict:
    """Minutes of each stage, from the marks: install and demo model; the torch steps (convert, score,
    export) while llama.cpp compiled beside them; the wait for the compile; the benches."""
    m, total = timing.get("marks_s") or {}, timing.get("total_s")
    if not total or not {"install_and_pull_done", "bench_start"} <= m.keys():
        return {}
    torch_end = m.get("waiting_for_llamacpp", m["bench_start"])
    return {
        "install_and_demo_min": m["install_and_pull_done"] / 60,
        "torch_steps_min": (torch_end - m["install_and_pull_done"]) / 60,
        "llamacpp_wait_min": (m["bench_start"] - torch_end) / 60,
        "benches_min": (total - m["bench_start"]) / 60,
        "total_min": total / 60,
    }


def kinds_table(current: dict, name: str) -> dict:
    """One row per CPU kind's quickstart*.json (this run's in place of its file's)."""
    files = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("quickstart*.json"))}
    files[name] = current
    rows = []
    for stem, r in sorted(files.items()):
        m, t = r.get("machine") or {}, r.get("timing") or {}
        flags = "/".join(f.upper().replace("_", "-") for f in m.get("cpu_flags", []) if f.startswith(("avx512", "amx")))
        rows.append(
            {
                "cpu": f"{m.get('cpu', '?')} ({flags or 'no AVX-512'}), {m.get('cores', '?')} cores",
                "ran": f"llama.cpp {r.get('cpu_kind', {}).get('llamacpp_variant') or '?'}; calibration "
                f"{r.get('cpu_kind', {}).get('calibration_dtype') or '?'}",
                **stages(t),
                "llamacpp_wheel": t.get("llamacpp_wheel"),
                "date": (r.get("date") or "?")[:10],
                "file": f"{stem}.json",
            }
        )
    return {
        "columns": [
            {"key": "cpu", "header": "CPU", "fmt": "{}"},
            {"key": "ran", "header": "ran", "fmt": "{}"},
            {"key": "total_min", "header": "fresh clone to table, min", "fmt": "{:.1f}"},
            {"key": "install_and_demo_min", "header": "install + demo model", "fmt": "{:.1f}"},
            {"key": "torch_steps_min", "header": "convert, score, export", "fmt": "{:.1f}"},
            {"key": "llamacpp_wait_min", "header": "waiting for llama.cpp", "fmt": "{:.1f}"},
            {"key": "benches_min", "header": "benches", "fmt": "{:.1f}"},
            {"key": "date", "header": "date", "fmt": "{}"},
        ],
        "rows": rows,
        "note": "Each CPU kind's `python benchmarks/quickstart.py --cold-wheel --name quickstart-KIND` "
        "(benchmarks/results/quickstart*.json): a fresh clone with an empty home, llama.cpp compiled in the run "
        "at the lowest priority beside the torch steps; minutes from the lines the quickstart prints.",
    }


def install_table(r: dict) -> dict:
    m, tools, vllm = r["marks_s"], r.get("tools_build") or {}, r.get("vllm_env") or {}
    rows = [
        {"stage": "quantkit and its libraries into .venv", "min": m.get("tools_start", m.get("vllm_start", 0)) / 60},
        {
            "stage": f"llama.cpp's tools ({len(tools.get('cpu_variants', '').split())} CPU variants), compiled",
            "min": (tools.get("build_seconds") or 0) / 60,
            "cpu": tools.get("cpu_seconds"),
        },
        {"stage": "vLLM's environment, beside the compile", "min": (vllm.get("build_s") or 0) / 60},
        {"stage": "the whole install", "min": r["total_s"] / 60},
    ]
    return {
        "columns": [
            {"key": "stage", "header": "stage", "fmt": "{}"},
            {"key": "min", "header": "minutes", "fmt": "{:.1f}"},
            {"key": "cpu", "header": "CPU seconds", "fmt": "{:.0f}"},
        ],
        "rows": rows,
        "note": "`QUANTKIT_WITH_LLAMA_TOOLS=1 QUANTKIT_WITH_VLLM=1 ./scripts/_install.sh` in a fresh clone, with an "
        "empty home and wheelhouse (pip's download cache shared): vLLM's environment (mostly downloading and "
        "unpacking) is built in the background while llama.cpp's tools compile.",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", default=None, help="tabulate this finished run instead of running a cold quickstart")
    ap.add_argument("--no-clone", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its .venv) after the run")
    ap.add_argument("--cold-wheel", action="store_true", help="an empty wheelhouse: llama.cpp is compiled in the run")
    ap.add_argument("--install", action="store_true", help="time the full install instead (results/install.json)")
    ap.add_argument("--name", default="quickstart", help="the result file's name: one per CPU kind (quickstart-KIND)")
    args = ap.parse_args()
    if not re.fullmatch(r"(quickstart|install)[A-Za-z0-9_-]*", args.name):
        raise SystemExit("--name: quickstart or install, then letters, digits, - or _")
    if args.install:
        r = install_run(args.keep)
        name = args.name if args.name != "quickstart" else "install"
        print(write_result(name, {"timing": r, "tables": {"main": install_table(r)}}))
        return
    if args.no_clone:
        run_dir, timing = Path(args.run_dir or "runs/demo"), {}
    else:
        run_dir, timing = cold_run(args.keep, args.cold_wheel)
        (run_dir / "timing.json").write_text(json.dumps(timing))  # kept with the run, so a re-tabulation keeps it
    if not timing and (run_dir / "timing.json").is_file():
        timing = json.loads((run_dir / "timing.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    timing["run_s"] = round(report.get("wall_seconds") or 0)
    table = main_table(report)
    kind = cpu_kind(report, run_dir)
    st = stages(timing)
    notes = []
    if st:
        notes.append(
            f"Fresh clone to table: {st['total_min']:.1f} min (install included; "
            + ("llama.cpp's build included" if args.cold_wheel else "llama.cpp's wheel from the machine's wheelhouse")
            + f"): install and demo model {st['install_and_demo_min']:.1f} min; convert, score and export "
            f"{st['torch_steps_min']:.1f} min while llama.cpp compiled at the lowest priority; waiting for it "
            f"{st['llamacpp_wait_min']:.1f} min; the llama.cpp benches {st['benches_min']:.1f} min."
        )
    else:
        notes.append(f"`quantkit run demo` itself: {timing['run_s'] / 60:.1f} min.")
    notes.append(
        "Accuracy: ΔPPL / KL / top-1 against FP16 on "
        f"{', '.join(dict.fromkeys(a['domain'] for a in report.get('accuracy') or []))} (confirmation windows), "
        f"calibrated and scored in {kind['calibration_dtype'] or '?'} / {kind['eval_dtype'] or '?'}; speed: "
        f"llama.cpp at batch 1 ({_variant(kind['llamacpp_variant'])}), each variant's exact GGUF."
    )
    table["note"] = " ".join(notes)
    body = {
        "timing": timing,
        "cpu_kind": kind,
        "rule_check": report.get("fit") or {},
        "report": {k: report.get(k) for k in ("rows", "accuracy", "engines")},
        "tables": {"main": table},
    }
    body["tables"]["kinds"] = kinds_table({"machine": _machine(), "date": _now(), **body}, args.name)
    print(write_result(args.name, body))


def _variant(name: str | None) -> str:
    return "its one CPU build, no run-time dispatch" if name == "one CPU build" else f"its {name or '?'} CPU variant"


def _machine() -> dict:
    from common import machine

    return machine()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


if __name__ == "__main__":
    main()
