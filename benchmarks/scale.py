#!/usr/bin/env python3
"""How quantkit's cost grows with the model: convert (GPTQ W4, RTN W4), eval and bench at three
sizes, each command's wall time and peak RSS (its whole process tree, sampled every 50 ms) next
to what `--plan` predicted for it, plus the bench's rule check on the synthetic shapes.

The ~0.5B and ~1.2B models are RANDOM-WEIGHT checkpoints in the shapes of Qwen2.5-0.5B and
Llama-3.2-1B (benchmarks/shaped_checkpoint.py): their accuracy figures mean nothing; only time,
memory and bytes carry over. Each model's commands run under one hold of a CPU lock file (other
jobs that take the same lock wait), with a fresh QUANTKIT_HOME and inductor cache (cold caches, as
on a first run). Time figures on a shared machine are noisy: the raw JSON keeps every measurement.

  python benchmarks/scale.py --text TEXT.txt --models demo qwen2.5-0.5b
  python benchmarks/scale.py --plot-only     # redraw the plot and the result from the working file
The working file (--out, kept between runs so that a model can be measured alone) holds every
measurement; benchmarks/results/NAME.json (--name, default scale) is written from it with the table
of each step's measured and predicted time and peak memory.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result

from quantkit.bench.bench_records import BenchResult

REPO = Path(__file__).resolve().parents[1]
PY = str(REPO / ".venv" / "bin" / "python")
Q = [PY, "-m", "quantkit"]
LOCK = "/tmp/qk-cpu.lock"
# name -> (how to get it, group size the model's widths allow: the demo's 576 columns are not a multiple of 128)
MODELS = {"demo": ("demo", 64), "qwen2.5-0.5b": ("shape", 128), "llama3.2-1b": ("shape", 128)}


def sample_tree(proc: subprocess.Popen, every: float = 0.05) -> tuple[int, float]:
    """Peak summed RSS of `proc` and its children until it exits, and their CPU seconds (user +
    system, the last sample of each process): on a shared machine, CPU time divided by the
    threads used is the wall time the command would take alone."""
    import psutil

    peak, cpu = 0, {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        rss = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                with p.oneshot():
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    cpu[p.pid] = t.user + t.system
        except psutil.Error:
            pass
        peak = max(peak, rss)
        time.sleep(every)
    return peak, sum(cpu.values())


def measure(cmd: list[str], env: dict, plan_cmd: list[str] | None = None) -> dict:
    """Run one command (the caller holds the shared CPU lock); its wall time, peak RSS, JSON
    stdout and last stderr line. `plan_cmd` runs just before, so its quick device probe sees the
    machine as the command will (on a shared machine the matmul rate moves by several times)."""
    predicted = plan(plan_cmd, env) if plan_cmd else None
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO)
        peak, cpu_s = sample_tree(proc)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    row = {
        "cmd": " ".join(cmd),
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(peak / 1e6),
        "cpu_s": round(cpu_s, 1),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "started": started,
        "plan": predicted,
    }
    try:
        row["result"] = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        row["result"] = None
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if lines and lines[-1].startswith("{"):  # rss.py's per-phase RSS
        row["phases"] = json.loads(lines[-1])
    if proc.returncode:
        row["error"] = lines[-1] if lines else "?"
    return row


def plan(cmd: list[str], env: dict) -> dict | None:
    """The same command with --plan --json (no lock: a plan loads no weights)."""
    p = subprocess.run([*cmd, "--plan"], capture_output=True, text=True, env=env, cwd=REPO)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}


def model_path(name: str, kind: str, work: Path) -> Path:
    if kind == "demo":
        sys.path.insert(0, str(REPO))
        from quantkit.models.resolve import resolve_path

        return resolve_path("demo")
    path = work / "models" / name
    if not (path / "config.json").is_file():
        subprocess.run(
            [PY, str(REPO / "benchmarks" / "shaped_checkpoint.py"), name, "--out", str(path), "--force"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path


def commands(name: str, src: Path, group: int, text: str, art: Path, args) -> dict[str, list[str]]:
    calib = [
        "--calib",
        f"file:{text}",
        "--set",
        f"calibration.samples={args.samples}",
        "--set",
        f"calibration.seq_len={args.seq_len}",
    ]
    gs = ["--set", f"steps[0].quantize.group_size={group}"]
    conv = [PY, str(REPO / "benchmarks" / "rss.py")]
    gptq = [*conv, str(REPO / "recipes" / "int4-w4a16-gptq-g64.yaml"), "--model", str(src)]
    calib2 = [
        "--calib",
        f"file:{text}",
        "--set",
        f"calibration.samples={2 * args.samples}",
        "--set",
        f"calibration.seq_len={args.seq_len}",
    ]
    return {
        "convert-gptq": [*gptq, "--out", str(art / "gptq"), *calib, *gs, "--force", "--json"],
        # twice the calibration tokens: convert time against tokens at a fixed size (run on the demo by default)
        "convert-gptq-2x": [*gptq, "--out", str(art / "gptq-2x"), *calib2, *gs, "--force", "--json"],
        "convert-rtn": [
            *conv,
            str(REPO / "recipes" / "int4-w4a16-rtn.yaml"),
            "--model",
            str(src),
            "--out",
            str(art / "rtn"),
            *gs,
            "--force",
            "--json",
        ],
        "eval": [
            *Q,
            "eval",
            str(art / "gptq"),
            "--baseline",
            str(src),
            "--text",
            f"file:{text}",
            "--max-tokens",
            str(args.eval_tokens),
            "--json",
        ],
        "bench": [
            *Q,
            "bench",
            str(src),
            str(art / "gptq"),
            "--engine",
            args.engine,
            "--prompt-len",
            str(args.prompt_len),
            "--gen-len",
            str(args.gen_len),
            "--repeats",
            str(args.repeats),
            "--min-seconds",
            "0",
            "--json",
        ],
    }


def plan_command(cmd: list[str]) -> list[str]:
    """rss.py ARGS -> quantkit convert ARGS (the plan needs no RSS sampler)."""
    if cmd[1].endswith("rss.py"):
        return [*Q, "convert", *cmd[2:]]
    return cmd


def git_version() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "quantkit"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    return head + ("+uncommitted" if dirty else "")


def run_model(name: str, args, work: Path, results: dict) -> None:
    """Every step of one model under one hold of the shared CPU lock (others queue meanwhile)."""
    if args.memory_only:  # no lock, niced: only peak memory is reported from such a run, never its time
        os.nice(19)
        return _run_model(name, args, work, results)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _run_model(name, args, work, results)


def _run_model(name: str, args, work: Path, results: dict) -> None:
    kind, group = MODELS[name]
    src = model_path(name, kind, work)  # the demo from the usual cache; every command then gets a fresh QUANTKIT_HOME
    # inductor's cache too: a cold torch.compile adds 1.4-2.4 GB to bench's peak (docs "Scale")
    env = {
        **os.environ,
        "QUANTKIT_HOME": str(work / "home" / name),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "home" / name / "inductor"),
    }
    shutil.rmtree(env["QUANTKIT_HOME"], ignore_errors=True)
    art = work / "artifacts" / name
    art.mkdir(parents=True, exist_ok=True)
    from safetensors import safe_open  # noqa: F401  (the venv's; fails early if run with another python)

    entry = results.setdefault("models", {}).setdefault(name, {"path": str(src), "group_size": group, "steps": {}})
    for step, cmd in commands(name, src, group, args.text, art, args).items():
        if (args.steps and step not in args.steps) or (not args.steps and step == "convert-gptq-2x" and kind != "demo"):
            continue
        print(f"[{name}] {step} ...", file=sys.stderr, flush=True)
        row = measure(cmd, env, plan_command(cmd))
        row["timed"] = not args.memory_only
        row["calib_tokens"] = (
            (2 if step == "convert-gptq-2x" else 1) * args.samples * args.seq_len if "gptq" in step else 0
        )
        entry["steps"][step] = row
        print(
            f"[{name}] {step}: rc {row['rc']}, {row['wall_s']} s, peak {row['peak_rss_mb']} MB",
            file=sys.stderr,
            flush=True,
        )
        save(results, args.out)
    if kind == "shape" and (not args.steps or "rule-check" in args.steps):
        cmd = [
            *Q,
            "bench",
            "--shape",
            name,
            "--shape-bits",
            "16,8,4",
            "--engine",
            args.engine,
            "--prompt-len",
            str(args.prompt_len),
            "--gen-len",
            str(args.gen_len),
            "--repeats",
            str(args.repeats),
            "--min-seconds",
            "0",
            "--json",
        ]
        row = measure(cmd, env)
        entry["steps"]["rule-check"] = row
        save(results, args.out)


def save(results: dict, out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "wikitext2-valid.txt"))
    ap.add_argument("--out", type=Path, default=Path("runs/scale/scale.json"), help="the working file")
    ap.add_argument("--name", default="scale", help="the result: benchmarks/results/NAME.json")
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument(
        "--steps",
        nargs="*",
        default=None,
        help="convert-gptq convert-gptq-2x convert-rtn eval bench rule-check (default: all; -2x on the demo only)",
    )
    ap.add_argument("--samples", type=int, default=16, help="calibration windows (of --seq-len tokens each)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-tokens", type=int, default=2048)
    ap.add_argument("--engine", default="compiled")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--work", type=Path, default=Path("/tmp/qk-scale"), help="models, artifacts and caches (kept for re-runs)"
    )
    ap.add_argument("--plot-only", action="store_true", help="only redraw the plot from --out")
    ap.add_argument("--replan", action="store_true", help="re-run --plan for the recorded steps (no measurements)")
    ap.add_argument(
        "--memory-only",
        action="store_true",
        help="run without the CPU lock at nice 19: peak memory only, times not reported",
    )
    ap.add_argument("--markdown", action="store_true", help="print the docs tables (with --plot-only: no measurements)")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if not args.plot_only and not args.replan:
        args.text = str(Path(args.text).resolve())
        results.setdefault("runs", []).append(
            {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "quantkit": git_version(),
                "models": args.models,
                "steps": args.steps,
                "cpus": os.cpu_count(),
            }
        )
        results["settings"] = {
            k: v for k, v in vars(args).items() if k not in ("out", "work", "plot_only", "models", "steps")
        }
        args.work.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            run_model(name, args, args.work, results)
    if args.replan:
        replan(results, args)
    save(results, args.out)
    plot(results, args.out.with_suffix(".png"))
    print(markdown(results) if args.markdown else table(results))
    if rows(results):
        # the machine's own paths out of the published file: the text read and the work folder
        body = json.loads(
            json.dumps({**results, "tables": {"steps": steps_table(results)}})
            .replace(str(Path(args.text).resolve()), "TEXT.txt")
            .replace(str(args.work.resolve()), "WORK")
        )
        print(write_result(args.name, body), file=sys.stderr)


def replan(results: dict, args) -> None:
    """Re-run `--plan` for every recorded step with the device figures its first plan probed
    under the lock, just before the measurement (QUANTKIT_PLAN_PROBE); the measurements are kept."""
    for name, entry in results.get("models", {}).items():
        for step, row in entry["steps"].items():
            first = row.get("plan") or {}
            if step == "rule-check" or "machine" not in first:
                continue
            figures = {k: first["machine"][k] for k in ("read_bps", "bf16_flops", "fp32_flops")}
            env = {
                **os.environ,
                "QUANTKIT_HOME": str(args.work / "home" / name),
                "QUANTKIT_PLAN_PROBE": json.dumps(figures),
            }
            row.setdefault("first_plan", first)
            row["plan"] = plan(plan_command(row["cmd"].split(" ")), env)


def rows(results: dict) -> list[dict]:
    """One row per (model, step): measured and predicted time and peak memory."""
    out = []
    for name, entry in results.get("models", {}).items():
        for step, r in entry["steps"].items():
            if step == "rule-check" or r.get("rc"):
                continue
            plan = r.get("plan") or {}
            params = (plan.get("model") or {}).get("params") or entry.get("params")
            out.append(
                {
                    "model": name,
                    "step": step,
                    "params": params,
                    "wall_s": r["wall_s"],
                    "peak_mb": r["peak_rss_mb"],
                    "pred_s": plan.get("seconds"),
                    "pred_mb": plan["peak_ram"] / 1e6 if plan.get("peak_ram") else None,
                    "load": r.get("load_before"),
                    "cpu_s": r.get("cpu_s"),
                    "tokens": r.get("calib_tokens") or 0,
                    "timed": r.get("timed", True),
                }
            )
    return out


def table(results: dict) -> str:
    lines = [
        "| model | params | step | calib tokens | wall s | CPU s | load | predicted s | pred/wall | "
        "peak RSS MB | predicted MB | pred/meas |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows(results):
        if not r["timed"]:  # a --memory-only run: its time is not a measurement
            lines.append(
                f"| {r['model']} | {r['params'] / 1e9:.3f} B | {r['step']} | {r['tokens'] or '—'} | (not timed) | | | "
                f"{r['pred_s'] or 0:.0f} | | {r['peak_mb']:.0f} | "
                f"{r['pred_mb'] or 0:.0f} | {r['pred_mb'] / r['peak_mb']:.2f} |"
            )
            continue
        ts = f"{r['pred_s'] / r['wall_s']:.2f}" if r["pred_s"] else "—"
        ms = f"{r['pred_mb'] / r['peak_mb']:.2f}" if r["pred_mb"] else "—"
        cpu = f"{r['cpu_s']:.0f}" if r.get("cpu_s") else "—"
        lines.append(
            f"| {r['model']} | {r['params'] / 1e9:.3f} B | {r['step']} | "
            f"{r['tokens'] or '—'} | {r['wall_s']:.0f} | {cpu} | "
            f"{r['load'] or 0:.1f} | {r['pred_s'] or 0:.0f} | {ts} | "
            f"{r['peak_mb']:.0f} | {r['pred_mb'] or 0:.0f} | {ms} |"
        )
    return "\n".join(lines)


def steps_table(results: dict) -> dict:
    """The rendered table: each timed step's measured and predicted time and peak memory."""
    cols = [
        ("model", "model", "{}"),
        ("params_b", "params (B)", "{:.3f}"),
        ("step", "step", "{}"),
        ("tokens", "calib tokens", "{}"),
        ("wall_s", "wall s", "{:.0f}"),
        ("pred_s", "--plan s", "{:.0f}"),
        ("time_ratio", "plan / measured time", "{:.2f}"),
        ("peak_mb", "peak RSS MB", "{:.0f}"),
        ("pred_mb", "--plan MB", "{:.0f}"),
        ("mem_ratio", "plan / measured memory", "{:.2f}"),
        ("load", "load before", "{:.1f}"),
    ]
    out = []
    for r in rows(results):
        if not r["timed"]:
            continue
        out.append(
            {
                **r,
                "params_b": r["params"] / 1e9 if r["params"] else None,
                "tokens": r["tokens"] or None,
                "time_ratio": r["pred_s"] / r["wall_s"] if r["pred_s"] and r["wall_s"] else None,
                "mem_ratio": r["pred_mb"] / r["peak_mb"] if r["pred_mb"] and r["peak_mb"] else None,
            }
        )
    note = (
        "Each step's wall time and peak RSS (its whole process tree) against `--plan`'s prediction made just "
        "before it, on the same machine, cold caches (a fresh QUANTKIT_HOME and inductor cache). The 0.5B and "
        "1.2B models are random-weight checkpoints in Qwen2.5-0.5B's and Llama-3.2-1B's shapes: only time, "
        "memory and bytes carry over. `load before`: the 1-minute load average when the step started."
    )
    return {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": out, "note": note}


# rss.py's phases -> the plan's time_breakdown keys they cover
PHASE_KEYS = {
    "start": ("startup", "hash"),
    "loading": ("load",),
    "quantize": ("calibration_forward", "hessians", "gptq_solve", "quantize"),
    "export": ("save",),
    "reload check": ("reload_check",),
}


def phase_rows(results: dict) -> list[dict]:
    """Each convert's measured phases (seconds, peak RSS) beside the plan's seconds for the same phase."""
    out = []
    for name, entry in results.get("models", {}).items():
        for step, r in entry["steps"].items():
            if not step.startswith("convert") or r.get("rc") or not r.get("phases"):
                continue
            breakdown, prev = (r.get("plan") or {}).get("time_breakdown") or {}, 0.0
            for ph in r["phases"]["phases"]:
                key = next((k for k in PHASE_KEYS if ph["phase"].startswith(k)), None)
                if key is None:
                    continue
                pred = sum(breakdown.get(k, 0.0) for k in PHASE_KEYS[key])
                out.append(
                    {
                        "model": name,
                        "step": step,
                        "phase": key,
                        "s": ph["end_s"] - prev,
                        "pred_s": pred,
                        "peak_mb": ph["peak_mb"],
                        "timed": r.get("timed", True),
                    }
                )
                prev = ph["end_s"]
    return out


def linearity(results: dict) -> list[dict]:
    """GPTQ's calibrate-and-solve phase per (decoder-linear parameter x calibration token): flat or
    falling across sizes and token counts means cost grows no worse than linearly in their product."""
    out = []
    for name, entry in results.get("models", {}).items():
        for step, r in entry["steps"].items():
            if not step.startswith("convert-gptq") or r.get("rc") or not r.get("phases"):
                continue
            model = (r.get("plan") or {}).get("model") or {}
            quant = next(
                (p for p in phase_rows({"models": {name: {"steps": {step: r}}}}) if p["phase"] == "quantize"), None
            )
            if quant and model.get("linear_params") and r.get("calib_tokens"):
                work = model["linear_params"] * r["calib_tokens"]
                out.append(
                    {
                        "model": name,
                        "step": step,
                        "linear_params": model["linear_params"],
                        "tokens": r["calib_tokens"],
                        "quantize_s": quant["s"],
                        "wall_s": r["wall_s"],
                        "ps_per_param_token": quant["s"] / work * 1e12,
                    }
                )
    return out


def rule_rows(results: dict) -> list[dict]:
    out = []
    for name, entry in results.get("models", {}).items():
        r = entry["steps"].get("rule-check")
        if not r or r.get("rc") or not r.get("result"):
            continue
        res = BenchResult.from_json(r["result"])  # a result of schema 2 or later
        out.append(
            {
                "model": name,
                "fit": res.fit.to_json(),
                "wall_s": r["wall_s"],
                "peak_mb": r["peak_rss_mb"],
                "rows": [
                    {
                        "name": x.name,
                        "gb": x.bytes_per_token / 1e9,
                        "tpot": x.tpot_ms,
                        "pred": x.predicted_tpot_ms,
                        "eff": x.tpot_efficiency,
                        "ttft": x.ttft_ms,
                        "kernel": x.kernel,
                    }
                    for x in res.rows
                ],
            }
        )
    return out


def markdown(results: dict) -> str:
    """The markdown tables of a scale run, from the JSON."""
    parts = [
        table(results),
        "",
        "Per phase of each conversion (rss.py's progress marks; the plan's figure for the same phase):",
        "",
        "| model | step | phase | measured s | predicted s | phase peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for p in phase_rows(results):
        measured = f"{p['s']:.1f}" if p["timed"] else "(not timed)"
        parts.append(
            f"| {p['model']} | {p['step']} | {p['phase']} | {measured} | {p['pred_s']:.1f} | {p['peak_mb']:.0f} |"
        )
    parts += [
        "",
        "GPTQ's calibrate-and-solve phase per unit of work (decoder-linear parameters x calibration tokens):",
        "",
        "| model | step | linear params | tokens | quantize phase s | ps per (param x token) |",
        "|---|---|---|---|---|---|",
    ]
    for x in linearity(results):
        parts.append(
            f"| {x['model']} | {x['step']} | {x['linear_params'] / 1e6:.0f} M | "
            f"{x['tokens']} | {x['quantize_s']:.0f} | "
            f"{x['ps_per_param_token']:.1f} |"
        )
    fits = []
    if rule_rows(results):
        parts += [
            "",
            "Rule check (`bench --shape NAME --shape-bits 16,8,4`, synthetic weights, compiled engine):",
            "",
            "| shape | variant | GB/token | TTFT ms | TPOT ms | predicted ms | efficiency | kernel |",
            "|---|---|---|---|---|---|---|---|",
        ]
    for rc in rule_rows(results):
        for x in rc["rows"]:
            parts.append(
                f"| {rc['model']} | {x['name']} | {x['gb']:.3f} | "
                f"{x['ttft']:.0f} | {x['tpot']:.1f} | {x['pred']:.1f} | "
                f"{x['eff'] * 100:.0f}% | {x['kernel']} |"
            )
        f = rc["fit"]
        fits.append(
            f"- {rc['model']}: TPOT = {f.get('overhead_ms') or 0:.1f} ms + bytes / "
            f"{f.get('effective_gbps') or 0:.1f} GB/s, "
            f"R² {f.get('r2') if f.get('r2') is not None else float('nan'):.3f} ({f.get('points')} points)"
        )
    return "\n".join(parts + [""] + fits)


def plot(results: dict, path: Path) -> None:
    """Time and peak RSS of each step against parameters (log-log): measured (o, solid; a
    --memory-only run has no time) and predicted by --plan just before it (x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [r for r in rows(results) if r["params"]]
    if not data:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for step in sorted({r["step"] for r in data}):
        pts = sorted((r for r in data if r["step"] == step), key=lambda r: r["params"])
        for ax, key, pred in ((axes[0], "wall_s", "pred_s"), (axes[1], "peak_mb", "pred_mb")):
            shown = [r for r in pts if r["timed"] or key != "wall_s"]
            if not shown:
                continue
            (line,) = ax.plot([r["params"] / 1e9 for r in shown], [r[key] for r in shown], "o-", label=step)
            ax.plot(
                [r["params"] / 1e9 for r in shown],
                [r[pred] or float("nan") for r in shown],
                "x--",
                color=line.get_color(),
                alpha=0.7,
            )
    for ax, title in ((axes[0], "time (s)"), (axes[1], "peak RSS (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters (B)")
        ax.set_title(title + ": measured (o), --plan before it (x)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "quantkit cost against model size (2 shared CPU cores; 0.5B/1.2B: random weights, real shapes)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
