"""`quantkit bench`: load each model on its engine, self-check it, time it, set it beside the
roofline, and fit the rule; the device is probed before and after the timings."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import torch

from quantkit.bench import probe as probing
from quantkit.bench import selfcheck
from quantkit.bench.accounting import mean_step_bytes
from quantkit.bench.bench_records import (
    BenchResult,
    BenchRow,
    DeviceBlock,
    FailedRow,
    LoadAverage,
    SweepPoint,
    ran_options,
)
from quantkit.bench.bench_settings import (
    BenchSettings,
    check_fits_bytes,
    check_kv_caches,
    check_kv_heads,
    check_lengths,
    check_settings,
    run_precision,
)
from quantkit.bench.engines import engine_class
from quantkit.bench.engines.engine import EngineSettings, WeightBytes
from quantkit.bench.gguf_file import gguf_config, is_gguf, reference_source
from quantkit.bench.harness import SWEEP_SAMPLES, measure, measure_depth, summarize_ms, time_prefill
from quantkit.bench.row_parts import SelfCheck
from quantkit.bench.rows import Loaded, Measured, classify, depth_notes, fit_points, make_row, name_of
from quantkit.bench.synthetic import Synthetic
from quantkit.bench.twin_timing import Twins, twin_depths
from quantkit.core.fits import fit_rule
from quantkit.core.hardware import shape_config
from quantkit.core.kv_cache import LlamaCache
from quantkit.core.roofline import Shape, predict_ttft_s, prefill_flops
from quantkit.errors import QuantkitError
from quantkit.progress import bar, note


class SelfCheckError(QuantkitError):
    """The engine's logits disagree with the reference load: no speed is reported."""

    def __init__(self, message: str, result: SelfCheck):
        super().__init__(message)
        self.result = result


def _prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=g).tolist()


def _config(source) -> dict:
    """config.json (its text part) of a checkpoint directory, the named shape of a Synthetic spec,
    or a GGUF file's own keys."""

    if isinstance(source, Synthetic):
        return shape_config(source.shape)
    if is_gguf(source):
        return gguf_config(source)
    cfg = json.loads((source / "config.json").read_text())
    return cfg.get("text_config", cfg)


def precheck(source, s: BenchSettings) -> None:
    """Context length and memory from the config and file sizes alone, so a model that cannot run
    fails before the device probe and before any loading."""

    cfg = _config(source)
    check_lengths(cfg, s)
    check_kv_heads(cfg, s, str(getattr(source, "label", source)))  # llama.cpp's cache types for these heads
    if isinstance(source, Synthetic):
        check_fits_bytes(Shape.from_config(cfg).total_params() * source.bits / 8, cfg, s, source.label)
    elif not engine_class(s.engine).sizes_own_memory:
        files = [source] if source.is_file() else source.glob("*.safetensors")  # a GGUF, or a checkpoint's shards
        check_fits_bytes(sum(f.stat().st_size for f in files), cfg, s, str(source))


def _reference(source, cfg: dict, s: BenchSettings, ids: list[int]):
    """The self-check's reference rows, computed before the engine loads (one model in memory at a time)."""

    if not s.self_check:
        return None, SelfCheck.skipped("--no-self-check")
    if isinstance(source, Synthetic):
        return None, SelfCheck.skipped("random weights (speed only): no checkpoint to compare with")

    ref_source, why = reference_source(source)  # a GGUF: the artifact it was exported from, when known
    if ref_source is None:
        return None, SelfCheck.skipped(why)
    if ref_source != source:
        cfg = _config(ref_source)
    t = time.perf_counter()
    ref, info = selfcheck.reference_logprobs(
        ref_source, ids, s.prompt_len, s.device, cfg, kv_rounding=engine_class(s.engine).applies_kv_scheme
    )
    if ref_source != source:
        info["reference_checkpoint"] = str(ref_source)
    return ref, {**info, "reference_s": time.perf_counter() - t}


def _self_check(engine, ref, info, ids: list[int], s: BenchSettings) -> SelfCheck:
    """The engine against the reference (`info`: what computed it), or `info` where none ran (skipped)."""
    if ref is None:
        return info
    t = time.perf_counter()
    result = SelfCheck(
        **info,
        **selfcheck.compare(ref, engine.logprobs(ids, s.prompt_len, s.capacity), partial=not engine.full_logprobs),
        check_s=time.perf_counter() - t,
    )
    if not result.passed:
        raise SelfCheckError(
            f"self-check failed: next-token mean KL {result.mean_kl:.3g} against {result.reference} "
            f"(threshold {result.threshold:g}; bf16 noise is ~3e-3): the bench model does not compute what the "
            "checkpoint means, so no speed is reported (--no-self-check times it anyway)",
            result,
        )
    return result


