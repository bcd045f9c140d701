"""How a measurement becomes a BenchRow: the roofline's prediction beside it (bytes per token from
the engine's own cache, the TTFT floor), the engine's own benchmark (its anchor), the flags; and
what the rows of one model at several KV depths say together (depth_notes).

A decode step at depth D reads the weights and the K/V of D tokens. Where an engine's time grows
with the depth faster than those bytes, its efficiency (the roofline's TPOT over the measured)
falls with the depth: the extra time is attention's arithmetic, not its reads, and the row says
so, with the setting that helps where the engine has one (llama.cpp: flash attention).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from quantkit.artifacts.staging import META, recorded_name
from quantkit.bench.accounting import kv_live, mean_step_bytes
from quantkit.bench.bench_records import BenchRow, SweepPoint, variant_name
from quantkit.bench.bench_settings import BenchSettings
from quantkit.bench.engines import engine_class
from quantkit.bench.engines.engine import Described, WeightBytes
from quantkit.bench.harness import Timings
from quantkit.bench.llama_bench import compare, failure
from quantkit.bench.row_parts import Anchor, EngineInfo, NoAnchor, SelfCheck
from quantkit.core.attribution import FixedCosts, attribute
from quantkit.core.fits import fit_prefill
from quantkit.core.roofline import Shape, efficiency, predict_ttft_s, prefill_flops

# A row whose efficiency is below (1 - DEPTH_EXCESS) x that of the same model's shallowest depth
# says why: on the demo, llama.cpp without flash attention keeps 53% of its depth-0 efficiency at
# depth 4096 (8.6 -> 28.9 ms/token for 1.8x the bytes; llama-bench), 63% with it (24.0 ms).
DEPTH_EXCESS = 0.25
# A row is disturbed (another process took the cores) when its repeats' TPOT spread past this
# (P90 over the best), its steps' P90 passes STEP_TAIL x their median, or llama-bench beside it
# differs by more than WITNESS: a quiet machine repeats within a few percent.
DISTURBED_SPREAD = 0.20
STEP_TAIL = 1.5
WITNESS = 0.25


@dataclass(frozen=True)
class Loaded:
    """What a loaded engine says about itself, the same for each of its rows."""

    weights: WeightBytes
    kv: float  # bytes per cached token
    kv_type: str  # the cache's element type (engine.kv_cache_type())
    info: dict  # engine.describe()
    self_check: SelfCheck
    load_s: float
    kernels: tuple | None = None  # engine.weight_kernels(): core/attribution.KernelTime per format
    fixed: FixedCosts | None = None  # the engine's fixed costs, from the model's twin (bench/twin_timing.py)
    missing: tuple[str, ...] = ()  # why a term of the attribution was not measured


@dataclass(frozen=True)
class Measured:
    """One measurement on a loaded engine: the prompt its TTFT prefilled (the depth, with --depth),
    the KV cache's size, the timings and the bytes one of its steps reads on average."""

    prompt_len: int
    depth: int | None
    capacity: int
    timings: Timings
    step_note: str | None
    step_bytes: float
    sweep: tuple[SweepPoint, ...]
    started: float  # time.perf_counter() when its load (the first row) or its measurement began


def name_of(path) -> str:
    """A row's name: the GGUF's stem, the artifact's recorded name, the directory's name, the shape's label."""
    if not isinstance(path, Path):
        return path.label
    if path.is_file():  # a GGUF
        return path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    if (path / META).is_file():
        return recorded_name(path) or path.name
    return path.name


