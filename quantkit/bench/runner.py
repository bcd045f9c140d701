"""`quantkit bench`: load each model, time it, set it beside the roofline, and fit the rule."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import QuantkitError
from ..progress import bar, note
from ..roofline import Shape, efficiency, fit_rule, prefill_flops, predict_ttft_s
from .accounting import mean_step_bytes, weight_read_bytes


@dataclass(frozen=True)
class BenchSettings:
    device: str = "cpu"
    engine: str = "compiled"
    prompt_len: int = 256
    gen_len: int = 64
    repeats: int = 5
    min_seconds: float = 2.0
    warmups: int = 2
    prompt_sweep: tuple[int, ...] = ()
    seed: int = 0


def check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise QuantkitError("--device cuda: no CUDA GPU is available on this machine")
    if device not in ("cpu", "cuda"):
        raise QuantkitError(f"--device {device}: use cpu or cuda")


def check_settings(s: BenchSettings) -> None:
    """Settings that no model can be timed with: rejected before any loading or probing."""
    if s.prompt_len <= 0 or s.gen_len <= 1:
        raise QuantkitError("--prompt-len must be > 0 and --gen-len > 1")
    if s.repeats < 1 or s.warmups < 0 or s.min_seconds < 0:
        raise QuantkitError("--repeats must be >= 1, --warmups and --min-seconds >= 0")


def check_lengths(cfg: dict, s: BenchSettings) -> None:
    limit = cfg.get("max_position_embeddings")
    longest = max((s.prompt_len, *s.prompt_sweep)) + s.gen_len
    if limit and longest > limit:
        raise QuantkitError(f"prompt + generated tokens ({longest}) exceed the model's context ({limit})")


def check_fits_bytes(weights: float, cfg: dict, s: BenchSettings, what: str) -> None:
    """Estimate from the weight bytes and the KV cache before allocating anything."""
    import psutil
    import torch

    kv = Shape.from_config(cfg)
    need = weights * 1.15 + 2 * kv.layers * kv.kv_heads * kv.head_dim * 2 * (s.prompt_len + s.gen_len + 1)
    have = torch.cuda.mem_get_info()[0] if s.device == "cuda" else psutil.virtual_memory().available
    if need > have:
        raise QuantkitError(f"{what}: needs about {need / 1e9:.1f} GB on {s.device}, {have / 1e9:.1f} GB available")


def _prompt(vocab: int, length: int, seed: int, device: str):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=g).to(device)


def _config(source) -> dict:
    """config.json of a checkpoint directory, or the named shape of a Synthetic spec."""
    from .synthetic import Synthetic

    if isinstance(source, Synthetic):
        from ..hardware import shape_config

        return shape_config(source.shape)
    return json.loads((source / "config.json").read_text())


def precheck(source, s: BenchSettings) -> None:
    """Context length and memory from the config and file sizes alone, so a model that cannot run
    fails before the device probe and before any loading."""
    from .synthetic import Synthetic

    cfg = _config(source)
    check_lengths(cfg, s)
    if isinstance(source, Synthetic):
        check_fits_bytes(Shape.from_config(cfg).total_params() * source.bits / 8, cfg, s, source.label)
    elif s.engine != "vllm":  # vLLM sizes its own memory
        check_fits_bytes(sum(f.stat().st_size for f in source.glob("*.safetensors")), cfg, s, str(source))


def _load(source, s: BenchSettings):
    """A checkpoint directory or a Synthetic spec -> (config dict, BenchModel); precheck() has passed."""
    from .loader import load_for_bench
    from .synthetic import Synthetic, load_synthetic

    cfg = _config(source)
    if isinstance(source, Synthetic):
        return cfg, load_synthetic(source, cfg, s.device, s.seed)
    return cfg, load_for_bench(source, s.device)


def bench_vllm(path: Path, s: BenchSettings):
    """vLLM: whole generate() calls (see vllm_engine.py); the bytes come from the stored tensors."""
    from ..sizes import stored_read_bytes
    from .harness import Timings
    from .vllm_engine import VllmEngine

    cfg = json.loads((path / "config.json").read_text())
    eng = VllmEngine(str(path), s.device, max((s.prompt_len, *s.prompt_sweep)) + s.gen_len + 1)
    prompt = _prompt(cfg["vocab_size"], s.prompt_len, s.seed, "cpu")[0].tolist()
    timings = Timings()
    t = time.perf_counter()
    for _ in range(s.warmups):
        eng.time_once(prompt, s.gen_len)
    timings.warmup_s = time.perf_counter() - t
    for _ in range(s.repeats):
        ttft, steps = eng.time_once(prompt, s.gen_len)
        timings.ttft_s.append(ttft)
        timings.step_s.append(steps)
    return cfg, {"weight_bytes_per_token": stored_read_bytes(path), "stored_weight_bytes": None, "tied_lm_head": None}, timings


def _time_local(path, s: BenchSettings, figs) -> dict:
    """Load with quantkit's loader, time with the harness; returns the pieces of a result row."""
    import torch

    from .engines import get_engine
    from .harness import measure

    t_load = time.perf_counter()
    cfg, bm = _load(path, s)
    load_s = time.perf_counter() - t_load
    config = bm.model.config
    max_len = max((s.prompt_len, *s.prompt_sweep)) + s.gen_len + 1
    engine = get_engine(s.engine)(bm.model, s.device, max_len)
    prompt = _prompt(config.vocab_size, s.prompt_len, s.seed, s.device)
    with torch.inference_mode():
        timings = measure(engine, prompt, s.gen_len, repeats=s.repeats, min_seconds=s.min_seconds, warmups=s.warmups, device=s.device)
        acct = weight_read_bytes(bm.model)
        sweep = _sweep(engine, cfg, s, figs, acct["weight_bytes_per_token"])
    out = {"cfg": cfg, "acct": acct, "timings": timings, "sweep": sweep, "kind": bm.kind, "kernel": bm.kernel, "notes": bm.notes, "load_s": load_s}
    del engine, bm
    gc.collect()
    return out


