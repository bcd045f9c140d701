"""The prepared convert job: everything decided about a conversion before a weight is loaded.

`prepare` makes every check that can fail without loading the model (the variant, the device,
--out, the source checkpoint, the model's skeleton against the recipe, the method's own checks,
the calibration text, the torchrun and offloading limits) and returns a `ConvertJob` that says
what will run: the method and its registry entry, the precisions, whether it offloads, what the
artifact will weigh. `quantkit convert` runs it (quantize/convert.py); `--plan` costs it
(costs/commands.py) without running it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from huggingface_hub import constants
from huggingface_hub.file_download import repo_folder_name

from quantkit.artifacts.staging import check_out, disk_needed, estimate_bytes, guard_out, model_inputs, text_input
from quantkit.bench.probe import compute_precision
from quantkit.core.distributed import ONE_PROCESS, Runtime
from quantkit.core.precision import Precision
from quantkit.data.calib import check_source
from quantkit.device import resolve_device
from quantkit.errors import QuantkitError, RecipeError
from quantkit.gqa.gqa_step import preflight_gqa, preflight_recovery_text
from quantkit.methods.configs import MethodConfig
from quantkit.methods.method_registry import Method, method_of, names, quantize_step
from quantkit.methods.method_registry import preflight as method_preflight
from quantkit.models import offload
from quantkit.models.checkpoint import load_tokenizer, read_config
from quantkit.models.named_models import NAMED_MODELS, named_model_dir
from quantkit.models.resolve import resolve_path
from quantkit.quantize.auto import Search, check
from quantkit.quantize.preflight import (
    check_context,
    check_fused_shards,
    check_group_sizes,
    check_not_inside,
    check_overrides_match,
    check_quantizes_something,
    check_weights,
    meta_model,
    quantizable_linears,
)
from quantkit.quantize.sensitivity import decoder_layers
from quantkit.recipe.schema import Recipe, Variant


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
    runtime: Runtime = ONE_PROCESS  # a torchrun rank (distributed.Group): every rank converts, rank 0 alone writes
    # (job) -> a warning line or None, said before loading: the plan's memory check (costs.commands.memory_warning),
    # handed in by the commands because the plan is built on top of this module
    memory_check: Callable | None = None


@dataclass(frozen=True)
class ConvertJob:
    """One variant's conversion, resolved: what `convert` runs and `--plan` costs."""

    recipe: Recipe
    variant: Variant
    key: str  # where the variant's steps are in the recipe, for messages (`steps`, `variants[1].steps`)
    src: Path  # the source checkpoint, resolved
    cfg: dict  # its config.json
    out: Path
    opts: ConvertOptions
    device: object  # torch.device: where calibration (and the reload check) runs
    skeleton: object  # the model on the meta device, for the shapes
    quant: MethodConfig | None  # the quantize step's config
    offload: object | None  # models.offload.OffloadPlan when the model does not fit in RAM
    artifact_bytes: int  # the artifact's estimated size
    disk_bytes: int  # what --out's disk must hold: the artifact, headroom, offloaded weights
    # the calibration precision where the recipe leaves it to quantkit (`compute_dtype: auto`, below
    # 8 bits) and why (calib_precision); None where the recipe or the 8-bit rule decides it
    precision: Precision | None = None

    @property
    def method(self) -> Method | None:
        return method_of(self.quant) if self.quant is not None else None

    @property
    def has_gqa(self) -> bool:
        return any(st.gqa is not None for st in self.variant.steps)

    @property
    def container(self) -> str:
        return self.method.container if self.method is not None else "dense"

    @property
    def calib_spec(self) -> str | None:
        return self.opts.calib or self.recipe.calibration.source

    @property
    def needs_calibration(self) -> bool:
        return needs_calibration(self.variant)

    @property
    def auto(self):
        """The quantize step's `auto:` (mixed precision chosen on the model), or None."""
        return getattr(self.quant, "auto", None)

    @property
    def source_bits(self) -> int:
        """Bits of the checkpoint's precision: the artifact's scales and unquantized weights."""
        return 8 * source_dtype(self.cfg).itemsize

    @property
    def quant_dtype(self) -> str:
        return quant_dtype(self.recipe, self.quant, self.offload, self.precision)

    @property
    def compute_dtype(self) -> str:
        """GQA's merge math and recovery run in float32; quantization-only jobs load in quant_dtype."""
        return "float32" if self.has_gqa or self.quant is None else self.quant_dtype

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.skeleton.parameters())


