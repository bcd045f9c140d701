"""The GQA step's wiring: checks before any work, then merge (and recover) a loaded model."""

from __future__ import annotations

import copy
import time

from ..errors import RecipeError
from ..progress import bar, note
from . import math as gm
from .arch import head_counts, layout_for
from .layer import group_loss, kv_weights, merged_heads, read_heads, write_heads
from .stats import attention_modules, input_moments


def preflight_gqa(cfg: dict, gqa, key: str) -> None:
    """One clear line, before loading anything, for a request the step cannot honour."""
    model_type = cfg.get("model_type", "?")
    layout = layout_for(model_type, key)  # GPT-2/OPT-style MHA and other layouts stop here
    heads, kv, _ = head_counts(cfg)
    if heads % gqa.kv_heads:
        raise RecipeError(f"{key}.kv_heads: {gqa.kv_heads} does not divide the {heads} query heads of this model")
    if gqa.kv_heads >= kv:
        raise RecipeError(f"{key}.kv_heads: {gqa.kv_heads} is not below the model's {kv} KV heads")
    if kv % gqa.kv_heads:
        raise RecipeError(f"{key}.kv_heads: {gqa.kv_heads} does not divide the model's {kv} KV heads (groups merge whole KV heads)")
    if layout.qk_norm and gqa.merge != "mean":
        raise RecipeError(
            f"{key}.merge: {model_type} normalises q and k per head after the projection, which undoes a folded "
            "compensation; use merge: mean (recover may follow)"
        )


def plan_groups(h, n_groups: int, sigma, grouping: str, kind: str) -> list[list[int]]:
    if grouping == "contiguous" or n_groups == 1:
        return gm.contiguous_groups(h.k.shape[0], n_groups)
    energy, metric = kv_weights(h, sigma)
    return gm.search_groups(h.k.shape[0], n_groups, lambda g: group_loss(h, g, energy, metric, sigma, kind))


def merge_model(model, layout, kv_heads: int, grouping: str, kind: str, sigmas) -> list[dict]:
    """Merge every layer in place; returns per-layer {groups, loss_before_search...}."""
    import torch

    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    n_in = attention_modules(model, layout)[0].q_proj.in_features
    report = []
    for i, attn in enumerate(attention_modules(model, layout)):
        sigma = sigmas[i] if sigmas is not None else torch.eye(n_in + 1, dtype=torch.float64)
        h = read_heads(attn, n_heads, n_kv)
        groups = plan_groups(h, kv_heads, sigma, grouping, kind)
        energy, metric = kv_weights(h, sigma)
        loss = sum(group_loss(h, g, energy, metric, sigma, kind) for g in groups)
        new, order = merged_heads(h, groups, sigma, kind)
        write_heads(attn, new, groups, order, layout.qk_norm)
        report.append({"groups": groups, "relative_error": loss})
    cfg.num_key_value_heads = kv_heads
    return report