def _sweep(engine, cfg: dict, s: BenchSettings, figs, weight_bytes: int) -> list[dict]:
    """TTFT at each prompt length of the sweep (prefill plus first token, cache cleared each time)."""
    from .harness import Clock, summarize_ms

    shape, kv, clock = Shape.from_config(cfg), kv_bytes_per_token_cfg(cfg), Clock(s.device)
    out = []
    for plen in s.prompt_sweep:
        p = _prompt(cfg["vocab_size"], plen, s.seed + plen, s.device)
        times = []
        for _ in range(max(2, s.repeats)):
            engine.reset()
            t0 = clock.now()
            engine.prefill(p)
            times.append(clock.now() - t0)
        pt = predict_ttft_s(prefill_flops(shape, plen), figs.compute, weight_bytes + kv * plen, figs.bandwidth)
        out.append({"prompt_len": plen, "ttft_ms": summarize_ms(times), "predicted_ttft_ms": pt * 1e3})
    return out


def kv_bytes_per_token_cfg(cfg: dict) -> int:
    shape = Shape.from_config(cfg)
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def bench_one(path, s: BenchSettings, figs) -> dict:
    t0 = time.perf_counter()
    if s.engine == "vllm":
        cfg, acct, timings = bench_vllm(path, s)
        part = {"cfg": cfg, "acct": acct, "timings": timings, "sweep": [], "kind": "vllm", "kernel": "vLLM's own kernels", "notes": [], "load_s": None}
    else:
        part = _time_local(path, s, figs)
    cfg, acct, summary = part["cfg"], part["acct"], part["timings"].summary()
    kv = kv_bytes_per_token_cfg(cfg)
    step_bytes = mean_step_bytes(acct["weight_bytes_per_token"], kv, s.prompt_len, s.gen_len)
    pred_tpot = step_bytes / figs.bandwidth
    pred_ttft = predict_ttft_s(prefill_flops(Shape.from_config(cfg), s.prompt_len), figs.compute,
                               acct["weight_bytes_per_token"] + kv * s.prompt_len, figs.bandwidth)
    tpot, ttft = summary["tpot_ms"]["median"] / 1e3, summary["ttft_ms"]["median"] / 1e3
    eff_tpot, bad_tpot = efficiency(pred_tpot, tpot)
    eff_ttft, bad_ttft = efficiency(pred_ttft, ttft)
    return {
        "model": str(path) if isinstance(path, Path) else path.label, "name": _name(path), "kind": part["kind"],
        "kernel": part["kernel"], "engine": s.engine, "device": s.device, "prompt_len": s.prompt_len, "gen_len": s.gen_len,
        "load_s": part["load_s"], "compile_and_warmup_s": summary.pop("warmup_s"), **acct, "kv_bytes_per_token": kv,
        "bytes_per_token": step_bytes, "ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3, "predicted_tpot_ms": pred_tpot * 1e3,
        "predicted_ttft_ms": pred_ttft * 1e3, "tpot_efficiency": eff_tpot, "ttft_efficiency": eff_ttft,
        "accounting_error": bad_tpot or bad_ttft, "stats": summary, "prompt_sweep": part["sweep"], "notes": part["notes"],
        "bench_wall_s": time.perf_counter() - t0,
    }