def make_row(source, cfg: dict, s: BenchSettings, figs, loaded: Loaded, m: Measured) -> BenchRow:
    eng = dict(loaded.info)
    described = Described.of(eng)
    summary = m.timings.summary(m.step_note)
    weights = loaded.weights.per_token
    kv = loaded.kv
    ideal = mean_step_bytes(lambda c: weights + kv_live(kv, c), m.prompt_len, s.gen_len)
    bandwidth = figs.bandwidth * s.tensor_parallel  # tensor parallel: each GPU reads its 1/N shard
    pred_tpot = m.step_bytes / bandwidth
    tpot = summary.tpot_ms.median / 1e3
    ttft = summary.ttft_ms.median / 1e3 if summary.ttft_ms else None
    flops_s = pred_ttft = None
    if m.prompt_len:  # depth 0 prefills nothing
        flops_s = prefill_flops(Shape.from_config(cfg), m.prompt_len) / (figs.compute * s.tensor_parallel)
        pred_ttft = predict_ttft_s(flops_s, 1.0, weights + kv * m.prompt_len, bandwidth)
    notes = list(eng.pop("notes", []))
    anchor = _anchor(s, eng, ttft, tpot * 1e3, notes, m)
    attribution = _attribution(loaded, m, weights, kv, tpot * 1e3, figs.bandwidth, described.flash_attn)
    prefill = fit_prefill(
        [p.prompt_len for p in m.sweep], [p.ttft_ms.median for p in m.sweep], [sweep_disturbed(p) for p in m.sweep]
    )
    if m.timings.warmups > s.warmups:
        notes.append(
            f"--warmups {s.warmups} raised to {m.timings.warmups}: the {s.engine} engine compiles on its first "
            "calls, and compilation is not decode"
        )
    return BenchRow(
        model=str(source) if isinstance(source, Path) else source.label,
        name=name_of(source),
        kind=eng.pop("kind"),
        kernel=eng.pop("kernel"),
        emulated=eng.pop("emulated", None),
        engine=s.engine,
        device=str(s.device),
        device_name=described.name,
        dtype=described.dtype,
        cpu_variant=variant_name(described.cpu_variant),
        threads=described.threads,
        engine_info=EngineInfo.of(eng),
        prompt_len=m.prompt_len,
        gen_len=s.gen_len,
        depth=m.depth,
        flash_attn=described.flash_attn,
        kv_cache=loaded.kv_type,
        load_s=loaded.load_s,
        compile_and_warmup_s=m.timings.warmup_s,
        warmups=m.timings.warmups,
        warmups_requested=s.warmups,
        weight_bytes_per_token=weights,
        stored_weight_bytes=loaded.weights.stored,
        tied_lm_head=loaded.weights.tied_lm_head,
        weight_bytes_by_type=loaded.weights.by_type,
        kv_bytes_per_token=kv,
        kv_cache_tokens=m.capacity,
        bytes_per_token=m.step_bytes,
        kv_bytes_per_step=m.step_bytes - weights,
        ideal_bytes_per_token=ideal,
        ttft_ms=ttft * 1e3 if ttft is not None else None,
        tpot_ms=tpot * 1e3,
        predicted_tpot_ms=pred_tpot * 1e3,
        predicted_ttft_ms=pred_ttft * 1e3 if pred_ttft is not None else None,
        tpot_efficiency=efficiency(pred_tpot, tpot)[0],
        ttft_efficiency=efficiency(pred_ttft, ttft)[0] if ttft is not None else None,
        ttft_bound=("compute" if flops_s >= pred_ttft else "memory") if pred_ttft is not None else None,
        self_check=loaded.self_check,
        stats=summary,
        prompt_sweep=m.sweep,
        notes=tuple(notes),
        anchor=anchor,
        bench_wall_s=time.perf_counter() - m.started,
        attribution=attribution,
        attribution_missing=loaded.missing,
        prefill_fit=prefill,
    )


