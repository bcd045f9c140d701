"""`quantkit convert`: one variant's steps (gqa, quantize) -> a verified, serving-ready artifact."""

from __future__ import annotations

import gc
import json
import os
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from quantkit.artifacts.card import write_card
from quantkit.artifacts.containers import CONTAINERS
from quantkit.artifacts.staging import (
    check_free_space,
    claim_out,
    peak_rss_mb,
    staged_dir,
    temp_dir_beside,
    tool_versions,
    write_meta,
)
from quantkit.core.integrity import manifest
from quantkit.data import calib
from quantkit.data.text import shortfall
from quantkit.device import describe
from quantkit.errors import DataError
from quantkit.gqa.gqa_step import apply_gqa
from quantkit.methods.llmc import rotate
from quantkit.methods.method_registry import runtime_meta, transform_step
from quantkit.models import kv_scheme, offload, scheme_facts
from quantkit.models.checkpoint import cast_model, checkpoint_hash, load_model, load_tokenizer
from quantkit.models.logits import fixed_tokens
from quantkit.models.offload import disk_tensors
from quantkit.progress import note
from quantkit.quantize.auto import check_measured, choose_overrides, windows
from quantkit.quantize.job import ConvertJob, ConvertOptions, check_inputs, prepare, source_dtype
from quantkit.quantize.verify import check_finite, logits, verify_reload
from quantkit.recipe.schema import Recipe


def _calibration(job: ConvertJob, tok, model, src_hash: str):
    spec = job.calib_spec
    if not spec:
        raise DataError(
            f"{job.key}: this variant needs calibration text: set calibration.source in the recipe or "
            "pass --calib file:PATH (or --calib self)"
        )
    c = job.recipe.calibration
    cs = calib.build(
        job.src,
        tok,
        spec,
        samples=c.samples,
        seq_len=c.seq_len,
        seed=c.seed,
        region=c.region,
        chat_template=c.chat_template,
        model=model,
        model_hash=src_hash,
    )
    short = shortfall(len(cs.samples), c.samples, c.seq_len, c.region, cs.manifest.get("stream_tokens"))
    if short:  # quantkit.json records both counts (calibration.samples, requested_samples)
        note(f"note: {job.key}: calibration text {spec}: {short}")
    return cs


@dataclass
class StepsDone:
    """What the steps did, for quantkit.json: the gqa report, the quantize step's config as it ran
    (an `auto:` step's chosen overrides filled in), and the mixed precision search's record."""

    quant: object | None
    gqa: dict | None = None
    mixed_precision: dict | None = None


def apply_steps(job: ConvertJob, model, tok, calib_set, src_hash: str):
    """Run the variant's steps in order (gqa, then quantize); returns the model and a StepsDone."""
    done = StepsDone(job.quant)
    transform = transform_step(job.variant)
    for step in job.variant.steps:
        if step.gqa is not None:
            note(f"gqa: {job.cfg.get('num_key_value_heads')} -> {step.gqa.kv_heads} KV heads ({step.gqa.merge})")
            model, done.gqa = apply_gqa(
                model,
                tok,
                step.gqa,
                calib_set,
                src=job.src,
                src_hash=src_hash,
                calib_spec=job.calib_spec,
                calibration=job.recipe.calibration,
            )
        elif (
            step.quantize is not None
        ):  # a transform step's rotation runs inside the quantize step's pass, or before auto's
            if job.offload is None:  # an offloaded model is loaded at this precision already
                model = cast_model(model, getattr(torch_module(), job.quant_dtype))
            if (
                job.auto is not None
            ):  # measured on the weights the rounding will see: after the rotation, before the rounding
                sens = windows(job, tok, model, src_hash)  # from the model as loaded, as the calibration set was
                if transform is not None:
                    note(f"transform: {transform.method} {', '.join(transform.rotations)} fused into the weights")
                    model, transform = rotate(model, transform, job.device), None
                done.quant, done.mixed_precision = choose_overrides(job, model, sens)
            note(f"quantize: {job.quant.method}")
            # under torchrun this rank's part of the windows, llm-compressor made ready for it (Runtime.calibration)
            samples = job.opts.runtime.calibration(calib_set.samples if calib_set else None)
            model = job.method.quantize(
                model,
                done.quant,
                samples,
                src=job.src,
                device=job.device,
                transform=transform,
            )
    return model, done


def convert(
    recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions, variant_name: str | None = None
) -> dict | None:
    """Every check, load and write under an exclusive lock on --out (artifact.claim_out). Returns
    the artifact's quantkit.json (None on the ranks other than 0 of a torchrun conversion)."""

    rt = opts.runtime
    with rt.together("its checks"):  # under torchrun every rank checks, and rank 0 alone reports
        check_inputs(recipe, model_ref, out, opts)
    with rt.claimed(lambda: claim_out(out)):  # under torchrun rank 0 alone claims and writes --out
        return _convert(recipe, model_ref, out, opts, variant_name)


