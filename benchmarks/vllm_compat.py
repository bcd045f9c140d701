#!/usr/bin/env python3
"""Which artifacts vLLM serves, measured: every kind quantkit writes, converted from one model and
loaded by vLLM (`quantkit eval --engine vllm`), next to transformers on the same artifact.

Per kind: `quantkit convert` (calibration kept small: --samples x --calib-len tokens of --calib;
the table is about loading and agreement, not about each method's best accuracy), then on the
held-out windows of --text (--split confirmation):
  - vLLM against the FP16 model (`--engine vllm`): KL to FP16 as vLLM computes it, or vLLM's own
    error line when it does not load the artifact;
  - where vLLM loads it, transformers against the FP16 model (`quantkit eval ART --baseline MODEL`):
    the same KL as transformers computes it;
  - where vLLM loads it, vLLM against transformers on the same artifact (`--baseline ART
    --baseline-mismatch-ok`: transformers scores the artifact as the baseline, vLLM the model):
    the KL between the two engines' next-token distributions.
Each kind's schemes (quantkit/external/vllm_support.py) are recorded with whether vLLM served it,
and a test holds vllm_support.SUPPORT's CPU column equal to these rows.

Results go to benchmarks/results/vllm_compat.json after every kind (a rerun with --only merges its
kinds into the file); artifacts stay in --work, and an artifact already there is reused.

  python benchmarks/vllm_compat.py                                  # every kind, artifacts in runs/vllm-compat
  python benchmarks/vllm_compat.py --only fp16 int4-rtn-g64 --direct int4-rtn-g64
  python benchmarks/vllm_compat.py --tabulate                       # only rewrite the tables
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import QUANTKIT, RESULTS, quantkit_json, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAME = "vllm_compat"


@dataclass(frozen=True)
class Kind:
    name: str
    recipe: str | None  # None: the source model itself
    what: str
    sets: tuple[str, ...] = ()
    calibrated: bool = True  # takes the small-calibration overrides
    extra_texts: tuple[str, ...] = field(default=())  # more domains for the transformers row (the best-INT4 comparison)


# The auto mixed precision's sensitivity pass on 2 windows of 128 tokens instead of 4 of 256 (the
# recipes' default): a pass of units x layers x schemes forwards, ~8x cheaper, for both mixed recipes alike
def small_auto(step: int) -> tuple[str, ...]:
    return f"steps[{step}].quantize.auto.windows=2", f"steps[{step}].quantize.auto.seq_len=128"


KINDS: list[Kind] = [
    Kind("fp16", None, "the model itself, 16-bit"),
    Kind("int4-rtn-g64", "int4-w4a16-rtn", "INT4 W4A16 RTN g64 symmetric", calibrated=False),
    Kind(
        "int4-rtn-g64-asym",
        "int4-w4a16-rtn",
        "INT4 W4A16 RTN g64 asymmetric",
        ("steps[0].quantize.symmetric=false",),
        calibrated=False,
    ),
    Kind(
        "int4-rtn-g32",
        "int4-w4a16-rtn",
        "INT4 W4A16 RTN g32 symmetric",
        ("steps[0].quantize.group_size=32",),
        calibrated=False,
    ),
    Kind(
        "int4-rtn-g128",
        "int4-w4a16-rtn",
        "INT4 W4A16 RTN g128",
        ("steps[0].quantize.group_size=128",),
        calibrated=False,
    ),
    Kind(
        "int4-gptq-g64", "int4-w4a16-gptq-g64", "INT4 W4A16 GPTQ g64 symmetric, static act-order (quantkit's default)"
    ),
    # act-order `group`: groups follow the activation order, so the checkpoint carries a g_idx per column
    Kind(
        "int4-gptq-g64-actorder-group",
        "int4-w4a16-gptq-g64",
        "INT4 W4A16 GPTQ g64, act-order `group` (a g_idx per column)",
        ("steps[0].quantize.actorder=group",),
    ),
    # AutoRound's tuning iterations cut to 5 (the light preset's 50 take ~30 min on 2 cores): the format is the same
    Kind(
        "int4-autoround-g64",
        "int4-w4a16-autoround",
        "INT4 W4A16 AutoRound g64 (5 iterations)",
        ("steps[0].quantize.iters=5",),
    ),
    Kind("int4-spinquant-gptq-g64", "int4-w4a16-spinquant-gptq-g64", "SpinQuant R1+R2 fused, GPTQ g64 act-order"),
    Kind(
        "int4-int8-mixed",
        "int4-w4a16-gptq-g64-mixed",
        "INT4 GPTQ g64 + INT8 per-channel units (auto, 4.5 bits/weight)",
        small_auto(0),
    ),
    Kind(
        "int4-spinquant-asym-mixed",
        "int4-w4a16-spinquant-gptq-asym-mixed",
        "SpinQuant + GPTQ g64 asym + INT8 units (auto, 4.5 bits/weight)",
        small_auto(1),
        extra_texts=("set:shakespeare-plays",),
    ),
    Kind(
        "int4-spinquant-asym-auto-vllm",
        "int4-w4a16-spinquant-gptq-asym-auto-vllm",
        "SpinQuant + GPTQ g64 asym + INT4 g32 units (auto, 4.5 bits/weight)",
        small_auto(1),
        extra_texts=("set:shakespeare-plays",),
    ),
    Kind("int8-w8a16-gptq", "int8-w8a16-gptq", "INT8 W8A16 GPTQ per channel"),
    Kind(
        "int8-w8a16-rtn",
        "int4-w4a16-rtn",
        "INT8 W8A16 RTN per channel (the GPTQ one's format)",
        ("steps[0].quantize.bits=8", "steps[0].quantize.group_size=-1"),
        calibrated=False,
    ),
    Kind(
        "int8-w8a8-smoothquant", "int8-w8a8-smoothquant", "INT8 W8A8 SmoothQuant + GPTQ, dynamic per-token activations"
    ),
    Kind(
        "fp8-w8a8",
        "fp8-w8a8-dynamic",
        "FP8 W8A8 dynamic (per-channel weights, per-token activations)",
        calibrated=False,
    ),
    Kind("fp8-w8a16", "fp8-w8a16", "FP8 weight-only", calibrated=False),
    Kind("bnb-nf4", "bnb-nf4", "bitsandbytes NF4", calibrated=False),
    Kind("bnb-int8", "bnb-int8", "bitsandbytes LLM.int8()", calibrated=False),
    Kind("int4-awq-g64", "int4-w4a16-awq", "INT4 W4A16 AWQ scales + RTN g64"),
    Kind(
        "gqa-fp16",
        "gqa",
        "GQA 3 -> 1 KV heads (calibrated merge, short recovery), 16-bit",
        ("steps[0].gqa.recover.tokens=16384", "steps[0].gqa.recover.max_minutes=2"),
    ),
]


def models_path(model: str) -> str:
    """A named model's directory (`quantkit models path`), or the path given."""
    if Path(model).exists():
        return model
    out = subprocess.run(QUANTKIT + ["models", "path", model], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def error_line(exc: Exception) -> str:
    return str(exc).removeprefix("error: ")


def convert(kind: Kind, args) -> tuple[Path | None, dict]:
    """The artifact (reused when --work holds a finished one) and what the conversion recorded."""
    if kind.recipe is None:
        return Path(args.model_path), {}
    art = Path(args.work) / kind.name
    # another process converting this kind: quantkit's lock while it writes, a `.KIND.pending` file
    # from whoever started a convert ahead of this run (its artifact is then reused)
    busy = (art.parent / f".{art.name}.lock", art.parent / f".{art.name}.pending")
    while any(p.exists() for p in busy) and not (art / "quantkit.json").is_file():
        time.sleep(10)
    if (art / "quantkit.json").is_file():
        return art, {"reused": True}
    sets = list(kind.sets)
    calib = []
    if kind.calibrated:
        sets += [f"calibration.samples={args.samples}", f"calibration.seq_len={args.calib_len}"]
        calib = ["--calib", args.calib]
    t0 = time.monotonic()
    try:
        quantkit_json(
            [
                "convert",
                kind.recipe,
                "--model",
                args.model,
                "--out",
                str(art),
                *calib,
                *[x for s in sets for x in ("--set", s)],
            ]
        )
    except RuntimeError as exc:
        return None, {"convert_error": error_line(exc)}
    return art, {"convert_s": round(time.monotonic() - t0, 1)}


def evaluate(model: Path, baseline: str, engine: str, texts: list[str], args, mismatch_ok: bool = False) -> dict:
    """Per text: KL mean / p99, PPL, baseline PPL, top-1; or {"error": line}."""
    cmd = [
        "eval",
        str(model),
        "--baseline",
        baseline,
        "--engine",
        engine,
        "--split",
        args.split,
        "--max-tokens",
        str(args.max_tokens),
        *[x for t in texts for x in ("--text", t)],
    ]
    if mismatch_ok:
        cmd.append("--baseline-mismatch-ok")
    t0 = time.monotonic()
    try:
        out = quantkit_json(cmd)
    except RuntimeError as exc:
        return {"error": error_line(exc)}
    rows = {
        t["label"]: {
            "kl": t["kld"]["mean"],
            "kl_p99": t["kld"]["p99"],
            "ppl": t["ppl"],
            "baseline_ppl": t["baseline_ppl"],
            "top1": t["top1_agreement"],
            "tokens": t.get("tokens"),
        }
        for t in out["texts"]
    }
    return {"texts": rows, "scorer": out.get("scorer"), "wall_s": round(time.monotonic() - t0, 1)}


def measure(kind: Kind, args) -> dict:
    from quantkit.external import vllm_support

    art, rec = convert(kind, args)
    rec = {"kind": kind.name, "recipe": kind.recipe, "sets": list(kind.sets), "what": kind.what, **rec}
    if art is None:
        return rec
    meta = json.loads((art / "quantkit.json").read_text()) if (art / "quantkit.json").is_file() else {}
    rec["schemes"] = vllm_support.schemes(meta)
    text = [args.text]
    rec["vllm"] = evaluate(art, args.model, "vllm", text, args)
    rec["served"] = "error" not in rec["vllm"]
    # transformers against FP16: the other side of |ΔKL| where vLLM serves the artifact, or a domain the table asks for
    if kind.recipe is not None and (rec["served"] or kind.extra_texts):
        rec["transformers"] = evaluate(art, args.model, "transformers", text + list(kind.extra_texts), args)
    if rec["served"] and kind.recipe is not None and (args.direct is None or kind.name in args.direct):
        rec["vllm_vs_transformers"] = evaluate(art, str(art), "vllm", text, args, mismatch_ok=True)
    elif rec["served"] and kind.recipe is None:  # the model itself: its baseline is transformers on the same checkpoint
        rec["vllm_vs_transformers"] = rec["vllm"]
    return rec


def _text(rec: dict, key: str, label: str) -> dict:
    return ((rec.get(key) or {}).get("texts") or {}).get(label) or {}


def main_table(kinds: dict, label: str) -> dict:
    rows = []
    for k in KINDS:
        rec = kinds.get(k.name)
        if rec is None:
            continue
        tf, vl, both = (
            _text(rec, "transformers", label),
            _text(rec, "vllm", label),
            _text(rec, "vllm_vs_transformers", label),
        )
        if k.recipe is None:
            tf = {"kl": 0.0, "ppl": vl.get("baseline_ppl")}
        served = rec.get("served")
        error = rec.get("convert_error") and f"quantkit: {rec['convert_error']}" or (rec.get("vllm") or {}).get("error")
        rows.append(
            {
                "kind": k.name,
                "what": k.what,
                "schemes": ", ".join(rec.get("schemes") or []) or None,
                "cpu": "serves" if served else ("not built" if rec.get("convert_error") else "refused"),
                "kl_engines": both.get("kl"),
                "kl_tf": tf.get("kl"),
                "kl_vllm": vl.get("kl"),
                "dkl": abs(vl["kl"] - tf["kl"]) if vl.get("kl") is not None and tf.get("kl") is not None else None,
                "ppl_tf": tf.get("ppl"),
                "ppl_vllm": vl.get("ppl"),
                "error": error,
            }
        )
    cols = [
        ("kind", "kind", "`{}`"),
        ("what", "artifact", "{}"),
        ("schemes", "schemes", "{}"),
        ("cpu", "vLLM CPU", "{}"),
        ("kl_engines", "KL vLLM ‖ transformers, same artifact", "{:.5f}"),
        ("kl_tf", "KL to FP16: transformers", "{:.4f}"),
        ("kl_vllm", "KL to FP16: vLLM", "{:.4f}"),
        ("dkl", "|ΔKL|", "{:.5f}"),
        ("ppl_tf", "PPL transformers", "{:.3f}"),
        ("ppl_vllm", "PPL vLLM", "{:.3f}"),
        ("error", "error (vLLM's own, or quantkit's)", "{}"),
    ]
    return {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": rows}


def support_table() -> dict:
    """What model cards claim per device (quantkit/external/vllm_support.py), beside the measurements it is held to."""
    from quantkit.external import vllm_support

    rows = [
        {
            "scheme": name,
            "cpu": ("serves: " if s.cpu else "no: ") + s.cpu_why,
            "gpu": ("serves: " if s.gpu else "no: ") + s.gpu_why,
        }
        for name, s in vllm_support.SUPPORT.items()
    ]
    cols = [
        ("scheme", "schemes", "`{}`"),
        ("cpu", "CPU (served or refused: measured; the kernel: from vLLM's source)", "{}"),
        ("gpu", "NVIDIA GPU (read from vLLM's kernel lists, not run)", "{}"),
    ]
    return {
        "columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols],
        "rows": rows,
        "note": f"vLLM {vllm_support.VLLM_VERSION}. An artifact is served on a device when every scheme in it is.",
    }


def best_table(kinds: dict) -> dict:
    """The mixed INT4 vLLM's CPU serves next to the one it does not: transformers' figures per domain."""
    rows = []
    for name in ("int4-spinquant-asym-auto-vllm", "int4-spinquant-asym-mixed"):
        rec = kinds.get(name)
        if not rec or "transformers" not in rec:
            continue
        for label, t in ((rec["transformers"] or {}).get("texts") or {}).items():
            rows.append(
                {
                    "kind": name,
                    "cpu": "serves" if rec.get("served") else "refused",
                    "text": label,
                    "kl": t["kl"],
                    "kl_p99": t["kl_p99"],
                    "ppl": t["ppl"],
                    "dppl": (t["ppl"] / t["baseline_ppl"] - 1) * 100,
                    "top1": t["top1"] * 100,
                }
            )
    cols = [
        ("kind", "kind", "`{}`"),
        ("cpu", "vLLM CPU", "{}"),
        ("text", "text", "{}"),
        ("kl", "KL to FP16", "{:.4f}"),
        ("kl_p99", "KL p99", "{:.3f}"),
        ("ppl", "PPL", "{:.3f}"),
        ("dppl", "ΔPPL", "{:+.2f}%"),
        ("top1", "top-1", "{:.1f}%"),
    ]
    return {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--work", default="runs/vllm-compat", help="directory for the artifacts (kept; a finished one is reused)"
    )
    ap.add_argument("--tabulate", action="store_true", help="only rewrite the tables from the kinds in the result file")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--only", nargs="*", help=f"kinds to measure (default: all): {' '.join(k.name for k in KINDS)}")
    ap.add_argument("--text", default="set:world-factbook")
    ap.add_argument("--split", default="confirmation")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--calib", default="mix:default")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--calib-len", type=int, default=256)
    ap.add_argument(
        "--direct",
        nargs="*",
        help="kinds to score vLLM against transformers on the same artifact (default: every "
        "kind vLLM serves; the others show |ΔKL| only)",
    )
    args = ap.parse_args()
    unknown = (set(args.only or ()) | set(args.direct or ())) - {k.name for k in KINDS}
    if unknown:
        ap.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    args.model_path = models_path(args.model)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    old = RESULTS / f"{NAME}.json"
    kinds = json.loads(old.read_text()).get("kinds", {}) if old.is_file() else {}
    label = args.text.removeprefix("set:")
    if args.tabulate:
        args.only = []
    by_name = {k.name: k for k in KINDS}
    for k in [by_name[n] for n in args.only] if args.only is not None else KINDS:  # in the order given
        print(f"[{time.strftime('%H:%M:%S')}] {k.name}", file=sys.stderr, flush=True)
        kinds[k.name] = measure(k, args)
        print(json.dumps(kinds[k.name], default=str)[:600], file=sys.stderr, flush=True)
        write(kinds, label, args)
    if args.tabulate:
        write(kinds, label, args)


def write(kinds: dict, label: str, args) -> None:
    note = (
        f"{args.max_tokens} tokens of {args.text} ({args.split} split), windows "
        "of 512; artifacts converted from the demo "
        f"model with {args.samples} x {args.calib_len} calibration tokens of {args.calib} where the recipe calibrates. "
        "vLLM: its CPU build, bfloat16 activations for quantized checkpoints, "
        "float32 for 16-bit ones (as transformers). "
        "The rows come from runs of this script over subsets of the kinds "
        "(`--only`), merged; a kind whose same-artifact "
        "KL is blank was not given `--direct` (its |ΔKL| stands for the agreement)."
    )
    kept = {}
    if (
        args.tabulate and (RESULTS / f"{NAME}.json").is_file()
    ):  # a re-tabulation keeps the measuring run's command and date
        old = json.loads((RESULTS / f"{NAME}.json").read_text())
        kept = {k: old[k] for k in ("command", "date") if k in old}
    write_result(
        NAME,
        {
            **kept,
            "kinds": kinds,
            "tables": {
                "main": {**main_table(kinds, label), "note": note},
                "best": best_table(kinds),
                "support": support_table(),
            },
        },
    )


if __name__ == "__main__":
    main()
