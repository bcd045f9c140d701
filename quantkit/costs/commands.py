"""The wiring behind `--plan`: read a command's inputs (config.json, safetensors headers, the
meta-device skeleton), probe the device for a second, and hand numbers to quantkit.costs.formulas's cost
functions. Nothing here loads a weight. `convert --plan` costs the same prepared job `convert`
runs (quantize/job.py); `run --plan` is pipeline/run_costs.py; the commands print the plan."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import psutil
import torch

from quantkit.bench.bench_runner import precheck
from quantkit.bench.engines import engine_class
from quantkit.bench.harness import SWEEP_SAMPLES
from quantkit.bench.synthetic import Synthetic
from quantkit.bench.twin_timing import twin_depths
from quantkit.core.attribution import TWIN_WIDTH
from quantkit.core.hardware import shape_config
from quantkit.core.roofline import (
    Layout,
    Shape,
    WeightFormat,
    kv_bytes_per_token,
    prefill_flops,
    weight_bytes_per_token,
)
from quantkit.costs.formulas import (
    GB,
    BenchWork,
    ConvertWork,
    Machine,
    Model,
    Plan,
    bench_plan,
    convert_plan,
    eval_plan,
    forward_flops,
)
from quantkit.device import free_bytes, name, synchronize
from quantkit.errors import DataError, QuantkitError
from quantkit.evals.eval_runner import prepare_eval
from quantkit.evals.eval_settings import EvalSettings
from quantkit.evals.scorers import SCORERS, scorer_named
from quantkit.models.checkpoint import read_config
from quantkit.models.sizes import stored_read_bytes, tensor_bytes
from quantkit.quantize.auto import Search, raisable
from quantkit.quantize.job import check_inputs, prepare
from quantkit.quantize.preflight import check_weights, meta_model
from quantkit.quantize.sensitivity import decoder_layers


def read_model(path: Path, trust_remote_code: bool = False, skeleton=None) -> Model:
    """A checkpoint's Model from config.json, the safetensors headers and the meta-device skeleton."""

    cfg = read_config(path)
    if skeleton is None:
        skeleton = meta_model(cfg, trust_remote_code)
        check_weights(skeleton, cfg, path)  # a plan says what the run's load would refuse
    return _from_skeleton(cfg, skeleton, sum(tensor_bytes(path).values()))


