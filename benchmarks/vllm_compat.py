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
Each kind's schemes are recorded as facts (quantkit/models/scheme_facts.py: weight format, bits,
groups, scales, activations, as the artifact's quantkit.json holds them) with whether vLLM served
it, and a test holds the CPU column of vllm_support.RULES (keyed by those facts) equal to these rows.

Results go to benchmarks/results/vllm_compat.json after every kind (a rerun with --only merges its
kinds into the file); artifacts stay in --work, and an artifact already there is reused.

  python benchmarks/vllm_compat.py                                  # every kind, artifacts in runs/vllm-compat
  python benchmarks/vllm_compat.py --only fp16 int4-rtn-g64 --direct int4-rtn-g64
  python benchmarks/vllm_compat.py --tabulate                       # only rewrite the tables

Rows measured before the facts were recorded carry only their scheme labels; --tabulate gives them
the facts of the recipe they were converted with (its --set included; an auto step's choices where
the run recorded their label), read through quantkit's own recipe schema.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import QUANTKIT, RESULTS, command, machine, quantkit_json, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAME = "vllm_compat"
BEST = ("int4-spinquant-asym-auto-vllm", "int4-spinquant-asym-mixed")  # the best INT4 vLLM's CPU serves, and its rival
MERGED = (
    "python benchmarks/vllm_compat.py --only KIND ... [--direct KIND ...]  (several runs over subsets of the kinds, "
    "merged)"
)


