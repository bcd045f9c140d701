#!/usr/bin/env python3
"""How far the top-256 bound is from the exact KL, and what the exact KL costs, on the demo's variants.

For each variant and text: one `quantkit eval --kl exact` and one `--kl topk` on the same held-out
windows against the same cached baseline pass (made first, by evaluating the baseline against
itself), each timed (wall and CPU seconds of its process). Writes benchmarks/results/NAME.json with
one table (render.py): the exact KL, the bound, the bound's shortfall, each one's time and their ratio.

The default variants are the demo's: its FP16 checkpoint scored in llama.cpp (exported exactly on
the fly: llama.cpp's kernels against transformers' float32), its INT8 GPTQ and INT4 GPTQ g64
artifacts (converted here unless --out-dir holds them).

  python benchmarks/kl_bound.py --name kl-bound-demo
  python benchmarks/kl_bound.py --name kl-bound-demo --variant int4=runs/demo/artifacts/int4-gptq-g64 \\
      --text set:world-factbook --max-tokens 4096
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

from quantkit.core.eval_results import EvalResult

# name -> (a built-in recipe converted from --model, or None: the model itself), the eval engine
DEMO_VARIANTS = {
    "fp16": (None, "llamacpp"),
    "int8-gptq": ("int8-w8a16-gptq", "transformers"),
    "int4-gptq-g64": ("int4-w4a16-gptq-g64", "transformers"),
}
COLUMNS = [
    {"key": "variant", "header": "variant", "fmt": "`{}`"},
    {"key": "engine", "header": "engine", "fmt": "{}"},
    {"key": "domain", "header": "domain", "fmt": "{}"},
    {"key": "exact", "header": "KL exact", "fmt": "{:.4f}"},
    {"key": "exact_ci", "header": "95% CI", "fmt": "{0:.4f}–{1:.4f}"},
    {"key": "bound", "header": "KL top-256 bound", "fmt": "{:.4f}"},
    {"key": "short_pct", "header": "bound below exact", "fmt": "{:.1f}%"},
    {"key": "exact_p99", "header": "p99 exact / bound", "fmt": "{}"},
    {"key": "exact_s", "header": "exact s", "fmt": "{:.1f}"},
    {"key": "bound_s", "header": "bound s", "fmt": "{:.1f}"},
    {"key": "cost", "header": "exact ÷ bound time (CPU)", "fmt": "{:.2f}×"},
]


def child_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed_eval(args: list[str], env: dict) -> tuple[EvalResult, float, float]:
    """`quantkit eval ARGS --json` in its own process: its result, wall seconds, CPU seconds."""
    wall, cpu = time.perf_counter(), child_cpu_seconds()
    ev = EvalResult.from_json(quantkit_json(["eval", *args], env))
    return ev, time.perf_counter() - wall, child_cpu_seconds() - cpu


def variants(a: argparse.Namespace, env: dict) -> list[tuple[str, str, str]]:
    """(name, path, engine) of every variant: --variant NAME=PATH[:ENGINE], else the demo's."""
    if a.variant:
        out = []
        for v in a.variant:
            name, _, rest = v.partition("=")
            path, _, engine = rest.partition(":")
            out.append((name, path, engine or "transformers"))
        return out
    out = []
    for name, (recipe, engine) in DEMO_VARIANTS.items():
        if recipe is None:
            out.append((name, a.model, engine))
            continue
        art = Path(a.out_dir) / name
        if not (art / "quantkit.json").is_file():
            convert = ["convert", recipe, "--model", a.model, "--out", str(art), "--calib", a.calib, "--force"]
            quantkit_json(convert, env)
        out.append((name, str(art), engine))
    return out


