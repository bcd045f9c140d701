"""Apply a merge to one attention module: read its projections, call gqa.math, write them back."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import math as gm


@dataclass
class Heads:
    """One layer's projections as per-head augmented matrices [W | b] (float64)."""

    q: torch.Tensor  # (H, d, n+1)
    k: torch.Tensor  # (G, d, n+1)
    v: torch.Tensor  # (G, d, n+1)
    o: torch.Tensor  # (H, D, d): the o_proj columns each query head writes through

    @property
    def q_per_kv(self) -> int:
        return self.q.shape[0] // self.k.shape[0]


def _aug(lin: torch.nn.Linear, heads: int) -> torch.Tensor:
    w = lin.weight.detach().double()
    b = lin.bias.detach().double() if lin.bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
    return torch.cat([w, b[:, None]], dim=1).reshape(heads, -1, w.shape[1] + 1)


def read_heads(attn, n_heads: int, n_kv: int) -> Heads:
    o = attn.o_proj.weight.detach().double()
    d = o.shape[1] // n_heads
    return Heads(_aug(attn.q_proj, n_heads), _aug(attn.k_proj, n_kv), _aug(attn.v_proj, n_kv),
                 o.reshape(o.shape[0], n_heads, d).permute(1, 0, 2))


def kv_weights(h: Heads, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per old KV head: its queries' energy per plane (G, d/2) and o_proj metric sum_h W_o^h^T W_o^h (G, d, d)."""
    g, d = h.k.shape[0], h.o.shape[2]
    energy = gm.plane_energy(h.q, sigma).reshape(g, h.q_per_kv, -1).sum(1)
    metric = torch.einsum("hDd,hDe->hde", h.o, h.o).reshape(g, h.q_per_kv, d, d).sum(1)
    return energy, metric


def merge_group(h: Heads, group, energy, metric, sigma, kind: str):
    """Merged K and V rows (d, n+1) and per-member compensations c (r, d/2), B (r, d, d)."""
    idx = torch.tensor(list(group))
    k, c = gm.key_merge(h.k[idx], energy[idx], sigma, kind)
    v, b = gm.value_merge(h.v[idx], metric[idx], sigma, kind)
    return k, c, v, b


def group_loss(h: Heads, group, energy, metric, sigma, kind: str) -> float:
    """Relative key (score) error plus relative value (output) error of merging `group`."""
    idx = torch.tensor(list(group))
    k, c, v, b = merge_group(h, group, energy, metric, sigma, kind)
    eye = torch.eye(v.shape[0], dtype=v.dtype).expand_as(b)
    k_ref = gm.key_loss(h.k[idx], energy[idx], sigma, torch.zeros_like(k), torch.zeros_like(c))
    v_ref = gm.value_loss(h.v[idx], metric[idx], sigma, torch.zeros_like(v), eye)
    k_err = gm.key_loss(h.k[idx], energy[idx], sigma, k, c)
    v_err = gm.value_loss(h.v[idx], metric[idx], sigma, v, b)
    return k_err / max(k_ref, 1e-300) + v_err / max(v_ref, 1e-300)


def merged_heads(h: Heads, groups, sigma, kind: str) -> tuple[Heads, list[int]]:
    """The layer after merging each group into one KV head; returns the new heads and the query order."""
    energy, metric = kv_weights(h, sigma)
    q, o, k, v = [None] * h.q.shape[0], [None] * h.q.shape[0], [], []
    order = gm.query_order(groups, h.q_per_kv)
    for group in groups:
        gk, gc, gv, gb = merge_group(h, group, energy, metric, sigma, kind)
        k.append(gk)
        v.append(gv)
        for member, a in enumerate(group):
            for i in range(h.q_per_kv):
                old = a * h.q_per_kv + i
                q[old] = gm.fold_query(h.q[old], gc[member])
                o[old] = gm.fold_output(h.o[old], gb[member])
    return Heads(torch.stack([q[i] for i in order]), torch.stack(k), torch.stack(v), torch.stack([o[i] for i in order])), order


def _linear(a: torch.Tensor, bias: bool, like: torch.nn.Linear) -> torch.nn.Linear:
    """(heads, rows, n+1) augmented -> a Linear with the same dtype/device as `like`."""
    a = a.reshape(-1, a.shape[-1])
    lin = torch.nn.Linear(a.shape[1] - 1, a.shape[0], bias=bias, dtype=like.weight.dtype, device=like.weight.device)
    with torch.no_grad():
        lin.weight.copy_(a[:, :-1])
        if bias:
            lin.bias.copy_(a[:, -1])
    return lin


def write_heads(attn, h: Heads, groups, order: list[int], qk_norm: str | None) -> None:
    """Install merged projections in `attn` (k/v_proj shrink, q_proj rows and o_proj columns permuted)."""
    n_heads, n_kv = h.q.shape[0], h.k.shape[0]
    attn.q_proj = _linear(h.q, attn.q_proj.bias is not None, attn.q_proj)
    attn.k_proj = _linear(h.k, attn.k_proj.bias is not None, attn.k_proj)
    attn.v_proj = _linear(h.v, attn.v_proj.bias is not None, attn.v_proj)
    with torch.no_grad():
        attn.o_proj.weight.copy_(h.o.permute(1, 0, 2).reshape(h.o.shape[1], -1))
    if qk_norm == "all":  # OLMo2: the norms span all heads; permute q's gains, average k's per group
        d = h.q.shape[1]
        with torch.no_grad():
            gq = attn.q_norm.weight.detach().reshape(n_heads, d)[torch.tensor(order)]
            attn.q_norm.weight.copy_(gq.reshape(-1))
        gk = attn.k_norm.weight.detach().reshape(-1, d)
        merged = torch.stack([gk[torch.tensor(g)].mean(0) for g in groups]).reshape(-1)
        attn.k_norm.weight = torch.nn.Parameter(merged.clone())
    attn.num_key_value_groups = n_heads // n_kv
    if hasattr(attn, "num_key_value_heads"):
        attn.num_key_value_heads = n_kv