def pick_variant(recipe: Recipe, name: str | None) -> tuple[Variant, str]:
    variants = recipe.all_variants()
    if name is None:
        if len(variants) != 1:
            names_ = ", ".join(v.name for v in variants)
            raise RecipeError(
                f"{recipe.name}: a suite of {len(variants)} variants ({names_}); pick "
                "one with --variant or use `quantkit run`"
            )
        return variants[0], "steps"
    for i, v in enumerate(variants):
        if v.name == name:
            return v, f"variants[{i}].steps" if recipe.variants else "steps"
    raise RecipeError(f"{recipe.name}: no variant named {name!r}; variants: {', '.join(v.name for v in variants)}")


def needs_calibration(variant: Variant) -> bool:
    return any(
        (s.gqa is not None and (s.gqa.merge == "calibrated" or s.gqa.recover))
        or (s.quantize is not None and method_of(s.quantize).calibrates)
        for s in variant.steps
    )


def needs_text(variant: Variant) -> bool:
    """Calibration text is read: for the method or the gqa step, or for an `auto:` step's sensitivity windows."""
    return needs_calibration(variant) or any(getattr(s.quantize, "auto", None) is not None for s in variant.steps)


def check_inputs(recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions) -> None:
    """Every refusal of where --out is, made before the lock file beside it is created (nothing is
    written before them): --out is none of the inputs, nor contains one (the model as named, the
    calibration text, the recipe files), nor lies inside the source checkpoint, and an existing
    --out is one --force may replace. prepare() makes them again under the lock."""
    ref = model_ref or recipe.model
    calib = text_input(opts.calib or recipe.calibration.source, "the calibration text")
    guard_out(out, [*model_inputs(ref), *calib, *opts.inputs])
    for src in source_dirs(ref):
        check_not_inside(out, src)
    check_out(out, opts.force)


def source_dirs(ref: str | None) -> list[Path]:
    """Where a model argument's checkpoint lies, found without pulling or downloading it: the
    directory it names, a named model's directory, a hub id's folder in the Hugging Face cache."""
    if not ref:
        return []
    if ref in NAMED_MODELS:
        return [named_model_dir(ref)]
    path = Path(ref).expanduser()
    if path.exists():
        return [path]
    if ref.count("/") == 1 and not ref.startswith(("/", ".", "~")):
        return [Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref, repo_type="model")]
    return []


def check_skeleton(cfg: dict, variant: Variant, key: str, trust_remote_code: bool, src: Path | None = None):
    """Checks on the model's skeleton (meta device, no memory); returns the skeleton."""

    if not variant.steps:
        raise RecipeError(
            f"{key}: variant {variant.name!r} has no steps; there is nothing to convert (it is the baseline)"
        )
    skeleton = meta_model(cfg, trust_remote_code, src)
    if src is not None:
        check_weights(skeleton, cfg, src)  # what the load would refuse, said by --plan too
    for i, step in enumerate(variant.steps):
        if step.gqa is not None:
            preflight_gqa(cfg, step.gqa, f"{key}[{i}].gqa")
            continue
        if step.quantize is None:
            continue
        where = f"{key}[{i}].quantize"
        check_quantizes_something(skeleton, step.quantize, where)
        if method_of(step.quantize).checks_layers:
            linears = quantizable_linears(skeleton, step.quantize.ignore)
            if getattr(step.quantize, "group_size", None) is not None:
                check_group_sizes(linears, step.quantize, where)
            check_overrides_match(linears, step.quantize, where)
            check_fused_shards(skeleton, step.quantize, where)
        if getattr(step.quantize, "auto", None) is not None:
            check(skeleton, Search.of_step(step.quantize, 8 * source_dtype(cfg).itemsize, cfg), f"{where}.auto")
    return skeleton


def check_recovery(recipe: Recipe, variant: Variant, key: str, src: Path, opts: ConvertOptions) -> None:
    """GQA recovery's text length, checked with the tokenizer alone (before the model is loaded)."""
    for i, step in enumerate(variant.steps):
        if step.gqa is not None and step.gqa.recover is not None:
            check_context(read_config(src), step.gqa.recover.seq_len, f"{key}[{i}].gqa.recover.seq_len")
            preflight_recovery_text(
                load_tokenizer(src, opts.trust_remote_code),
                opts.calib or recipe.calibration.source,
                step.gqa.recover,
                recipe.calibration,
                f"{key}[{i}].gqa",
            )


