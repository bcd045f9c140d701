"""`quantkit convert`: one variant's steps (gqa, quantize) -> a verified, serving-ready artifact."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from quantkit.artifacts.staging import check_free_space, check_out, claim_out, disk_needed, estimate_bytes, guard_out, model_inputs, peak_rss_mb, staged_dir, temp_dir_beside, text_input, tool_versions, write_meta
from quantkit.artifacts.card import write_card
from quantkit.errors import DataError, RecipeError
from quantkit.models.checkpoint import cast_model, checkpoint_hash, load_model, load_tokenizer, read_config, resolve_model
from quantkit.progress import note
from quantkit.recipe.schema import Recipe, Variant
from quantkit.methods import preflight as method_preflight, runtime_meta, transform_step


@dataclass
class ConvertOptions:
    calib: str | None = None
    force: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    max_memory: int | None = None  # bytes of RAM for weights; None: a share of what is available
    inputs: tuple = ()  # (path, what) pairs --out must never be or contain (the recipe files, a run's eval text)
    meta: dict | None = None  # extra keys recorded in quantkit.json (a run's run_key)
    device: str | None = None  # --device: where calibration runs; None: the recipe's calibration.device
    group: object | None = None  # distributed.Group under torchrun: every rank converts, rank 0 alone writes


def pick_variant(recipe: Recipe, name: str | None) -> tuple[Variant, str]:
    variants = recipe.all_variants()
    if name is None:
        if len(variants) != 1:
            names = ", ".join(v.name for v in variants)
            raise RecipeError(f"{recipe.name}: a suite of {len(variants)} variants ({names}); pick one with --variant or use `quantkit run`")
        return variants[0], "steps"
    for i, v in enumerate(variants):
        if v.name == name:
            return v, f"variants[{i}].steps" if recipe.variants else "steps"
    raise RecipeError(f"{recipe.name}: no variant named {name!r}; variants: {', '.join(v.name for v in variants)}")


def preflight(cfg: dict, variant: Variant, key: str, trust_remote_code: bool, src: Path | None = None):
    """Checks on the model's skeleton (meta device, no memory); returns the skeleton."""
    from quantkit.quantize.preflight import check_fused_shards, check_group_sizes, check_overrides_match, check_quantizes_something, meta_model, quantizable_linears

    if not variant.steps:
        raise RecipeError(f"{key}: variant {variant.name!r} has no steps; there is nothing to convert (it is the baseline)")
    skeleton = meta_model(cfg, trust_remote_code, src)
    for i, step in enumerate(variant.steps):
        if step.gqa is not None:
            from quantkit.gqa.convert import preflight_gqa

            preflight_gqa(cfg, step.gqa, f"{key}[{i}].gqa")
            continue
        if step.quantize is not None:
            check_quantizes_something(skeleton, step.quantize, f"{key}[{i}].quantize")
        if step.quantize is not None and step.quantize.method not in ("bnb-nf4", "bnb-int8"):
            linears = quantizable_linears(skeleton, step.quantize.ignore)
            if getattr(step.quantize, "group_size", None) is not None:
                check_group_sizes(linears, step.quantize, f"{key}[{i}].quantize")
            check_overrides_match(linears, step.quantize, f"{key}[{i}].quantize")
            check_fused_shards(skeleton, step.quantize, f"{key}[{i}].quantize")
    return skeleton


def _preflight_recovery(recipe: Recipe, variant: Variant, key: str, src: Path, opts: ConvertOptions) -> None:
    """GQA recovery's text length, checked with the tokenizer alone (before the model is loaded)."""
    for i, step in enumerate(variant.steps):
        if step.gqa is not None and step.gqa.recover is not None:
            from quantkit.gqa.convert import preflight_recovery_text
            from quantkit.quantize.preflight import check_context

            check_context(read_config(src), step.gqa.recover.seq_len, f"{key}[{i}].gqa.recover.seq_len")

            preflight_recovery_text(load_tokenizer(src, opts.trust_remote_code), opts.calib or recipe.calibration.source, step.gqa.recover,
                                    recipe.calibration, f"{key}[{i}].gqa")


def needs_calibration(variant: Variant) -> bool:
    return any((s.gqa is not None and (s.gqa.merge == "calibrated" or s.gqa.recover)) or (s.quantize is not None and s.quantize.calibrated) for s in variant.steps)


