"""The self-check before timing: does the benchmarked model compute what the artifact means?

The bench maps artifacts onto its own low-bit kernels (loader.py); a wrong scale layout, zero
point or packing would still run, and be timed. So before the timed repeats the engine's
next-token log-probabilities (after the timed prompt's prefill, then after each of a few
teacher-forced decode steps: the two timed paths) are compared with a reference: transformers'
own load of the same checkpoint (compressed-tensors decompressed by its library), in float32
where that fits. The KL goes into the JSON; above THRESHOLD no speed is reported.

THRESHOLD: the correct kernels measured mean KL 2.8e-3 (INT8) and 3.9e-3 (INT4) against this
reference on the demo, the same as bf16 incremental decoding of the dense model (2.7e-3): that
is bf16 activation noise. 0.05 is more than 10x that noise, and a wrong layout is far above it
(a flipped group order of the scales measured KL > 1 on the demo); a threshold any lower would
flag bf16 rounding on a longer prompt.
"""

from __future__ import annotations

import gc

import numpy as np
import torch

from quantkit import device as devices
from quantkit.core.roofline import Shape
from quantkit.evals.accuracy_stats import kl_full
from quantkit.models import kv_scheme
from quantkit.models.checkpoint import load_model

THRESHOLD = 0.05
DECODE_STEPS = 8  # teacher-forced decode positions checked after the prefill position


def kl_rows(ref, eng):
    """Per-row KL(reference || engine). Rows where the engine reports every log-probability are
    exact; where it reports some (NaN elsewhere, vLLM's top-k), the unreported tokens form one
    tail bucket on both sides, which by the log-sum inequality gives a lower bound of the exact KL."""

    known = torch.isfinite(eng)
    if bool(known.all()):
        return kl_full(ref, eng)
    p_ref = ref.exp()
    p_eng = torch.where(known, eng.exp(), torch.zeros_like(eng))
    e = torch.where(known, eng, torch.zeros_like(eng))
    head = torch.where(known, p_ref * (ref - e), torch.zeros_like(ref)).sum(-1)
    tiny = torch.finfo(torch.float32).tiny
    rest_ref = (1.0 - torch.where(known, p_ref, torch.zeros_like(p_ref)).sum(-1)).clamp_min(0.0)
    rest_eng = (1.0 - p_eng.sum(-1)).clamp_min(0.0)
    tail = torch.where(
        rest_ref > 1e-7,
        rest_ref * (torch.log(rest_ref + tiny) - torch.log(rest_eng + tiny)),
        torch.zeros_like(rest_ref),
    )
    return (head + tail).clamp_min(0.0)


def compare(ref, eng, threshold: float = THRESHOLD, partial: bool = False) -> dict:
    """Summary of the engine's rows against the reference's; `passed` when mean KL <= threshold.
    `partial`: the engine reports only some tokens per row (NaN for the rest); otherwise any
    NaN or infinity is a broken model."""

    valid = (
        torch.isfinite(eng).all()
        if not partial
        else bool((torch.isfinite(eng).any(-1)).all() and not (eng == float("inf")).any())
    )
    reason = (
        "non-finite reference log-probabilities"
        if not bool(torch.isfinite(ref).all())
        else "non-finite log-probabilities"
        if not bool(valid)
        else None
    )
    if reason is not None:  # NaN compares false with the threshold: never let one through as a pass
        return {
            "status": "failed",
            "passed": False,
            "mean_kl": float("inf"),
            "max_kl": float("inf"),
            "top1_agreement": 0.0,
            "positions": int(ref.shape[0]),
            "threshold": threshold,
            "reason": reason,
        }
    kl = kl_rows(ref, eng).double().numpy()
    top1 = (ref.argmax(-1) == torch.nan_to_num(eng, nan=-float("inf")).argmax(-1)).float().mean()
    passed = bool(np.isfinite(kl).all() and kl.mean() <= threshold)
    return {
        "status": "passed" if passed else "failed",
        "passed": passed,
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "top1_agreement": float(top1),
        "positions": int(len(kl)),
        "threshold": threshold,
        "exact": not partial,
    }


def reference_in_float32(float32_bytes: float, free_bytes: float) -> bool:
    """The reference runs in float32 where that takes under a third of the device's free memory,
    else in bfloat16 (costs/formulas.py's bench plan counts the same)."""
    return 3 * float32_bytes < free_bytes


def reference_dtype(cfg: dict, device) -> str:
    """float32 where the dequantized model fits in a third of the free memory, else bfloat16."""

    params = Shape.from_config(cfg.get("text_config", cfg)).total_params()
    return "float32" if reference_in_float32(params * 4, devices.free_bytes(device)) else "bfloat16"


def reference_logprobs(path, ids: list[int], prompt_len: int, device, cfg: dict, kv_rounding: bool = True):
    """transformers' own load of `path` on `device`: log-probabilities (float32, on the CPU) of the
    next token after ids[:p + 1] for p = prompt_len - 1 .. len(ids) - 1, from one full forward.
    `kv_rounding` False: a checkpoint's FP8 K/V rounding switched off (the engine keeps its own
    cache, so the check compares the weights' arithmetic, which is what it is for)."""

    dtype = reference_dtype(cfg, device)
    model = load_model(path, dtype=dtype, device=device)
    rounded = kv_scheme.set_rounding(model, kv_rounding)
    try:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, prompt_len - 1 :]
        out = torch.log_softmax(logits.float().cpu(), -1)
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out, {
        "reference": f"transformers {__import__('transformers').__version__} load of the checkpoint",
        "reference_dtype": dtype,
        **({"reference_kv_cache": "FP8 K/V rounding on" if kv_rounding else "FP8 K/V rounding off"} if rounded else {}),
    }