@dataclass(frozen=True)
class Kind:
    name: str
    recipe: str | None  # None: the source model itself
    what: str
    sets: tuple[str, ...] = ()
    calibrated: bool = True  # takes the small-calibration overrides
    extra_texts: tuple[str, ...] = field(default=())  # more domains for the transformers row (the best-INT4 comparison)
    table: str = "main"  # the docs table its row is in (each table names the run that measured its rows)


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
    Kind(
        "nvfp4-w4a16",
        "nvfp4-w4a16",
        "NVFP4 weight-only (FP4 E2M1, FP8 scales per 16, FP32 per tensor)",
        calibrated=False,
        table="fp4",
    ),
    Kind(
        "mxfp4-w4a16", "mxfp4-w4a16", "MXFP4 weight-only (FP4 E2M1, E8M0 scales per 32)", calibrated=False, table="fp4"
    ),
    Kind("bnb-nf4", "bnb-nf4", "bitsandbytes NF4", calibrated=False),
    Kind("bnb-int8", "bnb-int8", "bitsandbytes LLM.int8()", calibrated=False),
    Kind("int4-awq-g64", "int4-w4a16-awq", "INT4 W4A16 AWQ scales + RTN g64"),
    Kind(
        "gqa-fp16",
        "gqa",
        "GQA 3 -> 1 KV heads (calibrated merge, short recovery), 16-bit",
        ("steps[0].gqa.recover.tokens=16384", "steps[0].gqa.recover.max_minutes=2"),
    ),
    # the KV cache in FP8 E4M3 with scales calibrated in the INT4 pass: vLLM's kv_cache_dtype "auto" takes FP8 for it
    Kind(
        "int4-gptq-g64-kv-fp8",
        "int4-w4a16-gptq-g64-kv-fp8",
        "INT4 W4A16 GPTQ g64 + FP8 E4M3 K/V, a scale per tensor",
        table="kv",
    ),
    Kind(
        "int4-gptq-g64-kv-fp8-head",
        "int4-w4a16-gptq-g64-kv-fp8",
        "INT4 W4A16 GPTQ g64 + FP8 E4M3 K/V, a scale per KV head",
        ("steps[0].quantize.kv_cache.fp8=head",),
        table="kv",
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
    facts = vllm_support.schemes(meta)
    rec["schemes"] = list(dict.fromkeys(f.label for f in facts))
    rec["facts"] = [f.as_dict() for f in facts]
    kv = vllm_support.kv_facts(meta)
    rec["kv_cache"] = kv.as_dict() if kv else None
    text = [args.text]
    rec["vllm"] = evaluate(art, args.model, "vllm", text, args)
    rec["served"] = "error" not in rec["vllm"]
    # transformers against FP16: the other side of |ΔKL| where vLLM serves the artifact, the artifact's own
    # accuracy where it does not, and the domains the table asks for
    if kind.recipe is not None:
        rec["transformers"] = evaluate(art, args.model, "transformers", text + list(kind.extra_texts), args)
    if rec["served"] and kind.recipe is not None and (args.direct is None or kind.name in args.direct):
        rec["vllm_vs_transformers"] = evaluate(art, str(art), "vllm", text, args, mismatch_ok=True)
    elif rec["served"] and kind.recipe is None:  # the model itself: its baseline is transformers on the same checkpoint
        rec["vllm_vs_transformers"] = rec["vllm"]
    return rec


def _text(rec: dict, key: str, label: str) -> dict:
    return ((rec.get(key) or {}).get("texts") or {}).get(label) or {}


def main_table(kinds: dict, label: str, table: str = "main") -> dict:
    rows = []
    for k in KINDS:
        rec = kinds.get(k.name)
        if rec is None or k.table != table:
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


def row_facts(rec: dict) -> list:
    """A row's schemes as facts (SchemeFacts): as measured, or for a row measured before facts were
    recorded, those of the recipe it was converted with (recipe_facts)."""
    from quantkit.models.scheme_facts import SchemeFacts

    return [SchemeFacts.from_dict(d) for d in rec.get("facts") or []]


def kv_of(rec: dict):
    """A row's KV cache scheme (models/kv_scheme.py KvCacheFacts), None where it has none."""
    from quantkit.models.kv_scheme import KvCacheFacts

    return KvCacheFacts.from_dict(rec.get("kv_cache")) if rec.get("kv_cache") else None


def recipe_facts(kind: Kind, rec: dict) -> list[dict] | None:
    """The facts of a row measured before they were recorded: its recipe's quantize step (with the
    kind's --set) read through quantkit's recipe schema, plus each scheme an auto step may choose
    whose label the run recorded; each label the run recorded must be accounted for."""
    from quantkit.methods.method_registry import quantize_step
    from quantkit.methods.schemes import parse_choice
    from quantkit.models import scheme_facts
    from quantkit.recipe.files import load_recipe

    if not rec.get("schemes"):
        return None  # not built
    if kind.recipe is None:
        found = [scheme_facts.DENSE]
    else:
        recipe = load_recipe(kind.recipe, kind.sets)
        cfg = quantize_step(recipe.variants[0] if recipe.variants else recipe)
        found = list(cfg.facts) if cfg is not None else [scheme_facts.DENSE]
        auto = getattr(cfg, "auto", None)
        for choice in auto.choices if auto is not None else ():
            s = parse_choice(choice)
            found.append(scheme_facts.int_weights(s.bits, s.group_size, s.symmetric))
    found = [f for f in dict.fromkeys(found) if f.label in rec["schemes"]]
    if {f.label for f in found} != set(rec["schemes"]):
        raise SystemExit(f"{kind.name}: recorded schemes {rec['schemes']} are not those of its recipe")
    return [f.as_dict() for f in found]


def support_table(kinds: dict) -> dict:
    """What model cards claim per device (quantkit/external/vllm_support.py RULES, keyed by facts),
    beside the measured kinds each rule decides alone."""
    from quantkit.external import vllm_support

    rows = []
    for rule in vllm_support.RULES:
        decided = [
            k
            for k, rec in kinds.items()
            if "served" in rec and row_facts(rec) and all(rule.matches(f) for f in row_facts(rec)) and not kv_of(rec)
        ]
        s = rule.support
        rows.append(
            {
                "scheme": rule.what,
                "cpu": ("serves: " if s.cpu else "no: ") + s.cpu_why,
                "measured": ", ".join(f"`{k}`" for k in decided) or "not measured",
                "gpu": ("serves: " if s.gpu else "no: ") + s.gpu_why,
            }
        )
    for rule in vllm_support.KV_RULES:  # the KV cache's scheme: its kinds hold weights the rules above serve
        decided = [k for k, rec in kinds.items() if "served" in rec and kv_of(rec) and rule.matches(kv_of(rec))]
        s = rule.support
        rows.append(
            {
                "scheme": f"KV cache: {rule.what}",
                "cpu": ("serves: " if s.cpu else "no: ") + s.cpu_why,
                "measured": ", ".join(f"`{k}`" for k in decided) or "not measured",
                "gpu": ("serves: " if s.gpu else "no: ") + s.gpu_why,
            }
        )
    cols = [
        ("scheme", "schemes (by their facts)", "{}"),
        ("cpu", "CPU (served or refused: measured; the kernel: from vLLM's source)", "{}"),
        ("measured", "measured kinds", "{}"),
        ("gpu", "NVIDIA GPU (read from vLLM's code, not run)", "{}"),
    ]
    return {
        "columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols],
        "rows": rows,
        "note": f"vLLM {vllm_support.VLLM_VERSION}. A scheme no rule matches is unknown, served nowhere; "
        "an artifact is served on a device when every scheme in it is.",
    }


def best_table(kinds: dict) -> dict:
    """The mixed INT4 vLLM's CPU serves next to the one it does not: transformers' figures per domain."""
    rows = []
    for name in BEST:
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
    for name, rec in kinds.items():  # rows measured before facts were recorded
        if "facts" not in rec and name in by_name and (facts := recipe_facts(by_name[name], rec)) is not None:
            rec["facts"], rec["facts_from"] = facts, "recipe"
    for k in [by_name[n] for n in args.only] if args.only is not None else KINDS:  # in the order given
        print(f"[{time.strftime('%H:%M:%S')}] {k.name}", file=sys.stderr, flush=True)
        kinds[k.name] = measure(k, args)
        kinds[k.name]["run"] = {"command": command(), "machine": machine(), "date": now()}
        print(json.dumps(kinds[k.name], default=str)[:600], file=sys.stderr, flush=True)
        write(kinds, label, args)
    if args.tabulate:
        write(kinds, label, args)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def source(names: list[str], kinds: dict, earlier: dict) -> dict:
    """The run that measured these rows ({command, machine, date}): a row keeps its own under `run`;
    rows measured before rows recorded one are the earlier runs' (`earlier_runs`)."""
    runs = [kinds[n].get("run") or earlier for n in names if n in kinds] or [earlier]
    date = max(r.get("date", "") for r in runs)
    if all((r.get("command"), r.get("machine")) == (runs[0].get("command"), runs[0].get("machine")) for r in runs):
        return {**runs[0], "date": date}
    return {"command": MERGED, "machine": runs[-1].get("machine", {}), "date": date}


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
    path = RESULTS / f"{NAME}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    earlier = old.get("earlier_runs") or {k: old[k] for k in ("command", "machine", "date") if k in old}
    kept = {k: old[k] for k in ("command", "machine", "date") if k in old} if args.tabulate else {}  # a re-tabulation's
    by_table = {t: [k.name for k in KINDS if k.table == t and k.name in kinds] for t in ("main", "fp4", "kv")}
    support = support_table(kinds)
    fp4 = source(by_table["fp4"], kinds, earlier)
    support["note"] += (
        f" The CPU outcomes are those measured in the tables above; the FP4 rows' run: `{fp4.get('command')}`, "
        f"{fp4.get('machine', {}).get('cpu', '?')}, {fp4.get('date', '?')[:10]}."
    )
    write_result(
        NAME,
        {
            **kept,
            "earlier_runs": earlier,
            "kinds": kinds,
            "tables": {
                "main": {**main_table(kinds, label), "note": note, "source": source(by_table["main"], kinds, earlier)},
                "fp4": {**main_table(kinds, label, "fp4"), "note": note, "source": fp4},
                **(
                    {
                        "kv": {
                            **main_table(kinds, label, "kv"),
                            "note": note,
                            "source": source(by_table["kv"], kinds, earlier),
                        }
                    }
                    if by_table["kv"]
                    else {}
                ),
                "best": {**best_table(kinds), "source": source(list(BEST), kinds, earlier)},
                "support": {**support, "source": source(by_table["main"], kinds, earlier)},
            },
        },
    )


if __name__ == "__main__":
    main()
