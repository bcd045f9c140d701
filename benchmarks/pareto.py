#!/usr/bin/env python3
"""Accuracy per bit: `quantkit pareto` on one model, written as a result file with its tables and plot.

Runs `quantkit pareto MODEL --out OUT ... --json` (re-runs reuse every finished point), keeps the
front it returns (benchmarks/results/NAME.json: `front`, with the command, machine and date), and
renders two tables from it: every point (KL per domain with its 95% CI, the worst domain) and the
comparison at each size (each line's best point of at most that size, quantkit's KL ÷ llama.cpp's on
each domain and the worst), with whether quantkit's KL is --goal-pct lower than llama.cpp's on every
domain there. The plot (front.plot: worst-domain KL against bits/weight, log KL axis, one line per
tool, CI bars) goes to docs/images/NAME.png.

The demo's weights lie on Q4_1's grid (asymmetric blocks of 32): its --mixed-types are the symmetric
types (asymmetric 32-value blocks would re-find the grid), and its compressed-tensors recipe is
symmetric INT4 g64; llama.cpp's own mixes keep their Q4_K and Q5_K (its anchor profits). The off-grid
model (benchmarks/offgrid_model.py) takes every type on both sides.

  python benchmarks/pareto.py --model demo --name pareto-demo --out runs/pareto-demo --calib-samples 32 \\
      --mixed-types IQ4_NL,IQ4_XS,Q3_K,Q5_0,Q6_K,Q8_0
  python benchmarks/pareto.py --model runs/offgrid-demo --name pareto-offgrid --out runs/pareto-offgrid \\
      --calib-samples 32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import REPO, quantkit_json, write_result

from quantkit.pipeline.front import ParetoResult
from quantkit.pipeline.front import plot as draw

SYMMETRIC = "IQ4_NL,IQ4_XS,Q3_K,Q5_0,Q6_K,Q8_0"  # the demo: no asymmetric 32-value blocks (see the docstring)


def _kl(d: dict) -> str:
    return f"{d['kl']:.4f} ({d['ci95'][0]:.4f}–{d['ci95'][1]:.4f})"


def point_rows(front: dict) -> list[dict]:
    order = {"llamacpp": 0, "gguf-mixed": 1, "compressed-tensors": 2}
    rows = []
    for p in sorted(front["points"], key=lambda p: (order[p["line"]], p["bits_per_weight"] or 0)):
        row = {"line": p["line"], "point": p["name"], "bpw": p["bits_per_weight"], "worst": p["worst_kl"]}
        row["mb"] = p["file_bytes"] / 1e6 if p["file_bytes"] else None
        for i, d in enumerate(p["domains"]):
            row[f"kl{i}"] = _kl(d)
        if p["error"]:
            row["worst"] = p["error"]
        rows.append(row)
    return rows


def _side(s: dict | None) -> str | None:
    if s is None:
        return None
    txt = f"{s['name']} ({s['bits_per_weight']:.2f}): {s['worst_kl']:.4f}"
    if s["worst_ratio"] is not None:
        each = ", ".join(f"{v:.2f}" for v in s["ratio"].values())
        txt += f" × {s['worst_ratio']:.2f} (domains × {each})"
    return txt


def size_rows(front: dict, goal: float) -> list[dict]:
    rows = []
    for c in front["comparisons"]:
        qk = c["sides"].get(c["quantkit"]) if c["quantkit"] else None
        met = None
        if qk is not None and qk["ratio"] is not None:
            met = all(r <= 1 - goal / 100 for r in qk["ratio"].values())
        rows.append(
            {
                "size": c["size"],
                "llamacpp": _side(c["sides"].get("llamacpp")),
                "mixed": _side(c["sides"].get("gguf-mixed")),
                "ct": _side(c["sides"].get("compressed-tensors")),
                "lower_pct": None if qk is None or qk["worst_ratio"] is None else 100 * (1 - qk["worst_ratio"]),
                "goal_met": met,
            }
        )
    return rows


def ablation(a: argparse.Namespace, front: dict) -> list[dict]:
    """--mixed at llama.cpp type T's size with llama-quantize's own rounding (no GPTQ), scored as the front
    scores its points, beside the front's T and --mixed T (GPTQ): what the types alone give, what the codes add."""
    t, s = a.ablation, front["settings"]
    out = a.out / "ablation" / f"mixed-{t}-llama-rounding.gguf"
    done = out.with_name(out.stem + ".eval.json")
    record = out.with_name(out.stem + ".quantkit.json")
    if not (
        done.is_file()
        and record.is_file()
        and json.loads(done.read_text())["gguf_sha256"] == json.loads(record.read_text())["sha256"]
    ):
        out.parent.mkdir(parents=True, exist_ok=True)
        args = ["export", a.model, "--format", "gguf", "--type", t, "--mixed", "--mixed-rounding", "llama-quantize"]
        args += ["--calib", a.calib, "--calib-samples", str(a.calib_samples), "--out", str(out), "--force"]
        rec = quantkit_json(args + (["--mixed-types", a.mixed_types] if a.mixed_types else []))
        texts = [x for text in front["texts"] for x in ("--text", text)]
        ev = quantkit_json(
            ["eval", str(out), "--engine", "llamacpp", "--baseline", a.model, *texts, "--split", front["split"]]
            + ["--max-tokens", str(s["max_tokens"]), "--seq-len", str(s["seq_len"])]
        )
        done.write_text(json.dumps({"gguf_sha256": rec["sha256"], "bytes": rec["bytes"], "eval": ev}) + "\n")
    made = json.loads(done.read_text())
    by = {p["name"]: p for p in front["points"]}
    anchor, gptq = by[f"llamacpp-{t}"], by[f"mixed-{t}"]
    plain = {x["text"]: x["kld"]["mean"] for x in made["eval"]["texts"]}
    rows = []
    for name, kls, mb in (
        (f"llama.cpp {t} + imatrix", {d["text"]: d["kl"] for d in anchor["domains"]}, anchor["file_bytes"]),
        (f"--type {t} --mixed, llama-quantize's rounding", plain, made["bytes"]),
        (f"--type {t} --mixed (GPTQ codes)", {d["text"]: d["kl"] for d in gptq["domains"]}, gptq["file_bytes"]),
    ):
        ref = {d["text"]: d["kl"] for d in anchor["domains"]}
        for text in front["texts"]:
            rows.append(
                {"gguf": name, "text": text, "mb": mb / 1e6, "kl": kls[text], "vs": 100 * (kls[text] / ref[text] - 1)}
            )
    return rows


