"""Calibration statistics for the merge, gathered in one pass over the calibration windows.

Per layer: the second moment of the attention input x (with a 1 appended for the biases), and
the second moment of what each query head's attention averages out of the values of all KV
heads, z_h,t = sum_s P_h(t, s) v(x_s), averaged over query heads (in value coordinates).
"""

from __future__ import annotations

import torch


def attention_modules(model, layout) -> list:
    layers = model.get_submodule(layout.layers)
    return [layer.get_submodule(layout.attn) for layer in layers]


def _rope(x, cos, sin):
    """transformers' rotate-half RoPE; x (B, heads, L, d), cos/sin (B, L, d)."""
    half = x.shape[-1] // 2
    return x * cos[:, None] + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin[:, None]


def _attended_values(attn, x, cos, sin, n_heads: int, n_kv: int):
    """For every query head, attention over the concatenated values of all KV heads: (B, H, L, G d)."""
    b, length, _ = x.shape
    q = attn.q_proj(x).view(b, length, n_heads, -1).transpose(1, 2)
    k = attn.k_proj(x).view(b, length, n_kv, -1).transpose(1, 2)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    k = k.repeat_interleave(n_heads // n_kv, dim=1)
    v = attn.v_proj(x)[:, None].expand(b, n_heads, length, -1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling)


def moments(model, layout, samples, *, values: bool, progress=None, bf16: bool = True) -> tuple[list, list | None]:
    """Per layer E[[x,1][x,1]^T] ((n+1)^2) and, with `values`, E[z z^T] ((G d)^2), float64.

    x is what q/k/v_proj read (after the layer's input norm). The forward runs under bf16
    autocast (several times faster on CPU); the sums are float64 over float32 products.
    """
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    attns = attention_modules(model, layout)
    n = attns[0].q_proj.in_features
    dev = attns[0].q_proj.weight.device  # sums accumulate where the model runs; the merge reads them on the CPU
    xs = [torch.zeros(n + 1, n + 1, dtype=torch.float64, device=dev) for _ in attns]
    zs = (
        [torch.zeros(a.v_proj.out_features, a.v_proj.out_features, dtype=torch.float64, device=dev) for a in attns]
        if values
        else None
    )
    count = [0, 0]

    def hook(i):
        def pre(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            z = _attended_values(module, hidden, *kwargs["position_embeddings"], n_heads, n_kv) if values else None
            with torch.autocast(dev.type, enabled=False):  # the sums: float32 products, not bf16
                x = hidden.detach().reshape(-1, n).float()
                x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)
                xs[i].add_((x.T @ x).double())
                if values:
                    z = z.float().reshape(-1, zs[i].shape[0])
                    zs[i].add_((z.T @ z).double())
            if i == 0:
                count[0] += x.shape[0]
                count[1] += x.shape[0] * n_heads

        return pre

    handles = [a.register_forward_pre_hook(hook(i), with_kwargs=True) for i, a in enumerate(attns)]
    try:
        with torch.inference_mode(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            for j, ids in enumerate(samples):
                model(input_ids=ids.to(dev), use_cache=False)
                if progress:
                    progress(j + 1)
    finally:
        for h in handles:
            h.remove()
    return [s.cpu() / max(1, count[0]) for s in xs], ([z.cpu() / max(1, count[1]) for z in zs] if values else None)