def _sweep(engine, cfg: dict, s: BenchSettings, figs, weight_bytes: float, kv: float) -> list[SweepPoint]:
    """TTFT at each prompt length of the sweep: a warm-up at each new length, then the median of
    at least SWEEP_SAMPLES (or --repeats) samples, each with a cleared cache."""

    shape, out = Shape.from_config(cfg), []
    for plen in s.prompt_sweep:
        times = time_prefill(
            engine, _prompt_ids(cfg["vocab_size"], plen, s.seed + plen), plen + s.gen_len, max(SWEEP_SAMPLES, s.repeats)
        )
        pt = predict_ttft_s(prefill_flops(shape, plen), figs.compute, weight_bytes + kv * plen, figs.bandwidth)
        out.append(SweepPoint(plen, summarize_ms(times), pt * 1e3))
    return out


def bench_one(
    source, s: BenchSettings, figs, cache: LlamaCache | None = None, twins: Twins | None = None, precision=None
):
    """Every row of one model: one per flash-attention setting (--flash-attn both loads it twice)
    and cache type (--kv-cache, or `cache`: this model's own), and with --depth one per depth of
    each. The self-check's reference is computed once; `twins` keeps the engine's fixed costs
    measured in this run; `precision`: what a torch engine computes in (settings.run_precision)."""

    cfg = _config(source)
    twins = twins if twins is not None else Twins()
    ids = _prompt_ids(cfg["vocab_size"], s.prompt_len, s.seed)
    check_ids = ids + _prompt_ids(cfg["vocab_size"], min(selfcheck.DECODE_STEPS, s.gen_len - 1), s.seed + 1)
    ref, info = _reference(source, cfg, s, check_ids)
    rows = []
    for kv in (cache,) if cache is not None else s.kv_cache_runs:
        for flash_attn in s.flash_attn_runs:
            rows += _bench_loaded(source, cfg, s, figs, (ref, info, check_ids), flash_attn, kv, twins, precision)
    return depth_notes(rows)


def _bench_loaded(
    source, cfg: dict, s: BenchSettings, figs, check, flash_attn, kv_cache, twins, precision=None
) -> list[BenchRow]:
    """Load the engine, self-check it, then its rows: the prompt's repeats, or each depth's; then
    what each row's attribution needs from this engine (its kernels on the weights, its twin)."""
    t0 = time.perf_counter()
    es = EngineSettings(
        device=s.device,
        max_tokens=s.max_tokens,
        seed=s.seed,
        threads=s.threads,
        tensor_parallel=s.tensor_parallel,
        flash_attn=flash_attn,
        kv_cache=kv_cache,
        reuse_prefix=bool(s.depths),
        precision=precision,
    )
    engine = engine_class(s.engine).load(source, es)
    load_s = time.perf_counter() - t0
    try:
        ref, info, check_ids = check
        passed = _self_check(engine, ref, info, check_ids, s)
        if not s.depths:
            ids = check_ids[: s.prompt_len]
            timings = measure(engine, ids, s.gen_len, repeats=s.repeats, min_seconds=s.min_seconds, warmups=s.warmups)
            sweep = _sweep(engine, cfg, s, figs, engine.weight_bytes_per_token(), engine.kv_bytes_per_token())
            step = mean_step_bytes(lambda c: engine.step_bytes(c, s.capacity), s.prompt_len, s.gen_len)
            measured = [Measured(s.prompt_len, None, s.capacity, timings, engine.step_note, step, tuple(sweep), t0)]
        else:
            measured = [_at_depth(engine, cfg, s, d) for d in s.depths]
        kernels, fixed, missing = _attribution_inputs(engine, es, s, cfg, twins)
        loaded = Loaded(
            WeightBytes.of(engine.weight_bytes()),
            engine.kv_bytes_per_token(),
            engine.kv_cache_type(),
            engine.describe(),
            passed,
            load_s,
            kernels,
            fixed,
            missing,
        )
        return [make_row(source, cfg, s, figs, loaded, m) for m in measured]
    finally:
        engine.close()


def _attribution_inputs(engine, es: EngineSettings, s: BenchSettings, cfg: dict, twins: Twins):
    """The engine's kernel times on this model's weights and its fixed costs (from the twin), or why
    not: (kernels or None, fixed or None, reasons)."""
    if not engine.attributes:
        return None, None, (engine.attribution_missing,)
    why: list[str] = []
    try:
        kernels = engine.weight_kernels()
    except QuantkitError as exc:
        return None, None, (f"the weights' kernels could not be timed: {exc}",)
    depths = twin_depths(
        engine_class(s.engine), list(s.depths or [s.prompt_len]), cfg.get("max_position_embeddings"), s.gen_len
    )
    fixed = None
    if depths is None:
        why.append("the model's context leaves no room for two cache sizes of the twin")
    else:
        fixed, reason = twins.fixed(engine, es, depths, s.gen_len, s.repeats, cfg["vocab_size"])
        if reason:
            why.append(f"no fixed costs: {reason}")
    return kernels, fixed, tuple(why)