def calibration_device(recipe: Recipe, opts: ConvertOptions):
    """--device, else the recipe's calibration.device, as a torch.device (device.resolve_device's errors)."""

    return resolve_device(opts.device or recipe.calibration.device)


def prepare(
    recipe: Recipe, model_ref: str | None, out: Path, opts: ConvertOptions, variant_name: str | None = None
) -> ConvertJob:
    """Every check that can fail before loading anything, in the order a user fixes them; nothing
    is created or written (`convert` then claims --out and checks its disk, `--plan` reports it)."""

    variant, key = pick_variant(recipe, variant_name)
    dev = calibration_device(recipe, opts)  # an unavailable device: one line, before anything loads
    ref = model_ref or recipe.model
    if not ref:
        raise RecipeError(f"{recipe.name}: no model: pass --model or set `model:` in the recipe")
    check_out(out, opts.force)
    src = resolve_path(ref, allow_pickle=opts.allow_pickle)
    guard_out(out, model_inputs(src))  # a named model or a hub snapshot, resolved
    check_not_inside(out, src)
    cfg = read_config(src)
    skeleton = check_skeleton(cfg, variant, key, opts.trust_remote_code, src)
    method_preflight(recipe, variant, key, cfg)  # a rotation's sizes, a method's own checks
    if needs_text(variant):  # the text is read (and an hf: source reached) before any model loads
        if needs_calibration(variant):
            check_context(cfg, recipe.calibration.seq_len, "calibration.seq_len")
        auto = getattr(quantize_step(variant), "auto", None)
        if auto is not None:
            check_context(cfg, auto.seq_len, f"{key}: auto.seq_len")
        check_source(opts.calib or recipe.calibration.source, key)
    check_recovery(recipe, variant, key, src, opts)
    quant = quantize_step(variant)
    params = sum(p.numel() for p in skeleton.parameters())
    precision = calib_precision(recipe, quant, dev)
    offload = offload_plan(recipe, variant, key, cfg, quant, opts, params, precision)
    artifact = artifact_bytes(skeleton, cfg, quant)
    offloaded = offload.model_bytes - offload.cpu_bytes if offload is not None else 0
    job = ConvertJob(
        recipe,
        variant,
        key,
        src,
        cfg,
        out,
        opts,
        dev,
        skeleton,
        quant,
        offload,
        artifact,
        disk_needed(artifact, max(offloaded, 0)),
        precision,
    )
    opts.runtime.check_job(lambda: check_torchrun(job))
    return job


def offload_plan(
    recipe: Recipe,
    variant: Variant,
    key: str,
    cfg: dict,
    quant: MethodConfig | None,
    opts: ConvertOptions,
    params: int,
    precision: Precision | None = None,
):
    """Offload to disk when a layer-by-layer method's model would not fit in the
    RAM budget at its calibration precision."""

    has_gqa = any(st.gqa is not None for st in variant.steps)
    if quant is None or not method_of(quant).layerwise or has_gqa:
        if opts.max_memory is not None:
            raise RecipeError(
                f"{key}: --max-memory applies to the llm-compressor methods "
                f"({', '.join(names('layerwise'))}) without a gqa step"
            )
        return None
    src = str(source_dtype(cfg)).replace("torch.", "")
    dtype = quant_dtype(recipe, quant, None, precision)
    p = offload.plan(params, dtype, src, opts.max_memory, offload.available_bytes())
    if p is not None and getattr(quant, "auto", None) is not None:
        raise RecipeError(
            f"{key}.auto: mixed precision runs a forward of the whole model per unit and choice, which a model "
            "offloaded to disk would read from disk each time; convert where the model fits in RAM (without "
            "--max-memory), or run `quantkit sensitivity` there and put the overrides it prints in the recipe"
        )
    return p