def _from_skeleton(cfg: dict, skeleton, weight_bytes: int) -> Model:
    text = cfg.get("text_config", cfg)
    layers = _decoder_layers(skeleton)
    linears = (
        tuple((mod.out_features, mod.in_features) for mod in layers[0].modules() if isinstance(mod, torch.nn.Linear))
        if layers
        else ()
    )
    head = skeleton.get_output_embeddings()
    heads = text["num_attention_heads"]
    dtype = str(text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    return Model(
        params=sum(p.numel() for p in skeleton.parameters()),
        weight_bytes=weight_bytes,
        itemsize=4 if dtype == "float32" else 2,
        layers=len(layers),
        hidden=text["hidden_size"],
        vocab=text["vocab_size"],
        q_dim=heads * (text.get("head_dim") or text["hidden_size"] // heads),
        layer_linears=linears,
        head=(head.out_features, head.in_features) if head is not None else (0, 0),
    )


def _decoder_layers(model) -> list:
    for mod in model.modules():
        if (
            isinstance(mod, torch.nn.ModuleList)
            and len(mod)
            and any(isinstance(s, torch.nn.Linear) for s in mod[0].modules())
        ):
            return list(mod)
    return []


def quick_probe(device) -> dict:
    """This device's figures in about a second: a streaming read, bf16 and float32 matmuls
    (best of 5). `quantkit bench --probe` measures more carefully; a plan must not take minutes.
    QUANTKIT_PLAN_PROBE (JSON of these figures) replays figures recorded earlier, so a plan can be
    recomputed for the machine state a measurement ran in (benchmarks/scale.py --replan)."""

    if os.environ.get("QUANTKIT_PLAN_PROBE"):
        figures = json.loads(os.environ["QUANTKIT_PLAN_PROBE"])
        return {
            "read_bps": float(figures["read_bps"]),
            "bfloat16_flops": float(figures["bf16_flops"]),
            "float32_flops": float(figures["fp32_flops"]),
        }

    def best(fn, n=5):
        fn()
        synchronize(device)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t)
        return min(times)

    big = device.type != "cpu"
    buf = torch.ones((1 << 28 if big else 1 << 26), dtype=torch.float32, device=device)  # 1 GiB / 256 MiB
    read = buf.numel() * 4 / best(lambda buf=buf: buf.sum())
    del buf
    n = 8192 if big else 2048  # the size of a 1-8B model's layer matmuls: smaller ones under-report a CPU by 2x
    out = {"read_bps": read}
    for dt in (torch.bfloat16, torch.float32):
        a = torch.randn(n, n, dtype=dt, device=device)
        out[f"{str(dt)[6:]}_flops"] = 2 * n**3 / best(lambda: a @ a)
    return out


def this_machine(device, out_dir=None, probe: bool = True) -> Machine:
    """Free memory, disk and the quick probe of `device` (a torch.device); without `probe`, unit
    figures (for a memory-only check: its times mean nothing)."""

    p = Path(out_dir or ".").resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    figures = quick_probe(device) if probe else {"read_bps": 1.0, "bfloat16_flops": 1.0, "float32_flops": 1.0}
    return Machine(
        device=str(device),
        device_type=device.type,
        name=name(device),
        ram_available=int(psutil.virtual_memory().available),
        device_free=free_bytes(device),
        disk_free=shutil.disk_usage(p).free,
        read_bps=figures["read_bps"],
        bf16_flops=figures["bfloat16_flops"],
        fp32_flops=figures["float32_flops"],
        probe="quantkit.costs.commands.quick_probe: 256 MiB read (1 GiB on a GPU), 2048² (8192²) matmuls, best of 5",
    )


def render(plan: Plan) -> str:
    m, mc = plan.model, plan.machine
    lines = [
        f"plan: {plan.command} on {mc['device']} ({mc['name']})",
        f"  model        {m['params'] / 1e9:.3f} B parameters, "
        f"{m['weight_bytes'] / GB:.2f} GB of weights, {m['layers']} layers",
    ]
    for stage, nbytes in plan.stages.items():
        lines.append(f"  {stage:<24} {nbytes / GB:8.2f} GB")
    vram = f", {plan.peak_vram / GB:.2f} GB on {mc['device']}" if plan.peak_vram is not None else ""
    lines.append(
        f"  peak memory  {plan.peak_ram / GB:.2f} GB of RAM ({mc['ram_available'] / GB:.1f} GB available){vram}"
    )
    if plan.disk:
        lines.append(f"  disk         {plan.disk / GB:.2f} GB ({mc['disk_free'] / GB:.0f} GB free)")
    lines.append(f"  offload      {'yes: weights beyond the RAM budget go to disk' if plan.offload else 'no'}")
    parts = ", ".join(f"{k} {v:.0f}s" for k, v in plan.time_breakdown.items() if v >= 0.5)
    lines.append(f"  time         about {_duration(plan.seconds)} ({parts})")
    lines += [f"  note: {n}" for n in plan.notes]
    if not plan.fits:
        lines += [f"  DOES NOT FIT: {p}" for p in plan.problems]
        lines += [f"  to fit: {a}" for a in plan.advice]
    return "\n".join(lines)


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


# ---------------------------------------------------------------- the commands


def plan_convert(recipe, model_ref: str | None, out: Path, opts, variant_name: str | None = None) -> Plan:
    """`convert --plan`: `convert`'s own checks (job.check_inputs and job.prepare: every refusal
    the command makes before loading), then the cost; nothing is loaded, locked or written."""

    check_inputs(recipe, model_ref, out, opts)
    return convert_job_plan(prepare(recipe, model_ref, out, opts, variant_name))


def convert_job_plan(job, probe: bool = True) -> Plan:
    """The cost of a prepared convert job on its calibration device (`probe`: time the device;
    without it, the memory and disk figures alone mean something)."""
    model = read_model(job.src, job.opts.trust_remote_code, job.skeleton)
    return convert_plan(model, convert_work(job), this_machine(job.device, job.out.parent, probe=probe))


def memory_warning(job) -> str | None:
    """`convert`'s check before loading (ConvertOptions.memory_check): one line when the predicted
    peak exceeds what the machine has (a prediction, so a warning, not a refusal)."""
    plan = convert_job_plan(job, probe=False)
    memory = [p for p in plan.problems if "disk" not in p]  # disk space is artifact.check_free_space's to refuse
    if not memory:
        return None
    return (
        f"warning: this conversion {memory[0]}; it may run out of memory (to fit: "
        f"{' or '.join(plan.advice)}; details: --plan)"
    )


def convert_work(job) -> ConvertWork:
    """What the cost model needs to know about a prepared convert job (quantize/job.py ConvertJob):
    its sizes and precisions, and the method's costs from its registry entry."""
    c = job.recipe.calibration
    method = job.method if not job.has_gqa else None  # a gqa step's float32 model and recovery dominate the cost
    dtype = job.quant_dtype if method is not None else job.compute_dtype
    costs = (
        dict(calibrates=method.calibrates, passes=method.passes, hessians=method.hessians)
        if method is not None
        else dict(gqa=job.has_gqa)
    )
    rec = next((st.gqa.recover for st in job.variant.steps if st.gqa is not None and st.gqa.recover), None)
    auto = job.auto
    if auto is not None:  # auto mixed precision's sensitivity pass (quantize/auto.py)
        layers = decoder_layers(job.skeleton)
        costs.update(
            sensitivity_tokens=auto.windows * auto.seq_len,
            sensitivity_seq_len=auto.seq_len,
            sensitivity_units=len(auto.units),
            sensitivity_schemes=1 + len(auto.choices),
            sensitivity_raised=raisable(layers, Search.of_step(job.quant, job.source_bits, job.cfg).capped(layers)),
        )
    return ConvertWork(
        seq_len=c.seq_len,
        calib_tokens=c.samples * c.seq_len if job.needs_calibration else 0,
        calib_itemsize=4 if dtype == "float32" else 2,
        artifact_bytes=job.artifact_bytes,
        disk_bytes=job.disk_bytes,
        offload_cpu_bytes=job.offload.cpu_bytes if job.offload else None,
        layerwise=method is not None and method.layerwise,
        first_hash=True,
        recover_tokens=rec.tokens if rec else 0,
        recover_max_s=rec.max_minutes * 60 if rec else 0.0,
        **costs,
    )


def plan_eval(model_path: Path, base_path: Path, settings: EvalSettings) -> Plan:
    """`eval --plan`: `eval`'s own checks (evals.runner.prepare_eval: options, device, tokenizers,
    the baseline's identity, every text read and cut into its windows, their overlap with what the
    artifact was fitted on), then the baseline pass and the model's pass over those windows."""

    if not scorer_named(settings.engine).planned:
        planned = ", ".join(name for name, s in SCORERS.items() if s.planned)
        raise DataError(
            f"--plan estimates the {planned} engine; llama.cpp's cost is the GGUF's size (quantkit bench --plan)"
        )
    prep = prepare_eval(model_path, base_path, settings, planning=True)
    seq_len = prep.settings.seq_len
    windows = [len(w.tokens) if w is not None else prep.settings.max_tokens // seq_len for _, _, w, _ in prep.items]
    base, model = read_model(base_path), read_model(model_path)
    plan = eval_plan(
        base,
        model,
        sum(windows) * seq_len,
        seq_len,
        4 if prep.dtype == "float32" else 2,
        this_machine(prep.device),
        model.weight_bytes,
        first_hash=True,
        same=base_path.resolve() == model_path.resolve(),
        exact_kl=prep.exact,
    )
    plan.notes.append(
        "; ".join(
            f"{label}: {n} windows of {seq_len} tokens{' (generated by the baseline)' if w is None else ''}"
            for (label, _, w, _), n in zip(prep.items, windows)
        )
        + "; a cached baseline pass is skipped on later runs"
        if prep.items
        else "no text to score"
    )
    if prep.settings.tasks:
        plan.notes.append("lm-eval tasks are not estimated")
    return plan


def bench_work(sources: list, settings) -> tuple[Model, BenchWork]:
    """Each source's weights as the engine holds them and its decode bytes per token; the cost
    model times the largest model's shape (the others share it in a comparison run)."""

    models, per_token, loaded, refs = [], [], [], []
    for src in sources:
        m, token_bytes, held = _synthetic(src) if isinstance(src, Synthetic) else _bench_checkpoint(src)
        models.append(m)
        per_token.append(token_bytes)
        loaded.append(held)
        refs.append(
            m.params * 4 if settings.self_check and not isinstance(src, Synthetic) else 0
        )  # a float32 reference load
    runs = settings.warmups + settings.repeats
    compile_s = compile_seconds(settings.engine)
    prefill = tuple(forward_flops(m, settings.prompt_len, settings.prompt_len, with_head=True) for m in models)
    shapes = [Shape.from_config(_text_config(src)) for src in sources]
    engine = engine_class(settings.engine)
    return max(models, key=lambda m: m.params), BenchWork(
        settings.prompt_len,
        settings.gen_len,
        runs,
        tuple(per_token),
        tuple(loaded),
        compile_s,
        prefill,
        tuple(refs),
        depths=settings.depths,
        depth_prefill_flops=tuple(tuple(prefill_flops(sh, d) for d in settings.depths) for sh in shapes),
        kv_bytes=tuple(kv_bytes_per_token(sh) for sh in shapes),
        min_seconds=settings.min_seconds,
        ttft_samples=max(SWEEP_SAMPLES, settings.repeats),
        loads=len(settings.flash_attn_runs) * len(settings.kv_cache_runs),
        anchored=engine.anchored,
        twin_prefill_flops=_twin_flops(shapes, settings, engine),
        twin_sizes=len(_twin_sizes(settings, engine)),
        attributes=engine.attributes,
    )


def _twin_sizes(settings, engine) -> tuple[int, ...]:
    """The twin's cache sizes as the bench picks them (bench/twin.twin_depths), the context aside."""
    return twin_depths(engine, list(settings.depths or [settings.prompt_len]), None, settings.gen_len) or (0,)


def _twin_flops(shapes: list[Shape], settings, engine) -> float:
    """The twin's prefills of its cache sizes: attention over each (its widths are tiny)."""
    sh = max(shapes, key=lambda s: s.layers * s.heads * s.head_dim)
    tiny = replace(sh, hidden=TWIN_WIDTH, intermediate=TWIN_WIDTH)
    return sum(prefill_flops(tiny, d) for d in _twin_sizes(settings, engine) if d)


def _text_config(src) -> dict:
    """The config a bench reads a source's shape from (a named shape's, a checkpoint's text part)."""
    if isinstance(src, Synthetic):
        return shape_config(src.shape)
    cfg = read_config(src)
    return cfg.get("text_config", cfg)


# torch.compile per model: the decode graph with its warm-ups (7.5-16 s at 135M-1.2B on 2 CPU cores)
# and the self-check's all-positions graph (25-35 s on inductor's cold cache, 7-27 s warm); a first
# run's cold figure (benchmarks/scale.py)
COMPILE_S = 30.0


def compile_seconds(engine: str) -> float:
    """An engine that compiles (or captures graphs) on its first calls pays COMPILE_S per model."""

    return COMPILE_S if engine_class(engine).compiles else 0.0


def _bench_checkpoint(path: Path) -> tuple[Model, float, int]:
    m = read_model(path)
    quantized = "quantization_config" in read_config(path)
    return m, float(stored_read_bytes(path)), m.weight_bytes if quantized else m.params * 2  # dense models run in bf16


def _synthetic(spec) -> tuple[Model, float, int]:
    cfg = shape_config(spec.shape)
    m = read_model_config(cfg, spec.bits)
    fmt = WeightFormat(spec.bits, spec.group_size if spec.bits < 16 else 0)
    token = weight_bytes_per_token(Shape.from_config(cfg), Layout(linear=fmt))
    return m, token, m.weight_bytes


def read_model_config(cfg: dict, bits: int = 16) -> Model:
    """A Model from a config alone (a named shape): weights at `bits` in the decoder linears."""

    skeleton = meta_model(cfg)
    m = _from_skeleton(cfg, skeleton, 0)
    linear = m.layers * m.layer_linear_params
    return Model(**{**m.__dict__, "weight_bytes": int((m.params - linear) * 2 + linear * bits / 8)})


def plan_bench(sources: list, settings) -> Plan:
    """`bench --plan`: bench's own checks of each model before the probe (bench.runner.precheck:
    context length, memory), then the cost."""
    _bench_prechecks(sources, settings)
    model, work = bench_work(sources, settings)
    plan = bench_plan(model, work, this_machine(settings.device))
    if work.depths:
        twice = ", each loaded twice (--flash-attn both)" if work.loads > 1 else ""
        plan.notes.append(
            f"{len(sources)} model(s), one at a time{twice}; "
            f"at each depth ({', '.join(map(str, work.depths))}) one prefill of the depth, timed again while a "
            f"shallow one's sum to under {work.min_seconds:g} s (the roofline's TTFT at the probed rates), then "
            f"{work.runs} runs of {work.gen_len - 1} decode steps from it"
            + ("; llama-bench prefills each depth once more" if work.anchored else "")
        )
        return plan
    plan.notes.append(
        f"{len(sources)} model(s), one at a time; {work.runs} runs of a {work.prompt_len}-token prefill and "
        f"{work.gen_len} decode steps each, plus the self-check's reference load"
    )
    return plan


def _bench_prechecks(sources: list, settings) -> None:
    """As bench_many: every model failing its checks is bench's one-line refusal; some failing
    are reported failed by the bench, which goes on with the others: the plan stops, naming one."""

    failed = []
    for src in sources:
        try:
            precheck(src, settings)
        except QuantkitError as exc:
            failed.append((src, exc))
    if failed and len(failed) == len(sources):
        raise failed[0][1]
    if failed:
        src, exc = failed[0]
        raise QuantkitError(f"{src} would fail: {exc} (the bench reports it failed and goes on with the others)")
