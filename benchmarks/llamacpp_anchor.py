#!/usr/bin/env python3
"""llama.cpp's own tools beside quantkit on the demo model, in two tables.

main: `quantkit bench --engine llamacpp` on the demo's GGUFs (F16: the exact export; Q8_0 and Q4_0:
`quantkit export --type`), with llama-bench's pp/tg on the same file, threads and lengths beside
quantkit's TTFT/TPOT, and their ratio (flagged beyond 10%). Each bench times llama-bench, then
quantkit, then llama-bench again, back to back, and compares quantkit with the mean of the two
llama-bench runs around it (a drift of the machine's speed over the three moves both sides
alike). With --rounds N the GGUFs are benched in turn N times (F16, Q8_0, Q4_0, F16, ...), and a
row gives the median of its rounds' ratios and their range: on a shared machine one pair of runs
can differ by more than the engines do.

kquant: `quantkit export demo --format gguf --type T` for llama-quantize's types, the importance
matrix from the calibration windows a convert reads (--calib, default mix:default), scored like
any GGUF: `quantkit eval --engine llamacpp X.gguf --baseline demo` on each --text (confirmation
split), with the file size, decoder-layer bits/weight and the tensors that fell back to another type.

  python benchmarks/llamacpp_anchor.py --out /tmp/anchor --types Q4_K_M,Q5_K_M,Q6_K,IQ4_XS,Q4_0 \\
      --text set:world-factbook --text set:python-stdlib-code --text set:shakespeare-plays
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import QUANTKIT, RESULTS, quantkit_json, write_result

from quantkit.core.eval_results import EvalResult
from quantkit.pipeline.accuracy import kl_header


def demo() -> str:
    return subprocess.run(
        [*QUANTKIT, "models", "path", "demo"], capture_output=True, text=True, check=True
    ).stdout.strip()


def export(src: str, out: Path, qtype: str | None, calib: list[str], reuse: bool) -> dict:
    record = out.with_name(out.stem + ".quantkit.json")
    if reuse and out.is_file() and record.is_file():  # an earlier run's file, as its record describes it
        return json.loads(record.read_text())
    args = ["export", src, "--format", "gguf", "--out", str(out), "--force"]
    return quantkit_json(args + (["--type", qtype, *calib] if qtype else []))


def bench_once(gguf: Path, a: argparse.Namespace) -> dict:
    """quantkit's bench between two llama-bench runs (one before it, and the one `bench` runs after
    it): its ratios are to their mean, so a machine whose speed drifts linearly over the three
    runs moves both sides alike."""
    from quantkit.bench.bench_records import BenchResult
    from quantkit.bench.llama_bench import compare, measure
    from quantkit.bench.row_parts import Anchor
    from quantkit.gguf.tools import available_cores

    threads = a.threads or available_cores()
    before = measure(gguf, a.prompt_len, a.gen_len, threads, a.repeats)
    res = quantkit_json(
        [
            "bench",
            str(gguf),
            "--engine",
            "llamacpp",
            "--prompt-len",
            str(a.prompt_len),
            "--gen-len",
            str(a.gen_len),
            "--repeats",
            str(a.repeats),
            "--threads",
            str(threads),
        ]
    )
    result = BenchResult.from_json(res)
    anchor = result.rows[0].anchor
    row = result.rows[0].to_json()
    if "ttft_ms" in before and isinstance(anchor, Anchor) and anchor.ttft_ms is not None:
        after = anchor.figures()
        mean = {k: (before[k] + after[k]) / 2 for k in ("ttft_ms", "tpot_ms")}
        row["anchor"] = {
            **compare(row["ttft_ms"], row["tpot_ms"], {**after, **mean}).to_json(),
            "before": {k: before[k] for k in mean},
            "after": {k: after[k] for k in mean},
        }
    return {**row, "load_average": result.load_average.to_json()}


def bench_row(name: str, runs: list[dict]) -> dict:
    """One GGUF's rounds: the median round (by its TPOT ratio) gives the figures, with every round's ratios."""
    from statistics import median

    ok = [r for r in runs if "ttft_ms" in (r.get("anchor") or {})]
    r = sorted(ok, key=lambda x: x["anchor"]["ratio_tpot"])[len(ok) // 2] if ok else runs[0]
    an = r.get("anchor") or {}
    tpot, ttft = [x["anchor"]["ratio_tpot"] for x in ok], [x["anchor"]["ratio_ttft"] for x in ok]
    return {
        "gguf": name,
        "threads": r["threads"],
        "ttft_ms": r["ttft_ms"],
        "tpot_ms": r["tpot_ms"],
        "lb_ttft_ms": an.get("ttft_ms"),
        "lb_tpot_ms": an.get("tpot_ms"),
        "lb_pp_tps": an.get("pp_tokens_per_s"),
        "lb_tg_tps": an.get("tg_tokens_per_s"),
        "ratio_ttft": median(ttft) if ttft else None,
        "ratio_tpot": median(tpot) if tpot else None,
        "rounds": len(runs),
        "ratio_tpot_range": f"{min(tpot):.2f}–{max(tpot):.2f}" if tpot else "-",
        "ratio_ttft_range": f"{min(ttft):.2f}–{max(ttft):.2f}" if ttft else "-",
        "round_ratios_tpot": tpot,
        "round_ratios_ttft": ttft,
        # llama-bench against itself within each round: its run before quantkit's over its run after
        "round_anchor_tpot_before_after": [
            x["anchor"]["before"]["tpot_ms"] / x["anchor"]["after"]["tpot_ms"] for x in ok if "before" in x["anchor"]
        ],
        "flag": ", ".join(an.get("disagree") or []) or ("-" if "ttft_ms" in an else an.get("error", "?")),
        "kernel": r["kernel"],
        "llama_library": (r.get("engine_info") or {}).get("llama_library"),
        "anchor_backends": an.get("backends"),
        "load_average": [x.get("load_average") for x in runs],
    }


def eval_rows(name: str, gguf: Path, rec: dict, src: str, texts: list[str], a: argparse.Namespace) -> list[dict]:
    rows = []
    for text in texts:
        ev = quantkit_json(
            [
                "eval",
                str(gguf),
                "--engine",
                "llamacpp",
                "--baseline",
                src,
                "--text",
                text,
                "--split",
                a.split,
                "--seq-len",
                str(a.seq_len),
                "--max-tokens",
                str(a.max_tokens),
            ]
        )
        t = EvalResult.from_json(ev).primary
        rows.append(
            {
                "type": name,
                "text": text,
                "mb": rec["bytes"] / 1e6,
                "bpw": rec.get("bits_per_weight_layers"),
                "kl": t.kld.mean,
                "kl_kind": t.kl_kind,
                "kl_lo": t.ci95.kld_mean[0],
                "kl_hi": t.ci95.kld_mean[1],
                "dppl": t.delta_ppl_pct,
                "top1": t.top1_agreement * 100,
                "fallbacks": len(rec.get("fallbacks") or []),
                "fallback_types": ", ".join(f"{n} {t}" for t, n in (rec.get("fallback_types") or {}).items()) or "-",
            }
        )
    return rows


MAIN = [
    {"key": "gguf", "header": "GGUF"},
    {"key": "threads", "header": "threads"},
    {"key": "ttft_ms", "header": "quantkit TTFT ms", "fmt": "{:.1f}"},
    {"key": "lb_ttft_ms", "header": "llama-bench pp ms", "fmt": "{:.1f}"},
    {"key": "ratio_ttft", "header": "median ratio", "fmt": "{:.2f}"},
    {"key": "tpot_ms", "header": "quantkit TPOT ms", "fmt": "{:.2f}"},
    {"key": "lb_tpot_ms", "header": "llama-bench tg ms/token", "fmt": "{:.2f}"},
    {"key": "ratio_tpot", "header": "median ratio", "fmt": "{:.2f}"},
    {"key": "ratio_tpot_range", "header": "TPOT ratio, every round"},
    {"key": "flag", "header": ">10%"},
]
KQUANT = [
    {"key": "type", "header": "type"},
    {"key": "text", "header": "text"},
    {"key": "mb", "header": "MB", "fmt": "{:.1f}"},
    {"key": "bpw", "header": "bits/weight (layers)", "fmt": "{:.2f}"},
    {"key": "kl", "header": "KL", "fmt": "{:.4f}"},
    {"key": "dppl", "header": "ΔPPL %", "fmt": "{:+.2f}"},
    {"key": "top1", "header": "top-1 %", "fmt": "{:.1f}"},
    {"key": "fallback_types", "header": "fell back"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the GGUFs are written")
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K,IQ4_XS,Q4_0")
    ap.add_argument(
        "--bench-types", default="F16,Q8_0,Q4_0", help="the GGUFs the anchor table benches (F16: the exact export)"
    )
    ap.add_argument("--calib", default="mix:default")
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--text", action="append", default=[])
    ap.add_argument("--split", default="confirmation")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="bench every GGUF this many times, in turn (median ratio)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument(
        "--reuse", action="store_true", help="take the GGUFs an earlier run left in --out (with their records)"
    )
    a = ap.parse_args()
    src, calib = demo(), ["--calib", a.calib, "--calib-samples", str(a.calib_samples)]
    a.out.mkdir(parents=True, exist_ok=True)
    made: dict[str, tuple[Path, dict]] = {}
    for t in dict.fromkeys([*a.bench_types.split(","), *a.types.split(",")]):
        path = a.out / f"demo-{t}.gguf"
        made[t] = (path, export(src, path, None if t == "F16" else t, calib, a.reuse))
        print(f"{t}: {made[t][1]['bytes'] / 1e6:.1f} MB", file=sys.stderr)
    tables, body = (
        {},
        {
            "calibration": {"calib": a.calib, "samples": a.calib_samples},
            "exports": {
                t: {
                    k: r.get(k)
                    for k in (
                        "bytes",
                        "tensor_types",
                        "fallback_types",
                        "bits_per_weight",
                        "bits_per_weight_layers",
                        "imatrix",
                    )
                }
                for t, (_, r) in made.items()
            },
        },
    )
    if not a.skip_bench:
        names = a.bench_types.split(",")
        runs: dict[str, list[dict]] = {t: [] for t in names}
        for _ in range(a.rounds):
            for t in names:
                runs[t].append(bench_once(made[t][0], a))
        rows = [bench_row(t, runs[t]) for t in names]
        lib = (
            "the tools' libllama (ggml's run-time CPU dispatch, as llama-bench)"
            if "dispatch" in str(rows[0]["llama_library"])
            else "its wheel's libllama"
        )
        tables["main"] = {
            "columns": MAIN,
            "rows": rows,
            "note": f"batch 1, prompt {a.prompt_len}, {a.gen_len} generated tokens, "
            f"{a.repeats} repeats, {a.rounds} round(s) in turn, each quantkit bench between two "
            "llama-bench runs (llama-bench figures: their mean; times: the round with the median TPOT "
            "ratio; median ratio: over every round's quantkit/llama-bench ratio; range: every round's); "
            f"quantkit times llama-cpp-python on {lib}; "
            f"load average {os.getloadavg()[0]:.1f} at the end",
        }
    if not a.skip_eval and a.text:
        rows = [r for t in a.types.split(",") for r in eval_rows(t, made[t][0], made[t][1], src, a.text, a)]
        tables["kquant"] = {
            "columns": [
                {**c, "header": kl_header(r["kl_kind"] for r in rows)} if c["key"] == "kl" else c for c in KQUANT
            ],
            "rows": rows,
            "note": f"KL vs the FP16 checkpoint through llama.cpp (quantkit eval "
            f"--engine llamacpp), split {a.split}, windows of {a.seq_len} "
            f"tokens, up to {a.max_tokens} tokens per text; "
            f"importance matrix: llama-imatrix over {a.calib_samples} windows of {a.calib}",
        }
    previous = RESULTS / "llamacpp_anchor.json"  # a --skip-bench or --skip-eval run keeps the other table
    if previous.is_file():
        old = json.loads(previous.read_text())
        made_then = {k: old.get(k) for k in ("command", "machine", "date")}
        kept = {
            name: {**t, "source": t.get("source") or made_then}
            for name, t in old.get("tables", {}).items()
            if name not in tables
        }
        tables = {**kept, **tables}
        body["earlier_runs"] = [{k: old.get(k) for k in ("command", "date", "calibration")}]
    print(write_result("llamacpp_anchor", {**body, "tables": tables}))


if __name__ == "__main__":
    main()
