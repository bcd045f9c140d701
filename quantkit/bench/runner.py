"""`quantkit bench`: load each model on its engine, self-check it, time it, set it beside the
roofline, and fit the rule; the device is probed before and after the timings."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from quantkit.bench import probe as probing
from quantkit.bench import selfcheck
from quantkit.bench.accounting import kv_live, mean_step_bytes
from quantkit.bench.engines import engine_class
from quantkit.bench.engines.base import EngineSettings
from quantkit.bench.gguf_source import gguf_config, is_gguf, reference_source
from quantkit.bench.harness import SWEEP_SAMPLES, measure, summarize_ms, time_prefill
from quantkit.bench.llama_bench import compare
from quantkit.bench.records import BenchResult, BenchRow, DeviceBlock, FailedRow, LoadAverage, SweepPoint
from quantkit.bench.settings import BenchSettings, check_fits_bytes, check_lengths, check_settings  # noqa: F401  (re-exported)
from quantkit.bench.synthetic import Synthetic
from quantkit.core.hardware import shape_config
from quantkit.core.roofline import Shape, efficiency, fit_rule, predict_ttft_s, prefill_flops
from quantkit.errors import QuantkitError
from quantkit.progress import bar, note


class SelfCheckError(QuantkitError):
    """The engine's logits disagree with the reference load: no speed is reported."""

    def __init__(self, message: str, result: dict):
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
    if isinstance(source, Synthetic):
        check_fits_bytes(Shape.from_config(cfg).total_params() * source.bits / 8, cfg, s, source.label)
    elif not engine_class(s.engine).sizes_own_memory:
        files = [source] if source.is_file() else source.glob("*.safetensors")  # a GGUF, or a checkpoint's shards
        check_fits_bytes(sum(f.stat().st_size for f in files), cfg, s, str(source))


def _reference(source, cfg: dict, s: BenchSettings, ids: list[int]):
    """The self-check's reference rows, computed before the engine loads (one model in memory at a time)."""

    if not s.self_check:
        return None, {"status": "skipped", "reason": "--no-self-check"}
    if isinstance(source, Synthetic):
        return None, {"status": "skipped", "reason": "random weights (speed only): no checkpoint to compare with"}

    ref_source, why = reference_source(source)  # a GGUF: the artifact it was exported from, when known
    if ref_source is None:
        return None, {"status": "skipped", "reason": why}
    if ref_source != source:
        cfg = _config(ref_source)
    t = time.perf_counter()
    ref, info = selfcheck.reference_logprobs(ref_source, ids, s.prompt_len, s.device, cfg)
    if ref_source != source:
        info["reference_checkpoint"] = str(ref_source)
    return ref, {**info, "reference_s": time.perf_counter() - t}