def _name(path) -> str:
    if not isinstance(path, Path):
        return path.label
    meta = path / "quantkit.json"
    if meta.is_file():
        return json.loads(meta.read_text()).get("name") or path.name
    return path.name


def device_figures(s: BenchSettings, reprobe: bool = True):
    """Probe in the same run as the timings by default (shared machines drift), else reuse the cache."""
    from .probe import cached_probe, run_probe

    if reprobe:
        run_probe(s.device)
    return cached_probe(s.device)


def bench_many(paths: list, s: BenchSettings, names: list[str] | None = None) -> dict:
    """Bench every model in one process and one probe, so ratios between them are comparable.

    A model that cannot be benchmarked (no kernel for its scheme, too big) gets an error row;
    the others go on."""
    import os

    check_device(s.device)
    check_settings(s)
    names = names or [_name(p) for p in paths]
    rows, failed, todo = [], [], []
    for p, name in zip(paths, names):
        try:
            precheck(p, s)
            todo.append((p, name))
        except QuantkitError as exc:
            failed.append({"model": str(p), "name": name, "error": str(exc)})
    if not todo:
        raise QuantkitError(failed[0]["error"])
    load_before = os.getloadavg()[0]
    figs = device_figures(s)
    with bar(f"bench ({s.engine}, {s.device})", total=len(todo)) as update:
        for i, (p, name) in enumerate(todo):
            note(f"bench {p} ({s.engine}, {s.device})")
            update(i, f"bench {name} ({s.engine}, {s.device})")
            try:
                rows.append({**bench_one(p, s, figs), "name": name})
            except QuantkitError as exc:
                failed.append({"model": str(p), "name": name, "error": str(exc)})
        update(len(todo))
    if not rows and failed:
        raise QuantkitError(failed[0]["error"])
    fit = fit_rule([r["bytes_per_token"] for r in rows], [r["tpot_ms"] / 1e3 for r in rows])
    return {
        "kind": "bench",
        "schema_version": 1,
        "settings": s.__dict__ | {"prompt_sweep": list(s.prompt_sweep)},
        "device": {"name": figs.name, "bandwidth_gbps": figs.bandwidth / 1e9, "compute_tflops": figs.compute / 1e12, "source": figs.source},
        "rows": rows,
        "failed": failed,
        "fit": fit,
        "load_average": {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()},
    }
