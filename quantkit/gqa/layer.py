"""One attention layer: read its projections per head, merge groups of KV heads, write them back."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.gqa import keys as K
from quantkit.gqa import values as V
from quantkit.gqa.groups import query_order


@dataclass
class Heads:
    """A layer's projections as per-head augmented matrices [W | b] (float64)."""

    q: torch.Tensor  # (H, d, n+1)
    k: torch.Tensor  # (G, d, n+1)
    v: torch.Tensor  # (G, d, n+1)
    o: torch.Tensor  # (H, D, d): the o_proj columns each query head writes through

    @property
    def q_per_kv(self) -> int:
        return self.q.shape[0] // self.k.shape[0]


@dataclass
class Stats:
    """What the calibrated merge knows about a layer's input x: E[[x,1][x,1]^T] and the RoPE."""

    sigma: torch.Tensor  # (n+1, n+1) float64; its last row is E[[x, 1]]
    inv_freq: torch.Tensor | None  # (d/2,) rotary frequencies
    context: int  # tokens per calibration window: the query-key distances the merge averages over
    values: torch.Tensor | None = None  # (G d, G d) E[z z^T] of attention-averaged values (merge_stats.moments)


@dataclass
class Merged:
    k: torch.Tensor  # (d, n+1)
    c: torch.Tensor  # (Hg, d/2) complex: query compensation per query head of the group
    v: torch.Tensor  # (d, n+1)
    b: torch.Tensor  # (Hg, d, d): o_proj compensation per query head of the group


def _aug(lin: torch.nn.Linear, heads: int) -> torch.Tensor:
    w = (
        lin.weight.detach().double().cpu()
    )  # the merge's float64 factorisations run on the CPU, whatever the model's device
    b = lin.bias.detach().double() if lin.bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
    return torch.cat([w, b[:, None]], dim=1).reshape(heads, -1, w.shape[1] + 1)


def read_heads(attn, n_heads: int, n_kv: int) -> Heads:
    o = attn.o_proj.weight.detach().double().cpu()
    d = o.shape[1] // n_heads
    return Heads(
        _aug(attn.q_proj, n_heads),
        _aug(attn.k_proj, n_kv),
        _aug(attn.v_proj, n_kv),
        o.reshape(o.shape[0], n_heads, d).permute(1, 0, 2),
    )


def _members(h: Heads, group):
    """Member KV heads, their query heads (member order) and each query head's member index."""
    qidx = torch.tensor([a * h.q_per_kv + i for a in group for i in range(h.q_per_kv)])
    owner = torch.arange(len(group)).repeat_interleave(h.q_per_kv)
    return torch.tensor(list(group)), qidx, owner


def _value_moment(h: Heads, members, stats: Stats) -> torch.Tensor:
    """S for the members' stacked values: attention-averaged if gathered, else from Sigma."""
    d = h.v.shape[1]
    if stats.values is not None:
        idx = torch.cat([torch.arange(a * d, (a + 1) * d) for a in members.tolist()])
        return stats.values[idx][:, idx]
    stacked = h.v[members].reshape(-1, h.v.shape[2])
    return stacked @ stats.sigma @ stacked.T


def _metric(h: Heads, qidx, r: int) -> torch.Tensor:
    """Per member: sum over its query heads of W_o^h^T W_o^h (r, d, d)."""
    d = h.o.shape[2]
    return torch.einsum("hDd,hDe->hde", h.o[qidx], h.o[qidx]).reshape(r, h.q_per_kv, d, d).sum(1)


def merge_mean(h: Heads, group, stats: Stats | None, iters: int = 0) -> Merged:
    members, qidx, owner = _members(h, group)
    k, c = K.merge_keys_mean(h.k[members], owner)
    coef, b = V.merge_values_mean(len(group), h.v.shape[1])
    return Merged(k, c, coef @ h.v[members].reshape(-1, h.v.shape[2]), b[owner])


def merge_calibrated(h: Heads, group, stats: Stats, iters: int = 100) -> Merged:
    """Keys: rank-1 per plane, then the RoPE-averaged logit objective (keys.refine_keys). Values: o_proj-metric PCA."""
    members, qidx, owner = _members(h, group)
    sigma, mean = stats.sigma, stats.sigma[-1]
    k0, c0 = K.merge_keys_rank1(
        h.k[members], K.plane_energy(h.q[qidx], sigma), owner, sigma, mean, stats.inv_freq, stats.context
    )
    qbar, qmean = _query_moments(h.q[qidx], stats)
    k, c = K.refine_keys(h.k[members], qbar, qmean, owner, sigma, mean, k0, c0, iters)
    coef, b = V.merge_values_pca(_metric(h, qidx, len(group)), _value_moment(h, members, stats))
    return Merged(k, c, coef @ h.v[members].reshape(-1, h.v.shape[2]), b[owner])