def _self_check(engine, ref, info: dict, ids: list[int], s: BenchSettings) -> dict:
    if ref is None:
        return info
    t = time.perf_counter()
    result = {
        **info,
        **selfcheck.compare(ref, engine.logprobs(ids, s.prompt_len, s.capacity), partial=not engine.full_logprobs),
        "check_s": time.perf_counter() - t,
    }
    if not result["passed"]:
        raise SelfCheckError(
            f"self-check failed: next-token mean KL {result['mean_kl']:.3g} against {result['reference']} "
            f"(threshold {result['threshold']:g}; bf16 noise is ~3e-3): the bench model does not compute what the "
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


def _measure(source, cfg: dict, s: BenchSettings, figs) -> dict:
    """Reference, load, self-check, timings and sweep on the engine; the pieces of a result row."""

    ids = _prompt_ids(cfg["vocab_size"], s.prompt_len, s.seed)
    check_ids = ids + _prompt_ids(cfg["vocab_size"], min(selfcheck.DECODE_STEPS, s.gen_len - 1), s.seed + 1)
    ref, info = _reference(source, cfg, s, check_ids)
    es = EngineSettings(
        device=s.device, max_tokens=s.max_tokens, seed=s.seed, threads=s.threads, tensor_parallel=s.tensor_parallel
    )
    t = time.perf_counter()
    engine = engine_class(s.engine).load(source, es)
    load_s = time.perf_counter() - t
    try:
        check = _self_check(engine, ref, info, check_ids, s)
        timings = measure(engine, ids, s.gen_len, repeats=s.repeats, min_seconds=s.min_seconds, warmups=s.warmups)
        wb, kv = engine.weight_bytes(), engine.kv_bytes_per_token()
        sweep = _sweep(engine, cfg, s, figs, wb["weight_bytes_per_token"], kv)
        step = mean_step_bytes(lambda c: engine.step_bytes(c, s.capacity), s.prompt_len, s.gen_len)
        return {
            "acct": wb,
            "kv": kv,
            "step_bytes": step,
            "timings": timings,
            "sweep": sweep,
            "self_check": check,
            "engine": engine.describe(),
            "step_note": engine.step_note,
            "load_s": load_s,
        }
    finally:
        engine.close()


def bench_one(source, s: BenchSettings, figs) -> BenchRow:
    t0 = time.perf_counter()
    cfg = _config(source)
    part = _measure(source, cfg, s, figs)
    acct, eng, kv = part["acct"], part["engine"], part["kv"]
    summary = part["timings"].summary(part["step_note"])
    weights = acct["weight_bytes_per_token"]
    ideal = mean_step_bytes(lambda c: weights + kv_live(kv, c), s.prompt_len, s.gen_len)
    bandwidth = figs.bandwidth * s.tensor_parallel  # tensor parallel: each GPU reads its 1/N shard
    pred_tpot = part["step_bytes"] / bandwidth
    flops_s = prefill_flops(Shape.from_config(cfg), s.prompt_len) / (figs.compute * s.tensor_parallel)
    pred_ttft = predict_ttft_s(flops_s, 1.0, weights + kv * s.prompt_len, bandwidth)
    tpot, ttft = summary["tpot_ms"]["median"] / 1e3, summary["ttft_ms"]["median"] / 1e3
    notes = list(eng.pop("notes", []))
    anchor = _anchor(s, eng, ttft * 1e3, tpot * 1e3, notes)
    if summary["warmups"] > s.warmups:
        notes.append(
            f"--warmups {s.warmups} raised to {summary['warmups']}: the {s.engine} engine compiles on its first "
            "calls, and compilation is not decode"
        )
    return BenchRow(
        model=str(source) if isinstance(source, Path) else source.label,
        name=_name(source),
        kind=eng.pop("kind"),
        kernel=eng.pop("kernel"),
        emulated=eng.pop("emulated", None),
        engine=s.engine,
        device=str(s.device),
        device_name=eng.get("name"),
        dtype=eng.get("dtype"),
        threads=eng.get("threads"),
        engine_info=eng,
        prompt_len=s.prompt_len,
        gen_len=s.gen_len,
        depth=None,
        flash_attn=eng.get("flash_attn"),
        load_s=part["load_s"],
        compile_and_warmup_s=summary.pop("warmup_s"),
        warmups=summary["warmups"],
        warmups_requested=s.warmups,
        weight_bytes_per_token=weights,
        stored_weight_bytes=acct["stored_weight_bytes"],
        tied_lm_head=acct["tied_lm_head"],
        weight_bytes_by_type=acct.get("weight_bytes_by_type"),
        kv_bytes_per_token=kv,
        kv_cache_tokens=s.capacity,
        bytes_per_token=part["step_bytes"],
        kv_bytes_per_step=part["step_bytes"] - weights,
        ideal_bytes_per_token=ideal,
        ttft_ms=ttft * 1e3,
        tpot_ms=tpot * 1e3,
        predicted_tpot_ms=pred_tpot * 1e3,
        predicted_ttft_ms=pred_ttft * 1e3,
        tpot_efficiency=efficiency(pred_tpot, tpot)[0],
        ttft_efficiency=efficiency(pred_ttft, ttft)[0],
        ttft_bound="compute" if flops_s >= pred_ttft else "memory",
        self_check=part["self_check"],
        stats=summary,
        prompt_sweep=tuple(part["sweep"]),
        notes=tuple(notes),
        anchor=anchor,
        bench_wall_s=time.perf_counter() - t0,
    )


def _anchor(s: BenchSettings, eng: dict, ttft_ms: float, tpot_ms: float, notes: list[str]) -> dict | None:
    """The engine's own benchmark beside quantkit's figures (llama.cpp: llama-bench), a note when they disagree."""

    found = engine_class(s.engine).anchor(eng, s.prompt_len, s.gen_len, s.repeats)
    if found is None:
        return None
    if "error" in found:
        notes.append(f"no anchor: {found['error']}")
        return found
    result = compare(ttft_ms, tpot_ms, found)
    for what in result["disagree"]:
        notes.append(
            f"{what.upper()} {result['ratio_' + what]:.2f}x llama-bench's ({result[what + '_ms']:.2f} ms): beyond "
            f"{result['tolerance']:.0%}; llama-bench runs llama.cpp's own build ({result.get('backends')})"
        )
    return result


def classify(row: BenchRow, llc_bytes: int | None) -> BenchRow:
    """Flags of a row. Efficiency above 100% is an accounting error, unless the bytes of a step
    fit in the last-level cache: then the weights need not stream from memory at all and beating
    a streaming read is expected ("fits in cache")."""
    fits = bool(llc_bytes and row.bytes_per_token <= llc_bytes)
    flags = ["fits_in_cache"] if fits else []
    if row.tpot_efficiency > 1.0 and not fits:
        flags.append("tpot_above_roofline")
    if row.ttft_efficiency is not None and row.ttft_efficiency > 1.0 and not (fits and row.ttft_bound == "memory"):
        flags.append("ttft_above_roofline")
    if row.warmups > row.warmups_requested:
        flags.append("warmups_raised")
    if row.emulated:  # not the stored format's speed: another format was timed (row.emulated says which)
        flags.append("emulated")
    bad = {"tpot_above_roofline", "ttft_above_roofline"}
    return replace(row, flags=tuple(flags), fits_in_cache=fits, accounting_error=bool(bad & set(flags)))


def _name(path) -> str:
    if not isinstance(path, Path):
        return path.label
    if path.is_file():  # a GGUF
        return path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
    meta = path / "quantkit.json"
    if meta.is_file():
        try:
            return json.loads(meta.read_text()).get("name") or path.name
        except json.JSONDecodeError:
            return path.name
    return path.name


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
    figs = probing.as_device(before)
    return DeviceBlock(
        device=str(s.device),
        type=s.device.type,
        name=figs.name,
        device_name=before.get("name"),
        dtype=rows[0].dtype if rows else None,
        threads=before.get("threads"),
        bandwidth_gbps=figs.bandwidth / 1e9,
        compute_tflops=figs.compute / 1e12,
        source=figs.source,
        llc_bytes=before.get("llc_bytes"),
        probe=before,
        probe_after=after,
        drift=probing.drift(before, after) if after else None,
    )


def bench_many(paths: list, s: BenchSettings, names: list[str] | None = None, probe=None) -> BenchResult:
    """Bench every model in one process between two probes, so ratios between them are comparable
    and a device that changed speed during the run is flagged. `probe(device) -> dict` (default:
    probe.run_probe) is a parameter so tests can inject one.

    A model that cannot be benchmarked (no kernel for its scheme, too big, failed self-check)
    gets an error row; the others go on."""

    probe = probe or (lambda device: probing.run_probe(device, s.threads))
    check_settings(s)
    names = names or [_name(p) for p in paths]
    todo, failed = _precheck_all(paths, s, names)
    load_before = os.getloadavg()[0]
    before = probe(s.device)
    figs = probing.as_device(before)
    rows: list[BenchRow] = []
    with bar(f"bench ({s.engine}, {s.device})", total=len(todo)) as update:
        for i, (p, name) in enumerate(todo):
            note(f"bench {p} ({s.engine}, {s.device})")
            update(i, f"bench {name} ({s.engine}, {s.device})")
            try:
                rows.append(replace(bench_one(p, s, figs), name=name))
            except SelfCheckError as exc:
                failed.append(FailedRow(str(p), name, str(exc), exc.result))
            except QuantkitError as exc:
                failed.append(FailedRow(str(p), name, str(exc)))
        update(len(todo))
    if not rows and not any(f.self_check is not None for f in failed):
        raise QuantkitError(failed[0].error)  # nothing ran: one line, as for any user error
    after = probe(s.device)
    rows = [classify(r, before.get("llc_bytes")) for r in rows]
    return BenchResult(
        settings=s.to_json(),
        device=_device_block(s, before, after, rows),
        rows=tuple(rows),
        failed=tuple(failed),
        fit=fit_rule([r.bytes_per_token for r in rows], [r.tpot_ms / 1e3 for r in rows]),
        load_average=LoadAverage(load_before, os.getloadavg()[0], os.cpu_count()),
    )