def _convert(
    recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions, variant_name: str | None = None
) -> dict | None:
    with opts.runtime.together("its checks"):  # every rank checks; all stop if one refuses
        job = prepare(recipe, model_ref, out, opts, variant_name)
        check_free_space(out, job.disk_bytes)
        _warn_memory(job)
    t0 = time.perf_counter()
    src_hash = checkpoint_hash(job.src)
    tok = load_tokenizer(job.src, job.opts.trust_remote_code)
    with offload_folder(out, job.offload) as folder:
        model = _load(job, folder)
        check_finite(model, "the source checkpoint")
        calib_set = _calibration(job, tok, model, src_hash) if job.needs_calibration else None
        model, done = apply_steps(job, model, tok, calib_set, src_hash)
        check_finite(model, "the converted model")
        if (
            not (job.method and job.method.loads_quantized) and job.offload is None
        ):  # artifacts keep the source precision (scales included)
            model = cast_model(model, source_dtype(job.cfg))
        meta = {
            "name": job.variant.name,
            "gqa": done.gqa,
            "schema_version": 1,
            "kind": "quantkit-artifact",
            "base_model": _base_model_name(job.src, job.cfg),
            "source": {"path": str(job.src), "sha256": src_hash},
            "recipe": resolved_recipe(job),
            "offload": _offload_meta(job, model),
            "device": device_meta(job),
            "runtime": runtime_meta(job.quant),
            "calibration": calib_set.manifest if calib_set else None,
            "results": {},
            **(opts.meta or {}),
            "distributed": opts.runtime.describe(),
        }
        if done.mixed_precision is not None:
            meta["mixed_precision"] = done.mixed_precision
        held = {"model": model, "quant": done.quant}
        del model  # export_verified frees it before reloading the artifact
        return opts.runtime.export(
            lambda: _save_along(job, held), lambda: export_verified(job, held, tok, calib_set, out, meta, t0, folder)
        )


def _warn_memory(job: ConvertJob) -> None:
    """Before minute one: the plan's warning when its predicted peak exceeds the free memory (a
    prediction, so a warning, not a refusal; `--plan` shows the whole estimate)."""
    line = job.opts.memory_check(job) if job.opts.memory_check is not None else None
    if line:
        note(line)


def _save_along(job: ConvertJob, held: dict) -> None:
    """A rank other than the writer's part in the writer's save: llm-compressor spreads the
    compression over all ranks (compressed-tensors' replace_module_parallel)."""
    model = held.pop("model")
    # llm-compressor's save_pretrained writes on the source rank only (is_source_process); a
    # path nothing can be written under, so a change upstream would fail here rather than write
    CONTAINERS[job.container].save(model, os.devnull, job.recipe.export.max_shard_size)


def _load(job: ConvertJob, folder: Path | None):
    p = job.offload
    if p is None:
        note(f"loading {job.src}")
    else:
        note(
            f"loading {job.src} with offloading: {p.model_bytes / 1e9:.2f} GB of {p.dtype} weights, "
            f"{p.cpu_bytes / 1e9:.2f} GB in RAM, the rest on disk under {folder}"
        )
    return job.opts.runtime.load(  # under torchrun rank 0 loads, the other ranks share its memory
        lambda dev: load_model(
            job.src, dtype=job.compute_dtype, device=dev, trust_remote_code=job.opts.trust_remote_code
        ),
        lambda: load_model(
            job.src,
            dtype=job.compute_dtype,
            device=load_device(job),
            trust_remote_code=job.opts.trust_remote_code,
            offload=p,
            offload_folder=folder,
        ),
    )


def _offload_meta(job: ConvertJob, model) -> dict | None:
    if job.offload is None:
        return None

    p = job.offload
    return {
        "dtype": p.dtype,
        "model_bytes": p.model_bytes,
        "cpu_bytes": p.cpu_bytes,
        "disk_tensors": disk_tensors(model),
    }


@contextmanager
def offload_folder(out: Path, plan):
    """A temp folder beside `out` for offloaded weights (None without a plan), always removed
    (one a killed process left is removed by the next command on `out`: artifact.claim_out)."""
    if plan is None:
        yield None
        return
    with temp_dir_beside(out, "offload") as folder:
        yield folder


