"""Attention transfer: before distillation, fit each merged attention layer to its original's output.

Distillation from the logits (recover.py) moves every layer at once and pays a forward and a
backward of the whole model per step. A merged layer can first be fitted on its own: given the
original model's input to layer i, its merged attention should produce what the original
attention produced. That costs one attention block per step, so each layer gets many steps on
windows the teacher has run once — the "attention transfer" stage of LoLCATs (Zhang et al. 2024,
arXiv:2410.10254), here for merged KV heads. The loss is the relative squared error
||y_merged - y_orig||^2 / ||y_orig||^2 per layer; the same projections train as in distillation.
"""

from __future__ import annotations

import math
import time

import torch

from quantkit.progress import bar


def capture(teacher, attns, windows: list, batch_size: int) -> list[list[tuple[dict, torch.Tensor]]]:
    """Per layer, per batch: the attention's keyword inputs (hidden states, positions, mask) and its output."""
    records = [[] for _ in attns]

    def pre(i):
        def hook(module, args, kwargs):
            kw = dict(kwargs)
            if args:
                kw["hidden_states"] = args[0]
            records[i].append([kw, None])

        return hook

    def post(i):
        def hook(module, args, kwargs, out):
            records[i][-1][1] = out[0].detach()

        return hook

    handles = [a.register_forward_pre_hook(pre(i), with_kwargs=True) for i, a in enumerate(attns)]
    handles += [a.register_forward_hook(post(i), with_kwargs=True) for i, a in enumerate(attns)]
    dev = next(teacher.parameters()).device
    try:
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
            for j in range(0, len(windows), batch_size):
                teacher(input_ids=torch.cat(windows[j : j + batch_size]).to(dev), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return [[(kw, y) for kw, y in layer] for layer in records]


def relative_error(attn, kw: dict, target: torch.Tensor) -> torch.Tensor:
    with torch.autocast(target.device.type, dtype=torch.bfloat16):
        y = attn(**kw)[0].float()
    t = target.float()
    return ((y - t) ** 2).sum() / (t**2).sum().clamp_min(1e-12)


def fit_layer(attn, records, params: dict, *, steps: int, lr: float) -> tuple[float, float]:
    """Adam on `params` (trained projection -> learning-rate scale) with cosine decay;
    (error before, after) on all records."""

    def mean_error() -> float:
        with torch.no_grad():
            return sum(float(relative_error(attn, kw, y)) for kw, y in records) / len(records)

    before = mean_error()
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.Adam([{"params": [p], "lr": lr * scale} for p, scale in params.items()])
    base = [g["lr"] for g in opt.param_groups]
    for step in range(steps):
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * 0.5 * (1 + math.cos(math.pi * step / steps))
        kw, y = records[step % len(records)]
        loss = relative_error(attn, kw, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    after = mean_error()
    if after > before:  # never leave a layer worse than the merge left it
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        after = before
    return before, after


def transfer(model, teacher, attn_modules: list, teacher_modules: list, trained: dict, windows: list, cfg) -> dict:
    """Fit every merged layer of `model` (in place) to `teacher`'s attention outputs on `windows`."""
    t0 = time.perf_counter()
    records = capture(teacher, teacher_modules, windows, cfg.batch_size)
    named = dict(model.named_parameters())
    errors = []
    with bar("attention transfer", total=len(attn_modules)) as update:
        for i, (name, attn) in enumerate(attn_modules):
            params = {named[n]: scale for n, scale in trained.items() if n.startswith(f"{name}.")}
            flags = [p.requires_grad for p in model.parameters()]
            for p in model.parameters():
                p.requires_grad_(False)
            for p in params:
                p.requires_grad_(True)
            try:
                errors.append(fit_layer(attn.train(), records[i], params, steps=cfg.transfer_steps, lr=cfg.lr))
            finally:
                for p, f in zip(model.parameters(), flags):
                    p.requires_grad_(f)
            records[i] = None  # free this layer's activations
            update(i + 1)
    return {
        "steps_per_layer": cfg.transfer_steps,
        "windows": len(windows),
        "minutes": round((time.perf_counter() - t0) / 60, 2),
        "relative_error": [[round(b, 5), round(a, 5)] for b, a in errors],
    }
