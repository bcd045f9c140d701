#!/usr/bin/env python3
"""The FP4 recipes through GGUF into llama.cpp, on one model: how exact the export is, what llama.cpp
then computes, and its speed.

Per recipe (nvfp4-w4a16, mxfp4-w4a16): `quantkit convert` (an artifact already in --work is
reused), `quantkit export --format gguf` (MXFP4 exactly to GGUF's MXFP4; NVFP4 first as asked, which
records the refusal line, then with --allow-lossy, whose KL against the artifact the export measures
on --text), then on the held-out windows of --text: the artifact against the model in transformers,
the GGUF against the model in llama.cpp (`quantkit eval --engine llamacpp`), and `quantkit bench
--engine llamacpp` of the GGUF. Writes benchmarks/results/gguf_fp4.json.

  python benchmarks/gguf_fp4.py                        # the demo model, artifacts in runs/gguf-fp4
  python benchmarks/gguf_fp4.py --tabulate             # only rewrite the table from the result file

The table says which kernel bench ran, not its speed: the run's machine was shared (its load
average is in each record's bench), and the speed of llama.cpp's FP4 kernels is not this file's claim.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import RESULTS, quantkit_json, write_result

NAME = "gguf_fp4"
RECIPES = ("nvfp4-w4a16", "mxfp4-w4a16")


def attempt(args: list[str]) -> tuple[dict | None, str | None]:
    try:
        return quantkit_json(args), None
    except RuntimeError as exc:
        return None, str(exc).removeprefix("error: ")


def evaluate(model: Path, a, engine: str) -> dict:
    out, err = attempt(
        ["eval", str(model), "--baseline", a.model, "--engine", engine, "--text", a.text, "--split", a.split]
        + ["--max-tokens", str(a.max_tokens)]
    )
    if out is None:
        return {"error": err}
    (t,) = out["texts"]
    return {"kl": t["kld"]["mean"], "ppl": t["ppl"], "baseline_ppl": t["baseline_ppl"], "top1": t["top1_agreement"]}


def measure(recipe: str, a) -> dict:
    art = Path(a.work) / recipe
    rec: dict = {"recipe": recipe}
    if not (art / "quantkit.json").is_file():
        t0 = time.monotonic()
        quantkit_json(["convert", recipe, "--model", a.model, "--out", str(art)])
        rec["convert_s"] = round(time.monotonic() - t0, 1)
    gguf = Path(a.work) / f"{recipe}.gguf"
    export = ["export", str(art), "--format", "gguf", "--out", str(gguf), "--force", "--kl-text", a.text]
    exported, rec["refused"] = attempt(export)
    if exported is None:
        exported, err = attempt(export + ["--allow-lossy"])
        if exported is None:
            return {**rec, "error": err}
    v = exported["verification"]
    rec["export"] = {
        "lossless": exported["lossless"],
        "tensor_types": exported["tensor_types"],
        "exact_tensors": f"{v['exact_tensors']} of {v['tensors']}",
        "max_abs_diff": max([v["max_abs_diff_exact"], *(t["max_abs_diff"] for t in exported["lossy_tensors"])]),
        "kl_vs_artifact": (exported.get("kl_vs_artifact") or {}).get("mean_kl"),
        "bytes": exported["bytes"],
    }
    rec["transformers"] = evaluate(art, a, "transformers")
    rec["llamacpp"] = evaluate(gguf, a, "llamacpp")
    fast = ["--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len), "--repeats", str(a.repeats)]
    bench, err = attempt(["bench", str(gguf), "--engine", "llamacpp", *fast])
    rec["bench"] = (
        {"error": err}
        if bench is None
        else {
            **{k: bench["rows"][0][k] for k in ("ttft_ms", "tpot_ms", "kernel")},
            "load_average": bench["load_average"],
        }
    )
    return rec


def table(records: list[dict]) -> dict:
    rows = [
        {
            "recipe": r["recipe"],
            "types": ", ".join(f"{t} x{n}" for t, n in (r.get("export") or {}).get("tensor_types", {}).items()),
            "exact": (r.get("export") or {}).get("exact_tensors"),
            "max_abs_diff": (r.get("export") or {}).get("max_abs_diff"),
            "kl_gguf": (r.get("export") or {}).get("kl_vs_artifact"),
            "kl_tf": (r.get("transformers") or {}).get("kl"),
            "kl_lc": (r.get("llamacpp") or {}).get("kl"),
            "bench": (r.get("bench") or {}).get("kernel") or (r.get("bench") or {}).get("error"),
            "refused": r.get("refused") or r.get("error"),
        }
        for r in records
    ]
    cols = [
        ("recipe", "recipe", "`{}`"),
        ("types", "GGUF tensor types", "{}"),
        ("exact", "tensors exact", "{}"),
        ("max_abs_diff", "max |GGUF - artifact| (dequantized)", "{:.3g}"),
        ("kl_gguf", "KL GGUF weights ‖ artifact (transformers)", "{:.2e}"),
        ("kl_tf", "KL to FP16: artifact, transformers", "{:.4f}"),
        ("kl_lc", "KL to FP16: GGUF, llama.cpp", "{:.4f}"),
        ("bench", "bench --engine llamacpp", "{}"),
        ("refused", "the exact export's refusal", "{}"),
    ]
    return {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--work", default="runs/gguf-fp4", help="artifacts and GGUFs (an artifact there is reused)")
    ap.add_argument("--text", default="set:world-factbook")
    ap.add_argument("--split", default="confirmation")
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tabulate", action="store_true", help="only rewrite the table from the result file")
    a = ap.parse_args()
    if a.tabulate:  # the measuring run's command, machine and date kept
        old = json.loads((RESULTS / f"{NAME}.json").read_text())
        main = {**table(old["records"]), "note": old["tables"]["main"]["note"]}
        write_result(NAME, {**{k: old[k] for k in ("command", "machine", "date")}, **old, "tables": {"main": main}})
        return
    Path(a.work).mkdir(parents=True, exist_ok=True)
    records = [measure(r, a) for r in RECIPES]
    note = (
        f"The demo model; eval on {a.max_tokens} tokens of {a.text} ({a.split} split), the export's KL on the first "
        f"half of {a.text}; bench at batch 1, {a.prompt_len}-token prompt, {a.gen_len} tokens. "
        "max |GGUF - artifact|: each tensor dequantized by gguf-py (times NVFP4's F32 .scale) against the "
        "artifact's decompressed weight."
    )
    write_result(NAME, {"records": records, "tables": {"main": {**table(records), "note": note}}})


if __name__ == "__main__":
    main()
