"""`quantkit pareto MODEL --calib SPEC --out DIR`: which variant to ship, as a curve of accuracy per
bit against llama.cpp's own K-quants.

The front is a built-in suite run by `quantkit run` (pipeline/run.py) in DIR/run, so a re-run reuses
every finished point (its step cache) and every check of a run holds (the overlap guard among
them: each choice - auto's windows, --mixed's Fisher windows, the importance matrix - is fitted
on calibration text, and no point is scored on it). Its variants, one line each (front.LINES):

- llama.cpp: `gguf: {type: T, imatrix: true}` for each anchor type T: llama-imatrix over the run's
  calibration windows, then llama-quantize T, scored by llama.cpp;
- quantkit GGUF: the same with `mixed: true` (export --type T --mixed: each decoder-layer weight's
  type chosen by its estimated KL within T's own file size), scored by llama.cpp;
- quantkit compressed-tensors: the `auto:` recipe (default int4-w4a16-gptq-g64-mixed) at
  `budget_bits: B` for each size B, scored by transformers (the engine that serves it).

Every point is scored on the same texts, windows and split (default the confirmation windows,
where no choice was made), with the KL the eval reports (exact over the vocabulary where its
engine allows). Then front.py compares the lines at each size and writes DIR/pareto.json, .md, .png.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from quantkit.artifacts.staging import read_meta, text_input
from quantkit.core.atomic import exclusive, write_json, write_text
from quantkit.core.outputs import check_dir, model_inputs
from quantkit.errors import QuantkitError
from quantkit.gguf import tools
from quantkit.gguf.type_report import layer_sizes, read_types
from quantkit.methods.schemes import Scheme
from quantkit.models.resolve import resolve_path
from quantkit.models.sizes import checkpoint_sizes
from quantkit.pipeline.front import (
    DEFAULT_CT_RECIPE,
    LINES,
    LLAMACPP,
    DomainKL,
    ParetoResult,
    Point,
    bits_per_weight,
    compare,
    is_front,
    markdown,
    plot,
)
from quantkit.pipeline.pareto_settings import ParetoSettings
from quantkit.pipeline.run import Runner, RunOptions
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.recipe.files import load_recipe, recipe_from_dict
from quantkit.resources import find_recipe

ACCOUNTING = (
    "the decoder layers' linear weights as stored (GGUF: their blocks' bytes; compressed-tensors: packed "
    "codes, scales and zero points) × 8 ÷ their weights, the same count for every tool"
)


def check_tools(s: ParetoSettings) -> None:
    """llama.cpp's programs and bindings, before anything is made, where a GGUF line is asked for."""
    if not s.gguf_lines:
        return
    for name in ("llama-quantize", "llama-imatrix"):
        tools.locate(name, "quantkit pareto's GGUF points")
    if importlib.util.find_spec("llama_cpp") is None:
        raise QuantkitError(
            "quantkit pareto scores its GGUF points through llama.cpp, and llama-cpp-python is not installed "
            "(./scripts/_install.sh installs it); or leave the GGUF lines out: --lines compressed-tensors"
        )


# ---------------------------------------------------------------- the suite


def _ct_step(s: ParetoSettings) -> tuple[list[dict], Scheme, dict]:
    """The compressed-tensors recipe's steps as data, its quantize step's base scheme, and its calibration."""
    recipe = load_recipe(find_recipe(s.ct_recipe))
    quant = [st.quantize for st in recipe.steps if st.quantize]
    if len(quant) != 1 or not getattr(quant[0], "auto", None):
        raise QuantkitError(
            f"--ct-recipe {s.ct_recipe}: a recipe with one quantize step whose auto: chooses under a bits budget "
            f"(as {DEFAULT_CT_RECIPE})"
        )
    q = quant[0]
    steps = [st.model_dump(mode="json") for st in recipe.steps]
    return steps, Scheme(q.bits, q.group_size, q.symmetric), recipe.calibration.model_dump(mode="json")


