"""Narrow workarounds for library faults (most seen on CPU-only machines); each names the upstream fault."""

from __future__ import annotations

import functools
import math
import os

import torch

# Relative gap below which two AWQ grid losses count as equal (the earlier grid point is kept).
# float64 sums of the same bf16 outputs differ across thread counts by ~1e-13 relative; real
# differences between AWQ grid points are orders of magnitude larger (1e-4 .. 1e-1 on the demo).
AWQ_LOSS_RTOL = 1e-9


def llmcompressor_cpu_pin_memory() -> None:
    """llm-compressor 0.14: AWQ crashes on a CPU-only machine.

    Upstream fault: AWQModifier._apply_smoothing (llmcompressor/modifiers/transform/awq/base.py)
    calls IntermediatesCache.pin_memory -> _pin_intermediate (llmcompressor/pipelines/cache.py),
    which calls Tensor.pin_memory(); without an accelerator torch raises "Cannot access
    accelerator device when none is available". Pinning only speeds up host-to-device copies,
    so without an accelerator skipping it changes nothing else. Idempotent.
    """
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory
    if getattr(original, "_quantkit_cpu_patch", False):
        return

    @functools.wraps(original)
    def pin_memory(self, *args, **kwargs):
        if not torch.accelerator.is_available():
            return None
        return original(self, *args, **kwargs)

    pin_memory._quantkit_cpu_patch = True
    IntermediatesCache.pin_memory = pin_memory


def quiet_llmcompressor() -> None:
    """llm-compressor's import replaces every loguru sink with a stdout one at INFO; keep stdout
    for --json. (Setting LLM_COMPRESSOR_LOG_DISABLED would crash GPTQ: its METRIC level would
    never be registered.)"""

    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    os.environ.setdefault("COMPRESSED_TENSORS_LOG_DISABLED", "true")
    from llmcompressor.logger import LoggerConfig, configure_logger

    configure_logger(LoggerConfig(console_log_level=None))


class _TiedLoss(float):
    """An AWQ grid-search loss that is "less than" another only by more than AWQ_LOSS_RTOL.

    AWQModifier._compute_best_scale keeps a grid point when `loss < best_error` and otherwise the
    earlier one; with this comparison a near-tie keeps the earlier grid point (smaller ratio,
    closer to no scaling) whatever the reduction order. Arithmetic and formatting stay float's."""

    def __lt__(self, other):
        o = float(other)
        if not math.isfinite(o):  # the search starts from best_error = inf
            return float(self) < o
        return float(self) < o - AWQ_LOSS_RTOL * abs(o)


def awq_loss_float64(self, fp16_outputs, int_w_outputs) -> float:
    """AWQModifier._compute_loss, accumulated in float64 and compared with a tie tolerance.

    Upstream fault (llm-compressor 0.14, llmcompressor/modifiers/transform/awq/base.py,
    AWQModifier._compute_loss): each batch's loss is `mse_loss(fp16_batch, int_w_batch,
    reduction="sum")` on the bf16 outputs, so the sum is rounded to bf16 (8 mantissa bits,
    0.4%) and its rounding depends on how the reduction is split across threads. Grid points
    whose losses differ by less than that tie or swap at random, and since each layer
    calibrates on the output of the layers before it, the choice compounds: the same recipe gave
    +10.6% PPL with two threads and +16.9% with one on the demo. An
    upcast was proposed upstream (vllm-project/llm-compressor PR #1557, closed unmerged); no
    report of the thread dependence was found. The bf16 forward outputs themselves do not depend
    on the thread count (checked on this CPU), so summing them in float64 makes the losses and
    therefore the choices the same at any thread count.
    """
    from llmcompressor.core import active_session
    from llmcompressor.modifiers.transform.awq import base as awq_base

    session = active_session()
    loss_masks = session.state.loss_masks if session.state else None
    device = fp16_outputs[0].device
    loss = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    for i, (ref, out) in enumerate(zip(fp16_outputs, int_w_outputs)):
        ref, out = ref.to(torch.float64), out.to(device=device, dtype=torch.float64)
        mask = loss_masks[i] if loss_masks else None
        if mask is not None:
            keep = mask.to(device) == 1  # (batch, seq): tokens that count
            ref, out = ref[keep], out[keep]
        loss += (ref - out).square().sum()
        count += ref.numel()
    if awq_base.is_distributed():
        loss, count = awq_base._allreduce_data_sum([loss, count])
    return _TiedLoss((loss / count).item())


def llmcompressor_awq_float64_loss() -> None:
    """Install awq_loss_float64 as AWQModifier._compute_loss. Idempotent."""
    from llmcompressor.modifiers.transform.awq.base import AWQModifier

    if getattr(AWQModifier._compute_loss, "_quantkit_patch", False):
        return
    awq_loss_float64._quantkit_patch = True
    AWQModifier._compute_loss = awq_loss_float64


def llmcompressor_spinquant_keep_embeddings() -> None:
    """llm-compressor 0.14: SpinQuantModifier changes what an RMSNorm model computes before any rounding.

    Upstream fault: SpinQuantModifier.on_start (llmcompressor/modifiers/transform/spinquant/base.py)
    calls _center_embeddings, which subtracts each embedding row's mean (llmcompressor/modeling/fuse.py,
    center_embeddings, kept from the SpinQuant authors' code: facebookresearch/SpinQuant#14). That is
    exact only under LayerNorm, which subtracts the mean itself; under RMSNorm (every architecture
    rotation.SPINQUANT_ARCHITECTURES allows) it changes each layer's input. On the demo model the
    rotated, unquantized model is KL 0.0012 from the source on real text (top-1 98.4%); without the
    centering, 1e-11. R1 is orthogonal and needs no centering, so the step is skipped. Idempotent.
    """
    from llmcompressor.modifiers.transform.spinquant.base import SpinQuantModifier

    if getattr(SpinQuantModifier._center_embeddings, "_quantkit_patch", False):
        return

    def _center_embeddings(self, model) -> None:
        return None

    _center_embeddings._quantkit_patch = True
    SpinQuantModifier._center_embeddings = _center_embeddings