def _calibration(recipe: Recipe, opts: ConvertOptions, src: Path, tok, model, src_hash: str, key: str):
    from quantkit.data import calib

    spec = opts.calib or recipe.calibration.source
    if not spec:
        raise DataError(f"{key}: this variant needs calibration text: set calibration.source in the recipe or pass --calib file:PATH (or --calib self)")
    c = recipe.calibration
    cs = calib.build(src, tok, spec, samples=c.samples, seq_len=c.seq_len, seed=c.seed, region=c.region,
                     chat_template=c.chat_template, model=model, model_hash=src_hash)
    from quantkit.data.text import shortfall

    short = shortfall(len(cs.samples), c.samples, c.seq_len, c.region, cs.manifest.get("stream_tokens"))
    if short:  # quantkit.json records both counts (calibration.samples, requested_samples)
        note(f"note: {key}: calibration text {spec}: {short}")
    return cs


@dataclass
class Job:
    """What one conversion works on, resolved before any heavy work."""

    recipe: Recipe
    variant: Variant
    key: str
    src: Path
    cfg: dict
    opts: ConvertOptions
    quant: object | None = None
    handler: object | None = None
    offload: object | None = None  # offload.OffloadPlan when the model does not fit in RAM
    device: object | None = None  # torch.device: where calibration (and the reload check) runs
    skeleton: object | None = None  # the model on the meta device (preflight's), for the plan's shapes

    @property
    def has_gqa(self) -> bool:
        return any(st.gqa is not None for st in self.variant.steps)

    @property
    def export_format(self) -> str:
        return self.handler.export_format if self.handler else "dense"


def check_inputs(recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions) -> None:
    """--out is none of the inputs, nor contains one: the model as named, the calibration text, the recipe files."""
    calib = text_input(opts.calib or recipe.calibration.source, "the calibration text")
    guard_out(out, [*model_inputs(model_ref or recipe.model), *calib, *opts.inputs])  # before the lock file is made


def prepare(recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions, variant_name: str | None,
            planning: bool = False) -> Job:
    """Every check that can fail before loading anything; `--plan` makes the same (`planning`:
    the disk and memory estimates are the plan's to report, and nothing is created)."""
    from quantkit.methods import get_handler
    from quantkit.quantize.preflight import check_context, check_not_inside

    variant, key = pick_variant(recipe, variant_name)
    dev = calibration_device(recipe, opts)  # an unavailable device: one line, before anything loads
    ref = model_ref or recipe.model
    if not ref:
        raise RecipeError(f"{recipe.name}: no model: pass --model or set `model:` in the recipe")
    check_out(out, opts.force)
    src = resolve_model(ref, allow_pickle=opts.allow_pickle)
    guard_out(out, model_inputs(src))  # a named model or a hub snapshot, resolved
    check_not_inside(out, src)
    cfg = read_config(src)
    skeleton = preflight(cfg, variant, key, opts.trust_remote_code, src)
    method_preflight(recipe, variant, key, cfg)  # a method's package, its sample count, a rotation's sizes
    if needs_calibration(variant):  # the text is read (and an hf: source reached) before any model loads
        from quantkit.data.calib import check_source

        check_context(cfg, recipe.calibration.seq_len, "calibration.seq_len")
        check_source(opts.calib or recipe.calibration.source, key)
    _preflight_recovery(recipe, variant, key, src, opts)
    quant = next((s.quantize for s in variant.steps if s.quantize is not None), None)
    job = Job(recipe, variant, key, src, cfg, opts, quant, get_handler(quant.method) if quant is not None else None, device=dev,
              skeleton=skeleton)
    job.offload = _offload_plan(job, sum(p.numel() for p in skeleton.parameters()))
    if not planning:
        check_free_space(out, _disk_needed(job, skeleton))
        _warn_memory(job, skeleton, out)
    return job


def _warn_memory(job: Job, skeleton, out: Path) -> None:
    """Before minute one: warn when the plan's predicted peak exceeds the free memory."""
    from quantkit.plan.plans import memory_warning

    line = memory_warning(job, skeleton, out)
    if line:
        note(line)