def _ct_variants(s: ParetoSettings, notes: list[str]) -> list[dict]:
    recipe_steps, base, _ = _ct_step(s)
    variants = []
    for size in s.sizes:
        if size < base.nominal_bits:
            notes.append(
                f"compressed-tensors: no point at {size:g} bits/weight: the base scheme {base.name} alone takes "
                f"{base.nominal_bits:.2f}"
            )
            continue
        steps = []
        for st in recipe_steps:
            if st.get("quantize"):
                auto = {k: v for k, v in st["quantize"]["auto"].items() if k not in ("budget_tpot_ms", "device")}
                st = {**st, "quantize": {**st["quantize"], "auto": {**auto, "budget_bits": size, "context": 0}}}
            steps.append({k: v for k, v in st.items() if v is not None})
        variants.append(
            {
                "name": f"ct-{size:g}",
                "description": f"{s.ct_recipe} at budget_bits {size:g}",
                "steps": steps,
            }
        )
    return variants


def suite(s: ParetoSettings) -> tuple[dict, list[str]]:
    """The built-in suite of the front, as recipe data, and notes on the points it leaves out."""
    notes: list[str] = []
    variants: list[dict] = []
    # the compressed-tensors recipe's calibration (its compute precision) with the front's windows, for
    # every line: the same calibration whichever lines are made, so each point's reuse key is the same
    _, _, ct_calib = _ct_step(s)
    calibration = {**ct_calib, "samples": s.calib_samples, "seq_len": s.calib_seq_len, "source": s.calib}
    for t in s.anchors if LLAMACPP in s.lines else ():
        variants.append(
            {
                "name": f"llamacpp-{t}",
                "description": f"llama-quantize {t} with an importance matrix",
                "gguf": {"type": t, "imatrix": True},
            }
        )
    for t in s.anchors if "gguf-mixed" in s.lines else ():
        mixed = {"type": t, "imatrix": True, "mixed": True}
        if s.mixed_types is not None:
            mixed["mixed_types"] = list(s.mixed_types)
        variants.append({"name": f"mixed-{t}", "description": f"export --type {t} --mixed", "gguf": mixed})
    if "compressed-tensors" in s.lines:  # last: its converts take longest
        variants += _ct_variants(s, notes)
    data = {
        "name": "pareto",
        "description": "quantkit pareto: quantkit's points and llama.cpp's at several sizes",
        "calibration": calibration,
        "variants": [{"name": "fp16", "description": "the 16-bit source (the baseline)", "baseline": True}, *variants],
        "eval": {
            "texts": list(s.texts),
            "seq_len": s.seq_len,
            "max_tokens": s.max_tokens,
            "split": s.split,
            "kl": s.kl,
            "engines": ["transformers"],
        },
    }
    return data, notes


def runner(s: ParetoSettings) -> tuple[Runner, list[str]]:
    data, notes = suite(s)
    recipe = recipe_from_dict(data, "quantkit pareto's suite")
    opts = RunOptions(
        model=s.model,
        out=s.out / "run",
        calib=s.calib,
        eval_text=s.texts,
        skip_bench=True,
        rerun=s.rerun,
        debug=s.debug,
    )
    return Runner(recipe, opts), notes


# ---------------------------------------------------------------- the points


def _line_of(name: str) -> str:
    if name.startswith("llamacpp-"):
        return LLAMACPP
    return "gguf-mixed" if name.startswith("mixed-") else "compressed-tensors"


def _domains(ev) -> tuple[tuple[DomainKL, ...], str | None]:
    if ev is None:
        return (), None
    out = tuple(
        DomainKL(t.text, t.label, t.kld.mean, tuple(t.ci95.kld_mean), t.delta_ppl_pct, t.top1_agreement, t.tokens)
        for t in ev.texts
    )
    return out, ev.kl_kind


def point(name: str, rec: VariantRecord) -> Point:
    """A variant's record in the run as a point of its line: its size and its KL on every domain."""
    line = LINES[_line_of(name)]
    domains, kind = _domains(rec.eval)
    base = dict(
        line=line.name,
        name=name,
        tool=line.tool,
        format=line.format,
        engine=line.engine,
        kl_kind=kind,
        domains=domains,
        error=rec.error,
    )
    if rec.gguf_variant is not None:
        made = rec.gguf
        types = read_types(made.path, made.gguf_type)
        layer_bytes, layer_weights = layer_sizes(types)
        detail = {"weight_types": types.weight_types, "fallback_types": made.fallback_types}
        if made.mixed:
            detail["mixed"] = made.mixed
        return Point(
            **base,
            target=made.gguf_type,
            path=str(made.path),
            file_bytes=made.bytes,
            layer_bytes=layer_bytes,
            layer_weights=layer_weights,
            bits_per_weight=bits_per_weight(layer_bytes, layer_weights),
            detail=detail,
        )
    target = name.removeprefix("ct-") + " bits/weight"
    art = rec.artifact
    if not art or rec.error:
        return Point(
            **base, target=target, path=art, file_bytes=None, layer_bytes=None, layer_weights=None, bits_per_weight=None
        )
    sizes = checkpoint_sizes(Path(art))
    return Point(
        **base,
        target=target,
        path=art,
        file_bytes=sizes.weight_file_bytes,
        layer_bytes=sizes.linear_bytes,
        layer_weights=sizes.linear_weights,
        bits_per_weight=bits_per_weight(sizes.linear_bytes, sizes.linear_weights),
        detail=_auto_detail(Path(art)),
    )