MERGES = {"mean": merge_mean, "calibrated": merge_calibrated}


def _query_moments(q, stats: Stats):
    perm = K.plane_major(q.shape[1])
    qp = q[:, perm]
    return K.rope_averaged(qp @ stats.sigma @ qp.transpose(1, 2), stats.inv_freq, stats.context)


def group_loss(h: Heads, group, stats: Stats, kind: str, m: Merged | None = None, iters: int = 5) -> float:
    """Relative logit error of the keys plus relative output error of the values after merging
    `group` (a quick merge with few refinement steps unless the merge `m` is given)."""
    members, qidx, owner = _members(h, group)
    m = m if m is not None else MERGES[kind](h, group, stats, iters=iters)
    sigma, mean = stats.sigma, stats.sigma[-1]
    qbar, qmean = _query_moments(h.q[qidx], stats)
    k_err = K.key_loss(h.k[members], qbar, qmean, owner, sigma, mean, m.k, m.c)
    k_ref = K.key_loss(h.k[members], qbar, qmean, owner, sigma, mean, torch.zeros_like(m.k), m.c)
    stacked = h.v[members].reshape(-1, h.v.shape[2])
    # v~ in member coordinates. Not lstsq: its default CPU driver (gelsy) misjudged the rank of
    # stacked copies of one head and returned a different wrong solution run to run; pinv is exact.
    coef = m.v @ torch.linalg.pinv(stacked, rtol=1e-10)
    metric, s, b = _metric(h, qidx, len(group)), _value_moment(h, members, stats), m.b[:: h.q_per_kv]
    v_err = V.value_loss(metric, s, coef, b)
    v_ref = V.value_loss(metric, s, torch.zeros_like(coef), b)
    return k_err / max(k_ref, 1e-300) + v_err / max(v_ref, 1e-300)


def merged_heads(h: Heads, groups, stats: Stats | None, kind: str) -> tuple[Heads, list[int], float | None]:
    """The layer with each group merged into one KV head, the old query-head order it uses, and
    the summed relative error (None without calibration statistics)."""
    q, o, k, v = [None] * h.q.shape[0], [None] * h.q.shape[0], [], []
    loss = 0.0 if stats is not None else None
    for group in groups:
        m = MERGES[kind](h, group, stats)
        if stats is not None:
            loss += group_loss(h, group, stats, kind, m)
        _, qidx, _ = _members(h, group)
        k.append(m.k)
        v.append(m.v)
        for j, old in enumerate(qidx.tolist()):
            q[old] = K.fold_query(h.q[old], m.c[j])
            o[old] = V.fold_output(h.o[old], m.b[j])
    order = query_order(groups, h.q_per_kv)
    return (
        Heads(torch.stack([q[i] for i in order]), torch.stack(k), torch.stack(v), torch.stack([o[i] for i in order])),
        order,
        loss,
    )


def _linear(a: torch.Tensor, bias: bool, like: torch.nn.Linear) -> torch.nn.Linear:
    """(heads, rows, n+1) augmented -> a Linear with the dtype and device of `like`."""
    a = a.reshape(-1, a.shape[-1])
    lin = torch.nn.Linear(a.shape[1] - 1, a.shape[0], bias=bias, dtype=like.weight.dtype, device=like.weight.device)
    with torch.no_grad():
        lin.weight.copy_(a[:, :-1])
        if bias:
            lin.bias.copy_(a[:, -1])
    return lin


def write_heads(attn, h: Heads, groups, order: list[int], qk_norm: str | None) -> None:
    """Install merged projections: k/v_proj shrink, q_proj rows and o_proj columns follow `order`."""
    n_heads, n_kv, d = h.q.shape[0], h.k.shape[0], h.q.shape[1]
    attn.q_proj = _linear(h.q, attn.q_proj.bias is not None, attn.q_proj)
    attn.k_proj = _linear(h.k, attn.k_proj.bias is not None, attn.k_proj)
    attn.v_proj = _linear(h.v, attn.v_proj.bias is not None, attn.v_proj)
    with torch.no_grad():
        attn.o_proj.weight.copy_(h.o.permute(1, 0, 2).reshape(h.o.shape[1], -1))
        if qk_norm == "all":  # OLMo2: norms over all heads' dims; q's gains follow the heads, k's average per group
            attn.q_norm.weight.copy_(attn.q_norm.weight.reshape(n_heads, d)[torch.tensor(order)].reshape(-1))
            gains = attn.k_norm.weight.detach().reshape(-1, d)
            attn.k_norm.weight = torch.nn.Parameter(
                torch.stack([gains[torch.tensor(g)].mean(0) for g in groups]).reshape(-1)
            )
    attn.num_key_value_groups = n_heads // n_kv
    if hasattr(attn, "num_key_value_heads"):
        attn.num_key_value_heads = n_kv
