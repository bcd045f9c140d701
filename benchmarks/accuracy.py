#!/usr/bin/env python3
"""Accuracy, size and conversion cost of recipes on one model, on several domains.

Each recipe is converted by its own `quantkit convert` process (so the peak RSS is the recipe's),
then scored by one `quantkit eval` against the model it came from, on every `--text` (default: the
default domains), on the held-out windows of `--split` (default: confirmation, where no choice was
made). Writes benchmarks/results/NAME.json with one table, rendered into docs by render.py.

  python benchmarks/accuracy.py --name accuracy-demo --recipes int8-w8a16-gptq int4-w4a16-rtn int4-w4a16-gptq-g64
  python benchmarks/accuracy.py --name best-int4 --threads 1 --recipes int4-w4a16-spinquant-gptq-asym-mixed \\
      --text set:world-factbook --text set:shakespeare-plays --text set:legal-licenses
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.core.eval_results import EvalResult, TextResult


def cpu_seconds() -> float:
    """User + system CPU time of the finished child processes so far: on a shared machine wall time
    grows with the other jobs, CPU time much less."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def domain(t: TextResult) -> dict:
    return {
        "label": t.label,
        "ppl": t.ppl,
        "baseline_ppl": t.baseline_ppl,
        "delta_ppl_pct": t.delta_ppl_pct,
        "ci95_delta_ppl_pct": list(t.ci95.delta_ppl_pct),
        "kld": t.kld.mean,
        "ci95_kld": list(t.ci95.kld_mean),
        "kld_p99": t.kld.p99,
        "kl_kind": t.kl_kind,
        "top1": t.top1_agreement,
        "windows": t.windows.count,
        "split": t.windows.get("split"),
    }


def run_one(recipe: str, args, env: dict) -> dict:
    given = (Path(recipe) / "quantkit.json").is_file()  # an artifact converted outside this run: scored as it is
    art = Path(recipe) if given else Path(args.out_dir) / Path(recipe).stem
    sets = [x for s in args.sets for x in ("--set", s)]
    cpu = cpu_seconds()
    if (
        given or args.eval_only or (args.reuse and (art / "quantkit.json").is_file())
    ):  # a finished artifact (a convert writes it last)
        meta = json.loads((art / "quantkit.json").read_text())
    else:
        meta = quantkit_json(
            ["convert", recipe, "--model", args.model, "--out", str(art), "--calib", args.calib, "--force", *sets], env
        )
    convert_cpu = cpu_seconds() - cpu
    texts = [x for t in args.text for x in ("--text", t)]
    ev = EvalResult.from_json(
        quantkit_json(
            [
                "eval",
                str(art),
                "--baseline",
                args.model,
                *texts,
                "--split",
                args.split,
                "--seq-len",
                str(args.seq_len),
                "--max-tokens",
                str(args.max_tokens),
                *(["--kl", args.kl] if args.kl else []),
            ],
            env,
        )
    )
    domains = [domain(t) for t in ev.texts]
    from quantkit.models.sizes import checkpoint_sizes

    return {
        "recipe": Path(recipe).stem,
        "bits_per_weight": checkpoint_sizes(art).bits_per_weight,
        "convert_s": meta.get("wall_seconds"),
        "convert_cpu_s": round(convert_cpu, 1) if convert_cpu > 1 else None,
        "peak_rss_gb": (meta.get("peak_rss_mb") or 0) / 1024,
        "threads": (meta.get("runtime") or {}).get("torch_num_threads"),
        "calibration": (meta.get("calibration") or {}).get("source"),
        "calibration_tokens": (meta.get("calibration") or {}).get("tokens"),
        "domains": domains,
        "mixed_precision": meta.get("mixed_precision"),
    }


