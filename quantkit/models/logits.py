"""A model's logits on fixed tokens, and how two sets of logits compare (KL, top-1 agreement).

Used where two models must compute the same thing: an artifact reloaded against the model in
memory (quantize/verify.py), a GGUF's weights against its artifact (gguf/fidelity.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from quantkit.models.offload import layer_at_a_time


def fixed_tokens(vocab_size: int, samples=None, n: int = 2, length: int = 64, seed: int = 1234):
    """Real calibration tokens when there are some, else seeded random ids."""

    if samples:
        rows = [s[0, :length] for s in samples[:n] if s.shape[1] >= length]
        if len(rows) == n:
            return torch.stack(rows)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n, length), generator=g)


def logits(model, ids):
    with torch.inference_mode(), layer_at_a_time(model):  # compressed-tensors offload fault: see offload.py
        return model(input_ids=ids.to(model.device), use_cache=False).logits.float().cpu()


def compare_logits(ref, new) -> dict:
    """Per-position KL(ref || new) over the full vocabulary (mean and max) and top-1 agreement.

    `finite` is False when either side holds a NaN or an infinity (`reference_finite` says which)
    or the KL itself is not a number: a comparison that gates a result fails then, since NaN
    compares false with every threshold (`nan > 1e-5` is False)."""

    finite_ref, finite_new = bool(torch.isfinite(ref).all()), bool(torch.isfinite(new).all())
    if not (finite_ref and finite_new):
        return {
            "finite": False,
            "reference_finite": finite_ref,
            "mean_kl": float("inf"),
            "max_kl": float("inf"),
            "top1_agreement": 0.0,
        }
    ref_logp, new_logp = torch.log_softmax(ref, -1), torch.log_softmax(new, -1)
    # sum p_ref (log p_ref - log p_new) per position; KL is never negative, so a negative sum is float
    # rounding (identical weights in another order give -3e-8) and counts as 0, as eval's KL does
    kl = F.kl_div(new_logp, ref_logp, reduction="none", log_target=True).sum(-1).clamp_min(0.0)
    agree = (ref.argmax(-1) == new.argmax(-1)).float().mean()
    mean, worst = float(kl.mean()), float(kl.max())
    return {
        "finite": math.isfinite(mean) and math.isfinite(worst),
        "reference_finite": True,
        "mean_kl": mean,
        "max_kl": worst,
        "top1_agreement": float(agree),
    }
