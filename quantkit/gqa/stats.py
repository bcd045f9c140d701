"""Calibration statistics for the merge: the second moment of each layer's attention input."""

from __future__ import annotations

import torch


def attention_modules(model, layout) -> list:
    layers = model.get_submodule(layout.layers)
    return [layer.get_submodule(layout.attn) for layer in layers]


def input_moments(model, layout, samples, progress=None, bf16: bool = True) -> list[torch.Tensor]:
    """Per layer E[x x^T] of the attention input x with a 1 appended (float64, (n+1, n+1)).

    x is what q/k/v_proj read (after the layer's input norm); the 1 carries the biases. The
    forward runs under bf16 autocast by default (several times faster on CPU; the moments are
    averages over thousands of tokens, see docs/GQA.md for the effect on the merge).
    """
    attns = attention_modules(model, layout)
    n = attns[0].q_proj.in_features
    sums = [torch.zeros(n + 1, n + 1, dtype=torch.float64) for _ in attns]
    count = [0]

    def hook(i):
        def pre(_module, args):
            x = args[0].detach().reshape(-1, n).float()
            x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)
            sums[i].add_((x.T @ x).double())  # one window in float32, accumulated in float64
            if i == 0:
                count[0] += x.shape[0]

        return pre

    handles = [a.q_proj.register_forward_pre_hook(hook(i)) for i, a in enumerate(attns)]
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for j, ids in enumerate(samples):
                model(input_ids=ids.to(model.device), use_cache=False)
                if progress:
                    progress(j + 1)
    finally:
        for h in handles:
            h.remove()
    return [s / max(1, count[0]) for s in sums]