def _at_depth(engine, cfg: dict, s: BenchSettings, depth: int) -> Measured:
    """Decode with `depth` tokens cached (harness.measure_depth): one prefill of the depth, then the
    repeats from it. Each depth has prompt ids of its own, so no depth finds another's in a cache."""
    t = time.perf_counter()
    ids = _prompt_ids(cfg["vocab_size"], max(depth, 1), s.seed + 1000 + depth)
    timings = measure_depth(
        engine, ids, depth, s.gen_len, repeats=s.repeats, min_seconds=s.min_seconds, warmups=s.warmups
    )
    capacity = depth + s.gen_len
    step = mean_step_bytes(lambda c: engine.step_bytes(c, capacity), depth, s.gen_len)
    return Measured(depth, depth, capacity, timings, engine.step_note, step, (), t)


def _precheck_all(paths: list, s: BenchSettings, names: list[str]):
    todo, failed = [], []
    for p, name in zip(paths, names):
        try:
            precheck(p, s)
            todo.append((p, name))
        except QuantkitError as exc:
            failed.append(FailedRow(str(p), name, str(exc)))
    if not todo:
        raise QuantkitError(failed[0].error)
    return todo, failed


def _device_block(s: BenchSettings, before: dict, after: dict | None, rows: list[BenchRow]) -> DeviceBlock:
    figs, seen = probing.as_device(before), probing.facts(before)
    return DeviceBlock(
        device=str(s.device),
        type=s.device.type,
        name=figs.name,
        device_name=seen.name,
        dtype=rows[0].dtype if rows else None,
        threads=seen.threads,
        bandwidth_gbps=figs.bandwidth / 1e9,
        compute_tflops=figs.compute / 1e12,
        source=figs.source,
        llc_bytes=seen.llc_bytes,
        probe=before,
        probe_after=after,
        drift=probing.drift(before, after) if after else None,
    )


def bench_many(
    paths: list, s: BenchSettings, names: list[str] | None = None, probe=None, caches: dict | None = None
) -> BenchResult:
    """Bench every model in one process between two probes, so ratios between them are comparable
    and a device that changed speed during the run is flagged. `probe(device) -> dict` (default:
    probe.run_probe) is a parameter so tests can inject one. `caches`: name -> the LlamaCache a
    model runs with instead of the settings' (a run's variant whose recipe names its llama.cpp
    cache types), checked against the settings' flash attention first.

    A model that cannot be benchmarked (no kernel for its scheme, too big, failed self-check)
    gets an error row; the others go on."""

    probe = probe or (lambda device: probing.run_probe(device, s.threads))
    check_settings(s)
    caches = caches or {}
    check_kv_caches(s, list(caches.values()), "kv_cache.llamacpp")
    names = names or [name_of(p) for p in paths]
    todo, failed = _precheck_all(paths, s, names)
    load_before = os.getloadavg()[0]
    before = probe(s.device)
    precision = run_precision(s, before)  # a torch engine's dtype, from this probe unless --dtype
    figs = probing.as_device(before, precision.dtype if precision else None)
    rows: list[BenchRow] = []
    twins = Twins()
    with bar(f"bench ({s.engine}, {s.device})", total=len(todo)) as update:
        for i, (p, name) in enumerate(todo):
            note(f"bench {p} ({s.engine}, {s.device})")
            update(i, f"bench {name} ({s.engine}, {s.device})")
            try:
                rows += [replace(r, name=name) for r in bench_one(p, s, figs, caches.get(name), twins, precision)]
            except SelfCheckError as exc:
                failed.append(FailedRow(str(p), name, str(exc), exc.result))
            except QuantkitError as exc:
                failed.append(FailedRow(str(p), name, str(exc)))
        update(len(todo))
    if not rows and not any(f.self_check is not None for f in failed):
        raise QuantkitError(failed[0].error)  # nothing ran: one line, as for any user error
    after = probe(s.device)
    drift = probing.drift(before, after)
    rows = [classify(r, probing.facts(before).llc_bytes, drift) for r in rows]
    return BenchResult(
        settings=ran_options(s),
        device=_device_block(s, before, after, rows),
        rows=tuple(rows),
        failed=tuple(failed),
        fit=fit_rule(*fit_points(rows)),
        load_average=LoadAverage(load_before, os.getloadavg()[0], os.cpu_count()),
    )
