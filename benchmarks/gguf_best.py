#!/usr/bin/env python3
"""quantkit's GGUF at llama.cpp's size against llama.cpp's own best practice, on one model.

The anchor: `quantkit export demo --format gguf --type T` (llama-imatrix over quantkit's calibration
windows, then llama-quantize T). The candidate: the same with `--mixed` (each decoder-layer weight's
type chosen among --mixed-types by its K-FAC estimated KL, within the bytes of T's own file). Both
are scored through llama.cpp against the FP16 checkpoint (`quantkit eval --engine llamacpp`) on each
--text, on the selection split (where choices are made) and the confirmation split (reported), and
each candidate row gives its KL change against the anchor on the same split and text, next to the
target (--target-pct lower on every text).

The demo's weights lie on Q4_1's grid (asymmetric blocks of 32), so asymmetric types with blocks of
32 (Q4_1, Q5_1, and the K-quants Q4_K and Q5_K with their 32-value sub-blocks) would round them
almost exactly; the default --mixed-types leaves them out, so the choice cannot profit from the grid
(the anchor's own Q4_K_M still gives half its ffn_down weights Q4_K, and profits). A checkpoint on no
grid (benchmarks/offgrid_model.py: the demo with rotations fused) takes every type on both sides.

  python benchmarks/gguf_best.py --out /tmp/gguf-best --calib-samples 32 \\
      --text set:world-factbook --text set:python-stdlib-code --text set:shakespeare-plays --max-tokens 4096
  python benchmarks/gguf_best.py --model runs/offgrid-demo --name gguf_best_offgrid --mixed-types all ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import quantkit_json, write_result

from quantkit.core.eval_results import EvalResult, TextResult
from quantkit.pipeline.accuracy import kl_header

SYMMETRIC = "IQ4_NL,IQ4_XS,Q5_0,Q6_K,Q8_0"  # no asymmetric 32-value blocks: see the docstring


def export(src: str, out: Path, a: argparse.Namespace, mixed: bool) -> dict:
    record = out.with_name(out.stem + ".quantkit.json")
    if a.reuse and out.is_file() and record.is_file():  # an earlier run's file, as its record describes it
        return json.loads(record.read_text())
    args = [
        "export",
        src,
        "--format",
        "gguf",
        "--type",
        a.type,
        "--out",
        str(out),
        "--force",
        "--calib",
        a.calib,
        "--calib-samples",
        str(a.calib_samples),
    ]
    return quantkit_json(args + (["--mixed", "--mixed-types", a.mixed_types] if mixed else []))


def scores(gguf: Path, src: str, split: str, a: argparse.Namespace) -> dict[str, TextResult]:
    texts = [x for t in a.text for x in ("--text", t)]
    ev = quantkit_json(
        [
            "eval",
            str(gguf),
            "--engine",
            "llamacpp",
            "--baseline",
            src,
            *texts,
            "--split",
            split,
            "--max-tokens",
            str(a.max_tokens),
        ]
    )
    return {t.text: t for t in EvalResult.from_json(ev).texts}


def row(name: str, rec: dict, split: str, text: str, ev: TextResult, anchor: TextResult | None, target: float) -> dict:
    kl = ev.kld.mean
    change = None if anchor is None else 100 * (kl / anchor.kld.mean - 1)
    return {
        "gguf": name,
        "split": split,
        "text": text,
        "mb": rec["bytes"] / 1e6,
        "bpw": rec.get("bits_per_weight_layers"),
        "kl": kl,
        "kl_kind": ev.kl_kind,
        "kl_ci": list(ev.ci95.kld_mean),
        "dppl": ev.delta_ppl_pct,
        "top1": ev.top1_agreement * 100,
        "tokens": ev.tokens,
        "change_pct": change,
        "target_met": None if change is None else change <= -target,
    }


COLUMNS = [
    {"key": "gguf", "header": "GGUF"},
    {"key": "split", "header": "split"},
    {"key": "text", "header": "text"},
    {"key": "mb", "header": "MB", "fmt": "{:.2f}"},
    {"key": "bpw", "header": "bits/weight (layers)", "fmt": "{:.2f}"},
    {"key": "kl", "header": "KL", "fmt": "{:.4f}"},
    {"key": "change_pct", "header": "KL vs anchor %", "fmt": "{:+.1f}"},
    {"key": "dppl", "header": "ΔPPL %", "fmt": "{:+.2f}"},
    {"key": "top1", "header": "top-1 %", "fmt": "{:.1f}"},
    {"key": "target_met", "header": "target met"},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the GGUFs are written")
    ap.add_argument("--model", default="demo", help="a checkpoint directory or a name quantkit knows")
    ap.add_argument("--name", default="gguf_best", help="the result file: benchmarks/results/NAME.json")
    ap.add_argument(
        "--type", default="Q4_K_M", help="llama-quantize's type: the anchor, and the size the candidate keeps to"
    )
    ap.add_argument("--mixed-types", default=SYMMETRIC, help="--mixed's types, or `all` for export's default list")
    ap.add_argument("--calib", default="mix:default")
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--text", action="append", default=[])
    ap.add_argument("--splits", default="selection,confirmation")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument(
        "--target-pct", type=float, default=25.0, help="the KL reduction against the anchor asked on every text"
    )
    ap.add_argument(
        "--reuse", action="store_true", help="take the GGUFs an earlier run left in --out (with their records)"
    )
    a = ap.parse_args()
    if a.mixed_types == "all":
        from quantkit.quantize.kquant_chooser import DEFAULT_TYPES

        a.mixed_types = ",".join(DEFAULT_TYPES)
    if not a.text:
        ap.error("give at least one --text")
    from quantkit.models.resolve import resolve_path

    src = str(resolve_path(a.model, pull=False))
    a.out.mkdir(parents=True, exist_ok=True)
    stem = Path(a.model).name
    made = {
        f"{a.type}": (a.out / f"{stem}-{a.type}.gguf", False),
        f"{a.type} --mixed": (a.out / f"{stem}-{a.type}-mixed.gguf", True),
    }
    records = {}
    for name, (path, mixed) in made.items():
        records[name] = export(src, path, a, mixed)
        print(f"{name}: {records[name]['bytes'] / 1e6:.2f} MB", file=sys.stderr)
    rows = []
    for split in a.splits.split(","):
        evs = {name: scores(path, src, split, a) for name, (path, _) in made.items()}
        anchor = evs[a.type]
        for name in made:
            rows += [
                row(name, records[name], split, t, evs[name][t], None if name == a.type else anchor[t], a.target_pct)
                for t in a.text
            ]
    body = {
        "model": a.model,
        "calibration": {"calib": a.calib, "samples": a.calib_samples},
        "type": a.type,
        "mixed_types": a.mixed_types,
        "target_pct": a.target_pct,
        "target_met": all(
            r["target_met"] for r in rows if r["target_met"] is not None and r["split"] == "confirmation"
        ),
        "exports": {
            name: {k: rec.get(k) for k in ("bytes", "tensor_types", "bits_per_weight_layers")}
            | (
                {
                    "mixed": {
                        k: rec["mixed"][k]
                        for k in (
                            "budget_bytes",
                            "reference_bytes",
                            "candidates",
                            "windows",
                            "cost_reference",
                            "cost_chosen",
                            "seconds",
                        )
                    }
                }
                if rec.get("mixed")
                else {}
            )
            for name, rec in records.items()
        },
        "tables": {
            "main": {
                "columns": [
                    {**c, "header": kl_header(r["kl_kind"] for r in rows)} if c["key"] == "kl" else c for c in COLUMNS
                ],
                "rows": rows,
                "note": (
                    "KL vs the FP16 checkpoint through llama.cpp (quantkit eval --engine "
                    "llamacpp), windows of 512 tokens, up to "
                    f"{a.max_tokens} tokens per text; importance matrix: llama-imatrix over "
                    f"{a.calib_samples} windows of {a.calib}; "
                    f"--mixed among {a.mixed_types} within {a.type}'s own bytes; "
                    f"target: KL {a.target_pct:g}% below {a.type} on "
                    "every text"
                ),
            }
        },
    }
    provenance = Path(src) / "offgrid.json"  # how offgrid_model.py made the checkpoint
    if provenance.is_file():
        body["offgrid"] = json.loads(provenance.read_text())
    print(write_result(a.name, body))


if __name__ == "__main__":
    main()