def resolved_recipe(job: ConvertJob) -> dict:
    """The recipe as this artifact was made: the variant's steps, and the calibration (with --calib
    applied) and export settings with every default filled in; the other variants are left out."""
    calibration = job.recipe.calibration.model_dump(mode="json")
    calibration["source"] = job.opts.calib or calibration["source"]
    calibration["device"] = (
        job.opts.device or calibration["device"]
    )  # as asked; quantkit.json's device says what it was
    return {
        "schema_version": job.recipe.schema_version,
        "name": job.recipe.name,
        "variant": job.variant.name,
        "steps": [s.model_dump(mode="json", exclude_none=True) for s in job.variant.steps],
        "calibration": calibration,
        "export": job.recipe.export.model_dump(mode="json"),
    }


def export_verified(
    job: ConvertJob, held: dict, tok, calib_set, out: Path, meta: dict, t0: float, folder: Path | None = None
) -> dict:
    """Save into a temp dir, reload as a user would, compare logits, then move into place.

    `held["model"]` is the caller's only reference to the in-memory model: it is dropped once
    the artifact is saved, so the reload never shares memory with it. An offloaded model's
    artifact reloads with the same offloading."""

    container = CONTAINERS[job.container]
    model, quant = held.pop("model"), held.pop("quant", job.quant)
    ids = fixed_tokens(model.config.vocab_size, calib_set.samples if calib_set else None)
    ref_logits = logits(model, ids)
    dtype = str(next(p for p in model.parameters() if p.is_floating_point()).dtype).replace("torch.", "")
    with staged_dir(out) as tmp, ExitStack() as stack:
        container.save(model, tmp, job.recipe.export.max_shard_size)
        tok.save_pretrained(str(tmp))
        if meta.get("mixed_precision") is not None:
            check_measured(meta["mixed_precision"], tmp)
        del model
        gc.collect()
        stack.enter_context(job.opts.runtime.alone())  # under torchrun the others' part ended with the save
        if job.offload is not None:

            def reload():
                return offload.onload_to(
                    offload.load(tmp, job.offload, folder / "reload", trust_remote_code=job.opts.trust_remote_code),
                    job.device,
                )

            loader = f"{container.loader} (offloaded as in the conversion)"
        else:
            reload, loader = reload_on_device(job, container, tmp, dtype), container.loader
        meta["verification"] = verify_reload(ref_logits, reload, ids, loader)
        meta.update(
            {
                # what the saved config.json declares, as facts (models/scheme_facts.py): what decisions read
                "quantization": {
                    **container.describe(quant),
                    "weights": [f.as_dict() for f in scheme_facts.of_checkpoint(tmp)],
                    "kv_cache": kv_facts.as_dict() if (kv_facts := kv_scheme.of_checkpoint(tmp)) else None,
                }
                if quant
                else None,
                "tool_versions": tool_versions(),
                "wall_seconds": time.perf_counter() - t0,
                "peak_rss_mb": peak_rss_mb(),
            }
        )
        write_card(tmp, meta)

        meta["files"] = manifest(tmp)  # every file's sha256 and size, checked by publish
        write_meta(tmp, meta)
    return meta


def load_device(job: ConvertJob):
    """Where the source loads: llm-compressor's pipelines keep the model in RAM (or on disk) and
    onload a layer at a time to the calibration device; GQA's statistics and recovery run in
    quantkit's own code on a model already on that device; bitsandbytes reloads it there itself."""

    return job.device if job.has_gqa else torch.device("cpu")


def reload_on_device(job: ConvertJob, container, tmp: Path, dtype: str):
    """The artifact as a user loads it, its forward on the calibration device: bitsandbytes
    quantizes onto the device as it loads; other formats load into RAM and run there a layer at
    a time (offload.onload_to), so the check fits wherever the conversion did."""

    if job.method is not None and job.method.loads_quantized:
        return lambda: container.load(tmp, dtype, job.device, trust_remote_code=job.opts.trust_remote_code)
    return lambda: offload.onload_to(
        container.load(tmp, dtype, torch.device("cpu"), trust_remote_code=job.opts.trust_remote_code), job.device
    )


def device_meta(job: ConvertJob) -> dict:
    """Where the conversion ran (quantkit.json's `device`): the device, its name and the precision."""

    dtype = job.quant_dtype if job.quant is not None else job.compute_dtype
    why = {"dtype_reason": job.precision.reason} if job.precision is not None else {}
    return {**describe(job.device, getattr(torch_module(), dtype)), **why}


def torch_module():
    return torch


def _base_model_name(src: Path, cfg: dict) -> str:
    source = src / "quantkit-source.json"
    if source.is_file():
        return json.loads(source.read_text()).get("base_model", str(src))
    meta = src / "quantkit.json"
    if meta.is_file():
        return json.loads(meta.read_text()).get("base_model", str(src))
    name = cfg.get("_name_or_path") or ""
    return name if "/" in name and not name.startswith("/") else str(src)