def _disk_needed(job: Job, skeleton) -> int:
    """Bytes the artifact (and an offloaded conversion's scratch weights) will take on --out's disk."""
    offloaded = job.offload.model_bytes - job.offload.cpu_bytes if job.offload is not None else 0
    return disk_needed(_artifact_bytes(job, skeleton), max(offloaded, 0))


def _artifact_bytes(job: Job, skeleton) -> int:
    from quantkit.quantize.preflight import quantizable_linears

    q = job.quant
    itemsize = source_dtype(job.cfg).itemsize
    n_params = sum(p.numel() for p in skeleton.parameters())
    linears = quantizable_linears(skeleton, q.ignore) if q is not None else {}
    bits = max([q.weight_bits, *(o.bits for o in getattr(q, "overrides", ()))]) if q is not None else 8 * itemsize
    group = getattr(q, "group_size", -1) if q is not None and q.method != "bnb-nf4" else 64  # NF4: blocks of 64
    return estimate_bytes(n_params, sum(o * i for o, i in linears.values()), sum(o for o, _ in linears.values()), bits, group, itemsize)


def _offload_plan(job: Job, n_params: int):
    """Offload to disk when llm-compressor's model would not fit in the RAM budget at its calibration precision."""
    from quantkit.models import offload

    can_offload = job.handler is not None and job.export_format == "compressed-tensors" and not job.has_gqa
    if not can_offload:
        if job.opts.max_memory is not None:
            raise RecipeError(f"{job.key}: --max-memory applies to the llm-compressor methods (rtn, gptq, awq, w8a8) without a gqa step")
        return None
    src = str(source_dtype(job.cfg)).replace("torch.", "")
    return offload.plan(n_params, quant_dtype(job), src, job.opts.max_memory, offload.available_bytes())


def apply_steps(job: Job, model, tok, calib_set, src_hash: str):
    """Run the variant's steps in order (gqa, then quantize); returns the model and the gqa report."""
    gqa_meta = None
    for step in job.variant.steps:
        if step.gqa is not None:
            from quantkit.gqa.convert import apply_gqa

            note(f"gqa: {job.cfg.get('num_key_value_heads')} -> {step.gqa.kv_heads} KV heads ({step.gqa.merge})")
            spec = job.opts.calib or job.recipe.calibration.source
            model, gqa_meta = apply_gqa(model, tok, step.gqa, calib_set, src=job.src, src_hash=src_hash, calib_spec=spec,
                                        calibration=job.recipe.calibration)
        elif step.quantize is not None:  # a transform step's rotation runs inside the quantize step's pass
            if job.offload is None:  # an offloaded model is loaded at this precision already
                model = cast_model(model, getattr(torch_module(), quant_dtype(job)))
            note(f"quantize: {job.quant.method}")
            model = job.handler.quantize(model, job.quant, calib_set.samples if calib_set else None, src=job.src, device=job.device,
                                         transform=transform_step(job.variant))
    return model, gqa_meta


def convert(recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions, variant_name: str | None = None) -> dict:
    """Every check, load and write under an exclusive lock on --out (artifact.claim_out)."""
    from quantkit.core.distributed import claimed_by_writer, together

    with together("its checks"):  # under torchrun every rank checks, and rank 0 alone reports
        check_inputs(recipe, model_ref, out, opts)
    with claimed_by_writer(opts.group, lambda: claim_out(out)):  # under torchrun rank 0 alone claims and writes --out
        return _convert(recipe, model_ref, out, opts, variant_name)