def row(name: str, engine: str, exact, bound, exact_s: tuple, bound_s: tuple) -> dict:
    e, b = exact.kld, bound.kld
    return {
        "variant": name,
        "engine": engine,
        "domain": exact.label,
        "exact": e.mean,
        "exact_ci": list(exact.ci95.kld_mean),
        "bound": b.mean,
        "bound_ci": list(bound.ci95.kld_mean),
        "short_pct": 100 * (1 - b.mean / e.mean) if e.mean > 0 else 0.0,
        "exact_p99": f"{e.p99:.3f} / {b.p99:.3f}",
        "kl_kinds": [exact.kl_kind, bound.kl_kind],
        "tokens": exact.tokens,
        "exact_s": exact_s[0],
        "bound_s": bound_s[0],
        "exact_cpu_s": exact_s[1],
        "bound_cpu_s": bound_s[1],
        "cost": exact_s[1] / bound_s[1] if bound_s[1] > 0 else None,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="kl-bound-demo", help="the result file: RESULTS/NAME.json")
    ap.add_argument("--model", default="demo", help="the baseline (and the fp16 variant)")
    ap.add_argument(
        "--variant", action="append", default=[], help="NAME=PATH[:ENGINE], repeatable (default: the demo's)"
    )
    ap.add_argument(
        "--text", action="append", default=[], help="eval text SPEC, repeatable (default: the default domains)"
    )
    ap.add_argument("--split", default="confirmation", choices=["all", "selection", "confirmation"])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--calib", default="mix:default", help="calibration SPEC of the converted variants")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every process (default: torch's)")
    ap.add_argument("--out-dir", default="runs/benchmarks/kl-bound", help="where the converted variants are kept")
    ap.add_argument("--results", default=str(RESULTS), help="the directory the result file is written to")
    a = ap.parse_args(argv)
    if not a.text:
        from quantkit.evals.domains import default_texts

        a.text = default_texts()
    env = {"QUANTKIT_NO_PROGRESS": "1", **({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {})}
    texts = [x for t in a.text for x in ("--text", t)]
    common = ["--baseline", a.model, *texts, "--split", a.split]
    common += ["--seq-len", str(a.seq_len), "--max-tokens", str(a.max_tokens)]
    t0 = time.time()
    made = variants(a, env)
    quantkit_json(
        ["eval", a.model, *common, "--kl", "exact"], env
    )  # the baseline pass, cached as the exact KL needs it
    rows = []
    for name, path, engine in made:
        runs = {}
        for kl in ("topk", "exact"):
            runs[kl] = timed_eval([path, *common, "--engine", engine, "--kl", kl], env)
        (exact, *exact_s), (bound, *bound_s) = runs["exact"], runs["topk"]
        for te, tb in zip(exact.texts, bound.texts):
            rows.append(row(name, engine, te, tb, exact_s, bound_s))
            r = rows[-1]
            print(
                f"{name} ({engine}) {r['domain']}: exact {r['exact']:.4f}, bound {r['bound']:.4f} "
                f"({r['short_pct']:.1f}% below), time x{r['cost'] or 0:.2f}",
                file=sys.stderr,
            )
    note = (
        f"KL(baseline ‖ variant) on the {a.split} windows ({a.seq_len}-token windows, up to {a.max_tokens} tokens per "
        "text) against the cached baseline pass: exact over the whole vocabulary, and the top-256 bound (the "
        "baseline's top 256 tokens plus one tail bucket). Times: one `quantkit eval` process per variant and KL "
        "kind, every text in it; the ratio is of CPU seconds (the baseline pass already cached)."
    )
    path = write_result(
        a.name,
        {
            "model": a.model,
            "texts": a.text,
            "split": a.split,
            "seq_len": a.seq_len,
            "max_tokens": a.max_tokens,
            "threads": a.threads or os.cpu_count(),
            "wall_s": round(time.time() - t0),
            "variants": [{"name": n, "path": p, "engine": e} for n, p, e in made],
            "rows": rows,
            "tables": {"main": {"columns": COLUMNS, "rows": rows, "note": note}},
        },
        results=Path(a.results),
    )
    print(path)


if __name__ == "__main__":
    main()