def _attribution(
    loaded: Loaded, m: Measured, weights: float, kv: float, tpot_ms: float, bandwidth: float, flash_attn: bool | None
):
    """The row's TPOT split into its causes (core/attribution.py), None where the engine's kernels
    were not timed (Loaded.missing says why)."""
    if loaded.kernels is None:
        return None
    kv_step = m.step_bytes - weights
    sources = [
        "weights_ms: the weights' bytes at the device probe's streaming read rate",
        "compute_ms: the engine's kernels on the model's weights, one row each, beyond that rate",
    ]
    if loaded.fixed is not None:
        sources += [
            "kv_ms: the engine's time per cached cell, from the model's twin at two cache sizes",
            "overhead_ms: the twin's time per step less its cells and weights",
        ]
    else:
        sources.append("kv_ms: the cache's bytes at the streaming rate (no twin: " + "; ".join(loaded.missing) + ")")
    return attribute(
        tpot_ms,
        weights,
        kv_step,
        kv_step / kv if kv else 0.0,
        bandwidth,
        loaded.kernels,
        loaded.fixed,
        tuple(sources),
        {"flash_attn": flash_attn, "kv_cache": loaded.kv_type},
    )


def _anchor(
    s: BenchSettings, eng: dict, ttft_s: float | None, tpot_ms: float, notes: list[str], m: Measured
) -> Anchor | NoAnchor | None:
    """The engine's own benchmark beside quantkit's figures (llama.cpp: llama-bench, at the row's
    depth and flash-attention setting), a note where they disagree."""

    found = engine_class(s.engine).anchor(eng, m.prompt_len, s.gen_len, s.repeats, depth=m.depth)
    if found is None:
        return None
    if failure(found) is not None:
        notes.append(f"no anchor: {failure(found)}")
        return NoAnchor(failure(found))
    result = compare(ttft_s * 1e3 if ttft_s is not None and m.depth is None else None, tpot_ms, found)
    figures = {"ttft": (result.ratio_ttft, result.ttft_ms), "tpot": (result.ratio_tpot, result.tpot_ms)}
    for what in result.disagree:
        ratio, theirs = figures[what]
        notes.append(
            f"{what.upper()} {ratio:.2f}x llama-bench's ({theirs:.2f} ms"
            f"{'' if m.depth is None else f' at depth {m.depth}'}): beyond {result.tolerance:.0%}; "
            f"llama-bench runs llama.cpp's own build ({result.backends})"
        )
    return result


def sweep_disturbed(point) -> bool:
    """A sweep length's prefills disagree as a disturbed row's repeats do (their P90 past the best
    by DISTURBED_SPREAD): another process took the cores during some of them."""
    spread = point.ttft_ms.spread
    return spread is not None and spread > DISTURBED_SPREAD


def disturbance(row: BenchRow, drift: dict | None) -> tuple[str, ...]:
    """Why a row's timings say another process took the cores while it was measured (empty: none):
    its repeats disagree, its steps have a long tail, the device probe moved during the run, or
    llama-bench run beside it (the witness) disagrees by far more than engines differ."""
    out = []
    tpot = row.stats.tpot_ms
    if tpot.spread is not None and tpot.spread > DISTURBED_SPREAD:
        out.append(f"its repeats' TPOT spread {tpot.spread:.0%} (P90 {tpot.p90:.2f} ms, best {tpot.min:.2f} ms)")
    steps = row.stats.step_ms
    if steps is not None and steps.median and steps.p90 > STEP_TAIL * steps.median:
        out.append(f"its steps' P90 is {steps.p90 / steps.median:.1f}x their median")
    read = (drift or {}).get("change", {}).get("read_gbps")
    if read is not None and abs(read) > drift["limit"]:  # the rate decode streams at (a matmul's drift is TTFT's)
        out.append(f"the device probe's read bandwidth moved {read:+.0%} during the run")
    ratio = row.anchor.ratio_tpot if isinstance(row.anchor, Anchor) else None
    if ratio is not None and abs(ratio - 1) > WITNESS:
        out.append(f"llama-bench beside it measured a TPOT {1 / ratio:.2f}x the row's")
    return tuple(out)