def _convert(recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions, variant_name: str | None = None) -> dict:
    from quantkit.quantize.verify import check_finite

    from quantkit.core.distributed import check_convert, together

    with together("its checks"):  # every rank checks; all stop if one refuses
        job = prepare(recipe, model_ref, out, opts, variant_name)
        if opts.group is not None:
            check_convert(job)
    t0 = time.perf_counter()
    src_hash = checkpoint_hash(job.src)
    tok = load_tokenizer(job.src, job.opts.trust_remote_code)
    with offload_folder(out, job.offload) as folder:
        model = _load(job, folder)
        check_finite(model, "the source checkpoint")
        calib_set = _calibration(recipe, opts, job.src, tok, model, src_hash, job.key) if needs_calibration(job.variant) else None
        model, gqa_meta = apply_steps(job, model, tok, calib_set, src_hash)
        check_finite(model, "the converted model")
        if job.export_format != "bitsandbytes" and job.offload is None:  # artifacts keep the source precision (scales included)
            model = cast_model(model, source_dtype(job.cfg))
        meta = {"name": job.variant.name, "gqa": gqa_meta, "schema_version": 1, "kind": "quantkit-artifact",
                "base_model": _base_model_name(job.src, job.cfg), "source": {"path": str(job.src), "sha256": src_hash},
                "recipe": resolved_recipe(job), "offload": _offload_meta(job, model), "device": device_meta(job), "runtime": runtime_meta(job.quant),
                "calibration": calib_set.manifest if calib_set else None, "results": {}, **(opts.meta or {}),
                "distributed": opts.group.describe() if opts.group is not None else {"world_size": 1}}
        held = {"model": model}
        del model  # export_verified frees it before reloading the artifact
        if opts.group is not None:  # all ranks save together (llm-compressor compresses in parallel); rank 0 writes
            from quantkit.core.distributed import export_together

            return export_together(job, held, lambda: export_verified(job, held, tok, calib_set, out, meta, t0, folder))
        return export_verified(job, held, tok, calib_set, out, meta, t0, folder)


def _load(job: Job, folder: Path | None):
    p = job.offload
    if p is None:
        note(f"loading {job.src}")
    else:
        note(f"loading {job.src} with offloading: {p.model_bytes / 1e9:.2f} GB of {p.dtype} weights, "
             f"{p.cpu_bytes / 1e9:.2f} GB in RAM, the rest on disk under {folder}")
    if job.opts.group is not None:  # rank 0 loads, the other ranks share its memory
        from quantkit.core.distributed import load_shared

        return load_shared(lambda dev: load_model(job.src, dtype=compute_dtype(job), device=dev, trust_remote_code=job.opts.trust_remote_code))
    return load_model(job.src, dtype=compute_dtype(job), device=load_device(job), trust_remote_code=job.opts.trust_remote_code,
                      offload=p, offload_folder=folder)


def _offload_meta(job: Job, model) -> dict | None:
    if job.offload is None:
        return None
    from quantkit.models.offload import disk_tensors

    p = job.offload
    return {"dtype": p.dtype, "model_bytes": p.model_bytes, "cpu_bytes": p.cpu_bytes, "disk_tensors": disk_tensors(model)}


@contextmanager
def offload_folder(out: Path, plan):
    """A temp folder beside `out` for offloaded weights (None without a plan), always removed
    (one a killed process left is removed by the next command on `out`: artifact.claim_out)."""
    if plan is None:
        yield None
        return
    with temp_dir_beside(out, "offload") as folder:
        yield folder


def resolved_recipe(job: Job) -> dict:
    """The recipe as this artifact was made: the variant's steps, and the calibration (with --calib
    applied) and export settings with every default filled in; the other variants are left out."""
    calibration = job.recipe.calibration.model_dump(mode="json")
    calibration["source"] = job.opts.calib or calibration["source"]
    calibration["device"] = job.opts.device or calibration["device"]  # as asked; quantkit.json's device says what it was
    return {"schema_version": job.recipe.schema_version, "name": job.recipe.name, "variant": job.variant.name,
            "steps": [s.model_dump(mode="json", exclude_none=True) for s in job.variant.steps],
            "calibration": calibration, "export": job.recipe.export.model_dump(mode="json")}