ABLATION = [
    {"key": "gguf", "header": "GGUF"},
    {"key": "text", "header": "text"},
    {"key": "mb", "header": "MB", "fmt": "{:.2f}"},
    {"key": "kl", "header": "KL", "fmt": "{:.4f}"},
    {"key": "vs", "header": "KL vs llama.cpp's %", "fmt": "{:+.0f}"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="a checkpoint directory or a name quantkit knows")
    ap.add_argument("--name", default="pareto-demo", help="the result file: benchmarks/results/NAME.json")
    ap.add_argument("--out", type=Path, required=True, help="the front's directory (quantkit pareto --out)")
    ap.add_argument("--calib", default="mix:default")
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--sizes", default="3.5,4,4.5,5,5.5,6")
    ap.add_argument("--mixed-types", default=None, help="--mixed's types (the demo: " + SYMMETRIC + ")")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--goal-pct", type=float, default=40.0, help="quantkit's KL this much lower on every domain")
    ap.add_argument("--anchors", default=None, help="llama.cpp's types (default: the command's)")
    ap.add_argument("--lines", default=None, help="the lines of the front to make (default: the command's)")
    ap.add_argument("--text", action="append", default=[], help="evaluation text (default: the command's three)")
    ap.add_argument("--ablation", default=None, metavar="T", help="also --mixed at T's size without GPTQ's codes")
    a = ap.parse_args()
    args = ["pareto", a.model, "--calib", a.calib, "--out", str(a.out), "--sizes", a.sizes]
    args += ["--calib-samples", str(a.calib_samples), "--max-tokens", str(a.max_tokens)]
    args += ["--mixed-types", a.mixed_types] if a.mixed_types else []
    args += ["--anchors", a.anchors] if a.anchors else []
    args += ["--lines", a.lines] if a.lines else []
    front = quantkit_json(args + [x for t in a.text for x in ("--text", t)])
    labels = {d["text"]: d["label"] for p in front["points"] for d in p["domains"]}
    texts = front["texts"]
    kinds = ", ".join(front["kl_kinds"])
    points = (
        [
            {"key": "line", "header": "line"},
            {"key": "point", "header": "point"},
            {"key": "bpw", "header": "bits/weight", "fmt": "{:.2f}"},
            {"key": "mb", "header": "MB", "fmt": "{:.1f}"},
        ]
        + [{"key": f"kl{i}", "header": f"{labels.get(t, t)} KL (95% CI)"} for i, t in enumerate(texts)]
        + [{"key": "worst", "header": "worst-domain KL", "fmt": "{:.4f}"}]
    )
    sizes = [
        {"key": "size", "header": "size ≤ b/w", "fmt": "{:g}"},
        {"key": "llamacpp", "header": "llama.cpp's best: worst-domain KL"},
        {"key": "mixed", "header": "quantkit GGUF --mixed: KL, × llama.cpp's"},
        {"key": "ct", "header": "quantkit compressed-tensors: KL, × llama.cpp's"},
        {"key": "lower_pct", "header": "quantkit's best: worst-domain KL lower %", "fmt": "{:.0f}"},
        {"key": "goal_met", "header": f"{a.goal_pct:g}% lower on every domain"},
    ]
    note = (
        f"KL ({kinds}) against the 16-bit model on the {front['split']} windows of each text (up to "
        f"{front['settings']['max_tokens']} tokens each, windows of {front['settings']['seq_len']}), each point on "
        "the engine that serves it (llama.cpp for GGUFs, transformers for compressed-tensors); every choice "
        f"fitted on {front['calib']} ({front['settings']['calib_samples']} windows for the importance matrix and "
        "GPTQ, auto's and --mixed's own windows); bits/weight: " + front["accounting"]
    )
    plot = REPO / "docs" / "images" / f"{a.name}.png"
    draw(ParetoResult.from_json(front), plot)
    body = {
        "model": a.model,
        "goal_pct": a.goal_pct,
        "plot": str(plot.relative_to(REPO)),
        "front": front,
        "tables": {
            "points": {"columns": points, "rows": point_rows(front), "note": note},
            "sizes": {
                "columns": sizes,
                "rows": size_rows(front, a.goal_pct),
                "note": "each line's best point (lowest worst-domain KL) of at most the size; × : its KL ÷ "
                "llama.cpp's best there, on the worst domain and on each; — : no point that small",
            },
        },
    }
    if a.ablation:
        body["tables"]["ablation"] = {
            "columns": ABLATION,
            "rows": ablation(a, front),
            "note": f"at {a.ablation}'s size, the same windows and KL as the front's points; "
            f"--mixed among {a.mixed_types or 'the default types'}",
        }
    provenance = Path(front["settings"]["model"]) / "offgrid.json"  # how offgrid_model.py made the checkpoint
    if provenance.is_file():
        body["offgrid"] = json.loads(provenance.read_text())
    print(write_result(a.name, body), file=sys.stderr)


if __name__ == "__main__":
    main()