def table(rows: list[dict], reference: str | None = None) -> dict:
    """One row per recipe; with `reference` (a recipe among the rows), each
    domain's KL as a multiple of that recipe's."""
    labels = [d["label"] for d in rows[0]["domains"]] if rows else []
    ref = next((r for r in rows if r["recipe"] == reference), None)
    ref_kl = {d["label"]: d["kld"] for d in ref["domains"]} if ref else {}
    cols = [
        {"key": "recipe", "header": "recipe", "fmt": "`{}`"},
        {"key": "bits_per_weight", "header": "bits/weight", "fmt": "{:.2f}"},
    ]
    flat = []
    for r in rows:
        row = {k: r[k] for k in ("recipe", "bits_per_weight", "convert_s", "threads")}
        mp = r.get("mixed_precision") or {}
        if mp.get("wall_seconds") is not None and r.get("convert_s"):
            row["auto_pass"] = f"{mp['wall_seconds']:.0f} s ({100 * mp['wall_seconds'] / r['convert_s']:.0f}%)"
        for d in r["domains"]:
            lo, hi = d["ci95_delta_ppl_pct"]
            klo, khi = d["ci95_kld"]
            row[f"{d['label']}"] = (
                f"{d['delta_ppl_pct']:+.1f}% ({lo:+.1f}…{hi:+.1f}) / {d['kld']:.3f} "
                f"({klo:.3f}–{khi:.3f}) / {d['top1'] * 100:.1f}%"
            )
            if ref_kl.get(d["label"]):
                row[f"{d['label']}:ref"] = d["kld"] / ref_kl[d["label"]]
        flat.append(row)
    kinds = {d.get("kl_kind", "topk-256 lower bound") for r in rows for d in r["domains"]}  # older rows: the bound
    kl = "exact KL" if kinds == {"exact"} else "KL (" + ", ".join(sorted(kinds)) + ")"
    for label in labels:
        cols.append({"key": label, "header": f"{label}: ΔPPL (95% CI) / {kl} (CI) / top-1", "fmt": "{}"})
        if ref_kl.get(label):
            cols.append({"key": f"{label}:ref", "header": f"{label}: KL ÷ {reference}'s", "fmt": "×{:.2f}"})
    cols += [
        {"key": "convert_s", "header": "convert s", "fmt": "{:.0f}"},
        {"key": "threads", "header": "threads", "fmt": "{}"},
    ]
    if any("auto_pass" in row for row in flat):
        cols.append({"key": "auto_pass", "header": "auto's sensitivity pass (share of convert)", "fmt": "{}"})
    return {"columns": cols, "rows": flat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="the result file: benchmarks/results/NAME.json")
    ap.add_argument("--model", default="demo")
    ap.add_argument(
        "--recipes",
        nargs="+",
        required=True,
        help="built-in recipe names or paths, or finished artifact directories (scored as they are)",
    )
    ap.add_argument("--calib", default="mix:default", help="calibration SPEC for every convert")
    ap.add_argument(
        "--text", action="append", default=[], help="eval text SPEC (repeatable; default: the default domains)"
    )
    ap.add_argument("--split", default="confirmation", choices=["all", "selection", "confirmation"])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra --set for every convert")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every process (default: torch's)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--kl", choices=["exact", "topk"], help="quantkit eval --kl (default: quantkit's)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--eval-only", action="store_true", help="score the artifacts already in --out-dir")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="convert only the recipes without a finished artifact in --out-dir "
        "(the others' convert times come from their quantkit.json)",
    )
    ap.add_argument("--out-dir", default="runs/benchmarks/accuracy")
    ap.add_argument("--reference", help="a recipe among --recipes: every domain's KL also as a multiple of its KL")
    ap.add_argument(
        "--tabulate", action="store_true", help="only rebuild the table of results/NAME.json (e.g. with --reference)"
    )
    args = ap.parse_args()
    if args.tabulate:
        return tabulate(args)
    if not args.text:
        from quantkit.evals.domains import default_texts

        args.text = default_texts()
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    rows, failed, t0 = [], [], time.time()
    for recipe in args.recipes:
        try:
            rows.append(run_one(recipe, args, env))
        except RuntimeError as exc:
            failed.append({"recipe": recipe, "error": str(exc)})
            print(f"{recipe}: FAILED {exc}", file=sys.stderr)
            continue
        r = rows[-1]
        print(
            f"{r['recipe']}: {r['bits_per_weight']:.3f} b/w, "
            + ", ".join(f"{d['label']} {d['delta_ppl_pct']:+.2f}% KL {d['kld']:.4f}" for d in r["domains"]),
            file=sys.stderr,
        )
    path = write_result(
        args.name,
        {
            "model": args.model,
            "calibration": args.calib,
            "texts": args.text,
            "split": args.split,
            "threads": args.threads or os.cpu_count(),
            "wall_s": round(time.time() - t0),
            "rows": rows,
            "failed": failed,
            "reference": args.reference,
            "tables": {"main": table(rows, args.reference)},
        },
    )
    print(path)


def tabulate(args) -> None:
    """Rebuild the table of a finished run, keeping the command and date of the run that measured."""
    path = RESULTS / f"{args.name}.json"
    old = json.loads(path.read_text())
    reference = args.reference or old.get("reference")
    body = {k: v for k, v in old.items() if k != "benchmark"}  # command, machine, date: the measuring run's
    body["reference"] = reference
    body["tables"] = {"main": table(old["rows"], reference)}
    print(write_result(args.name, body))


if __name__ == "__main__":
    main()