def export_verified(job: Job, held: dict, tok, calib_set, out: Path, meta: dict, t0: float, folder: Path | None = None) -> dict:
    """Save into a temp dir, reload as a user would, compare logits, then move into place.

    `held["model"]` is the caller's only reference to the in-memory model: it is dropped once
    the artifact is saved, so the reload never shares memory with it. An offloaded model's
    artifact reloads with the same offloading."""
    import gc
    from contextlib import ExitStack

    from quantkit.artifacts.formats import FORMATS
    from quantkit.quantize.verify import fixed_tokens, logits, verify_reload

    fmt = FORMATS[job.export_format]
    model = held.pop("model")
    ids = fixed_tokens(model.config.vocab_size, calib_set.samples if calib_set else None)
    ref_logits = logits(model, ids)
    dtype = str(next(p for p in model.parameters() if p.is_floating_point()).dtype).replace("torch.", "")
    with staged_dir(out) as tmp, ExitStack() as stack:
        fmt.save(model, tmp, job.recipe.export.max_shard_size)
        tok.save_pretrained(str(tmp))
        del model
        gc.collect()
        if job.opts.group is not None:  # the other ranks' part ends with the save: rank 0 checks alone
            from quantkit.core.distributed import rank0_alone

            stack.enter_context(rank0_alone())
        if job.offload is not None:
            from quantkit.models import offload

            reload = lambda: offload.onload_to(offload.load(tmp, job.offload, folder / "reload",  # noqa: E731
                                                            trust_remote_code=job.opts.trust_remote_code), job.device)
            loader = f"{fmt.loader} (offloaded as in the conversion)"
        else:
            reload, loader = reload_on_device(job, fmt, tmp, dtype), fmt.loader
        meta["verification"] = verify_reload(ref_logits, reload, ids, loader)
        meta.update({"quantization": fmt.describe(job.quant) if job.quant else None, "tool_versions": tool_versions(),
                     "wall_seconds": time.perf_counter() - t0, "peak_rss_mb": peak_rss_mb()})
        write_card(tmp, meta)
        from quantkit.core.integrity import manifest

        meta["files"] = manifest(tmp)  # every file's sha256 and size, checked by publish
        write_meta(tmp, meta)
    return meta


def calibration_device(recipe: Recipe, opts: ConvertOptions):
    """--device, else the recipe's calibration.device, as a torch.device (device.resolve's errors)."""
    from quantkit.device import resolve

    return resolve(opts.device or recipe.calibration.device)


def load_device(job: Job):
    """Where the source loads: llm-compressor's pipelines keep the model in RAM (or on disk) and
    onload a layer at a time to the calibration device; GQA's statistics and recovery run in
    quantkit's own code on a model already on that device; bitsandbytes reloads it there itself."""
    import torch

    return job.device if job.has_gqa else torch.device("cpu")


def reload_on_device(job: Job, fmt, tmp: Path, dtype: str):
    """The artifact as a user loads it, its forward on the calibration device: bitsandbytes
    quantizes onto the device as it loads; other formats load into RAM and run there a layer at
    a time (offload.onload_to), so the check fits wherever the conversion did."""
    import torch

    from quantkit.models import offload

    if job.handler is not None and job.handler.loads_quantized:
        return lambda: fmt.load(tmp, dtype, job.device, trust_remote_code=job.opts.trust_remote_code)
    return lambda: offload.onload_to(fmt.load(tmp, dtype, torch.device("cpu"), trust_remote_code=job.opts.trust_remote_code), job.device)


def device_meta(job: Job) -> dict:
    """Where the conversion ran (quantkit.json's `device`): the device, its name and the precision."""
    from quantkit.device import describe

    dtype = quant_dtype(job) if job.quant is not None else compute_dtype(job)
    return describe(job.device, getattr(torch_module(), dtype))


def torch_module():
    import torch

    return torch


def quant_dtype(job: Job) -> str:
    """Calibration precision: bf16 forwards are ~3x faster on AMX/AVX512-BF16 cores, but bf16
    rounding of the weights (8 mantissa bits) is comparable to INT8's own error, so 8-bit
    weights calibrate in float32 (measured on the demo: W8 GPTQ dPPL +0.38% in bf16)."""
    if job.offload is not None:
        return job.offload.dtype
    choice = job.recipe.calibration.compute_dtype
    if choice != "auto":
        return choice
    return "float32" if job.quant is not None and job.quant.weight_bits == 8 else "bfloat16"


def compute_dtype(job: Job) -> str:
    """GQA's merge math and recovery run in float32; quantization-only jobs load in quant_dtype."""
    return "float32" if job.has_gqa or job.quant is None else quant_dtype(job)


def source_dtype(cfg: dict):
    import torch

    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    return getattr(torch, name) if name in ("float16", "bfloat16", "float32") else torch.float16


def _base_model_name(src: Path, cfg: dict) -> str:
    import json

    source = src / "quantkit-source.json"
    if source.is_file():
        return json.loads(source.read_text()).get("base_model", str(src))
    meta = src / "quantkit.json"
    if meta.is_file():
        return json.loads(meta.read_text()).get("base_model", str(src))
    name = cfg.get("_name_or_path") or ""
    return name if "/" in name and not name.startswith("/") else str(src)