def artifact_bytes(skeleton, cfg: dict, quant: MethodConfig | None) -> int:
    """The artifact's size: quantized linears at the widest of their bit widths with a scale per
    group, everything else at the source precision (artifacts.staging.estimate_bytes)."""

    itemsize = source_dtype(cfg).itemsize
    n_params = sum(p.numel() for p in skeleton.parameters())
    linears = quantizable_linears(skeleton, quant.ignore) if quant is not None else {}
    if getattr(quant, "auto", None) is not None:  # the decoder linears within the budget, scales included
        quantized = sum(o * i for o, i in linears.values())
        budget = Search.of_step(quant, 8 * itemsize, cfg).capped(decoder_layers(skeleton)).budget
        return int((n_params - quantized) * itemsize + quantized * budget / 8)
    bits = (
        max([quant.weight_bits, *(o.bits for o in getattr(quant, "overrides", ()))])
        if quant is not None
        else 8 * itemsize
    )
    group = quant.storage_group if quant is not None else -1
    return estimate_bytes(
        n_params, sum(o * i for o, i in linears.values()), sum(o for o, _ in linears.values()), bits, group, itemsize
    )


def quant_dtype(recipe: Recipe, quant: MethodConfig | None, offload, precision: Precision | None = None) -> str:
    """Calibration precision: the recipe's `compute_dtype`; `auto`: float32 for 8-bit weights (bf16
    rounding of the weights, 8 mantissa bits, is comparable to INT8's own error: measured on the
    demo, W8 GPTQ dPPL +0.38% in bf16), else `precision` (calib_precision)."""
    if offload is not None:
        return offload.dtype
    choice = recipe.calibration.compute_dtype
    if choice != "auto":
        return choice
    if quant is not None and quant.weight_bits == 8:
        return "float32"
    return precision.dtype if precision is not None else "float32"


def calib_precision(recipe: Recipe, quant: MethodConfig | None, device) -> Precision | None:
    """The precision of a calibration the recipe leaves to quantkit (`compute_dtype: auto`) below 8
    bits: float32 on the CPU; on a GPU the faster of bf16 and float32 in its probe (core/precision.py).

    On the CPU, float32 is both the fast choice and the reproducible one. Where the CPU has no bf16
    arithmetic, bf16 runs an order of magnitude below float32; where it has, each kind's bf16 kernels
    (AMX tiles, AVX512-BF16 dot products, emulation) round differently, and GPTQ carries those
    differences from layer to layer and into the sampled chat part of the calibration text, so the
    same recipe and seed gave another artifact on each CPU kind. In float32 they agree (docs/RECIPES.md,
    measured with each kind's kernels on one CPU). None: nothing for the rule to decide."""
    if quant is None or recipe.calibration.compute_dtype != "auto" or quant.weight_bits == 8:
        return None
    if device.type == "cpu":
        return Precision("float32", "float32 on the CPU: native on every CPU kind, and the same arithmetic on each")
    return compute_precision(device)


def source_dtype(cfg: dict):
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16")
    return getattr(torch, name) if name in ("float16", "bfloat16", "float32") else torch.float16


def check_torchrun(job: ConvertJob) -> None:
    """What a torchrun conversion supports: the methods whose calibration llm-compressor
    distributes with an artifact equal to one process's. quantkit's own GQA code, bitsandbytes and
    disk offloading run in one process."""
    if job.has_gqa:
        raise QuantkitError(f"{job.key}: a gqa step runs in one process; run this conversion without torchrun")
    if job.method is None or not job.method.torchrun:
        method = job.quant.method if job.quant is not None else "none"
        raise QuantkitError(
            f"{job.key}: method {method!r} does not run under torchrun; those that do: {', '.join(names('torchrun'))}"
        )
    if job.offload is not None:
        raise QuantkitError(
            f"{job.key}: the model does not fit in RAM (--max-memory); disk offloading runs in one process"
        )
    if job.auto is not None:
        raise QuantkitError(
            f"{job.key}: auto mixed precision measures the units in one process; run this conversion without "
            "torchrun, or put the overrides `quantkit sensitivity` prints in the recipe"
        )
    machines = job.opts.runtime.machines
    if machines > 1:
        # compressed-tensors 0.19's DistributedCPUCache shares rank 0's weights through a
        # shared-memory file (`_share_filename_cpu_`) that exists on rank 0's machine only
        raise QuantkitError(
            f"{job.key}: llm-compressor's distributed calibration shares the model through one machine's "
            f"shared memory; run the conversion on one machine (torchrun --nnodes 1, here {machines} nodes)"
        )