def classify(row: BenchRow, llc_bytes: int | None, drift: dict | None = None) -> BenchRow:
    """Flags of a row (kept: those depth_notes set). Efficiency above 100% is an accounting error,
    unless the bytes of a step fit in the last-level cache: then the weights need not stream from
    memory at all and beating a streaming read is expected ("fits in cache"). A disturbed row
    (`disturbance`) is flagged and kept out of every fit; an attribution whose terms do not sum to
    the measured TPOT within its tolerance is flagged."""
    fits = bool(llc_bytes and row.bytes_per_token <= llc_bytes)
    flags = [*row.flags, *(["fits_in_cache"] if fits else [])]
    if row.tpot_efficiency > 1.0 and not fits:
        flags.append("tpot_above_roofline")
    if row.ttft_efficiency is not None and row.ttft_efficiency > 1.0 and not (fits and row.ttft_bound == "memory"):
        flags.append("ttft_above_roofline")
    if row.warmups > row.warmups_requested:
        flags.append("warmups_raised")
    if row.emulated:  # not the stored format's speed: another format was timed (row.emulated says which)
        flags.append("emulated")
    disturbed = disturbance(row, drift)
    if disturbed:
        flags.append("disturbed")
    if row.attribution is not None and not row.attribution.holds:
        flags.append("attribution_mismatch")
    bad = {"tpot_above_roofline", "ttft_above_roofline"}
    return replace(
        row, flags=tuple(flags), fits_in_cache=fits, accounting_error=bool(bad & set(flags)), disturbed=disturbed
    )


def fit_points(rows: list[BenchRow]) -> tuple[list[dict], list[float]]:
    """The rule check's points: each undisturbed row's weight bytes, KV bytes per step and its
    arithmetic beyond the bytes as its attribution measured it (kernels beyond the streaming rate,
    attention beyond its reads; 0 without an attribution), and its TPOT in seconds."""
    kept = [r for r in rows if not r.disturbed]
    return [point_of(r) for r in kept], [r.tpot_ms / 1e3 for r in kept]


def point_of(r: BenchRow) -> dict:
    """A row's regressors in the rule check (core/fits.py TERMS)."""
    a = r.attribution
    compute = (a.compute_ms + max(0.0, a.kv_ms - a.kv_read_ms)) / 1e3 if a else 0.0
    return {"weight_bytes": r.weight_bytes_per_token, "kv_bytes": r.kv_bytes_per_step, "compute_s": compute}


def depth_notes(rows: list[BenchRow]) -> list[BenchRow]:
    """Rows at depth whose efficiency fell by more than DEPTH_EXCESS from the same model's shallowest
    depth (same engine, flash-attention setting and cache type) get the flag `attention_compute` and a note:
    the time their bytes do not explain, and the engine's word on what helps."""

    groups: dict[tuple, list[BenchRow]] = {}
    for r in rows:
        if r.depth is not None:
            groups.setdefault((r.model, r.engine, r.flash_attn, r.kv_cache), []).append(r)
    changed = {}
    for group in groups.values():
        base = min(group, key=lambda r: r.depth)
        for r in group:
            if r.depth == base.depth or r.tpot_efficiency >= (1 - DEPTH_EXCESS) * base.tpot_efficiency:
                continue
            expected = r.predicted_tpot_ms / base.tpot_efficiency  # its bytes at the shallowest depth's efficiency
            note = (
                f"depth {r.depth}: TPOT {r.tpot_ms:.2f} ms, {r.tpot_ms - expected:.2f} ms above what its "
                f"{r.bytes_per_token / 1e6:.1f} MB per step take at depth {base.depth}'s efficiency "
                f"({base.tpot_efficiency:.0%}, here {r.tpot_efficiency:.0%}): attention's arithmetic grows with "
                f"the depth faster than its reads; {engine_class(r.engine).depth_advice(r.flash_attn)}"
            )
            changed[id(r)] = replace(r, notes=(*r.notes, note), flags=(*r.flags, "attention_compute"))
    return [changed.get(id(r), r) for r in rows]