def _auto_detail(art: Path) -> dict:
    mp = read_meta(art).get("mixed_precision") or {}
    keep = ("budget_bits", "base", "choices", "bits_per_weight", "kl_sum", "seconds")
    return {k: mp.get(k) for k in keep if k in mp} | {"raised": len(mp.get("picked") or [])}


def _failed(name: str, error: str | None) -> Point:
    line = LINES[_line_of(name)]
    return Point(
        line.name,
        name,
        name,
        line.tool,
        line.format,
        line.engine,
        None,
        None,
        None,
        None,
        None,
        None,
        error=error or "not made",
    )


# ---------------------------------------------------------------- the command


def made_front(out: Path) -> bool:
    """A directory `quantkit pareto` made: its pareto.json is a front, or (a first run stopped
    before writing it) its run directory holds a run's steps.json."""
    try:
        data = json.loads((out / "pareto.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        data = None
    if is_front(data):
        return True
    return not (out / "pareto.json").exists() and (out / "run" / "steps.json").is_file()


def check_out(s: ParetoSettings) -> None:
    """--out is a directory of its own (core/outputs.py): never the model or a text, nor around or
    inside one, nor inside an artifact, a run directory or another front; an existing one is empty
    or a front pareto made (which it resumes)."""
    inputs = [*model_inputs([resolve_path(s.model)])]
    for spec, what in ((s.calib, "the calibration text"), *((t, "an evaluation text") for t in s.texts)):
        inputs += text_input(spec, what)
    check_dir(s.out, "--out", inputs=inputs, made=made_front, what="a front")


def run_pareto(s: ParetoSettings) -> ParetoResult:
    """Run the front's suite (reusing finished points), then write DIR/pareto.json, pareto.md, pareto.png."""
    check_out(s)
    check_tools(s)
    r, notes = runner(s)
    t0 = time.perf_counter()
    s.out.mkdir(parents=True, exist_ok=True)
    with exclusive(s.out / "pareto.json", what=f"the front in {s.out}"):
        check_out(s)  # again under the lock
        r.run()
        points = []
        for name, rec in r.variants.items():
            if name == "fp16":
                continue
            try:
                points.append(point(name, rec))
            except (QuantkitError, OSError, KeyError) as exc:  # a made file that cannot be read: a failed point
                points.append(_failed(name, f"{type(exc).__name__}: {exc}"))
        result = ParetoResult(
            model=s.model,
            source_sha256=r.src_hash,
            calib=s.calib,
            settings=s.to_json(),
            split=s.split,
            texts=s.texts,
            kl_kinds=tuple(sorted({p.kl_kind for p in points if p.kl_kind})),
            points=tuple(points),
            comparisons=tuple(compare(points, s.sizes)),
            accounting=ACCOUNTING,
            notes=tuple(notes + _fallback_notes(points) + _failure_notes(points)),
            seconds=time.perf_counter() - t0,
        )
        write(result, s.out)
    return result


def write(result: ParetoResult, out: Path) -> None:
    write_json(out / "pareto.json", result.to_json(), indent=1)
    write_text(out / "pareto.md", markdown(result))
    plot(result, out / "pareto.png")


def _fallback_notes(points: list[Point]) -> list[str]:
    out = []
    for p in points:
        fb = (p.detail or {}).get("fallback_types")
        if p.line == LLAMACPP and fb:
            got = ", ".join(f"{n} x {t}" for t, n in sorted(fb.items()))
            out.append(f"{p.name}: rows no multiple of {p.target}'s block; llama-quantize gave {got} instead")
    return out


def _failure_notes(points: list[Point]) -> list[str]:
    return [f"{p.name}: not measured: {p.error}" for p in points if p.error]
