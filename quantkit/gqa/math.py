"""Pure tensor math for merging KV heads (no modules, no files); float64 throughout.

Notation, one layer: x is the attention input with a constant 1 appended (so biases are an
extra weight column), Sigma = E[x x^T] its second moment over calibration tokens. A head's
projection is a (head_dim x n_in) matrix A, its output A x. Rotate-half RoPE (Llama, Qwen2,
Mistral, ...) rotates dims (j, j + d/2) by angle pos * theta_j: read as one complex number per
plane, z_j = A[j] x + i A[j + d/2] x, RoPE multiplies z_j by exp(i pos theta_j). The score of a
query and a key is sum_j Re(q_j conj(k_j) exp(i (t - s) theta_j)). Derivations: docs/GQA.md.
"""

from __future__ import annotations

import itertools

import torch


def planes(a: torch.Tensor) -> torch.Tensor:
    """(..., d, n) real rows -> (..., d/2, n) complex planes (rotate-half pairing)."""
    half = a.shape[-2] // 2
    return torch.complex(a[..., :half, :], a[..., half:, :])


def unplanes(z: torch.Tensor) -> torch.Tensor:
    """Inverse of `planes`."""
    return torch.cat([z.real, z.imag], dim=-2)


def plane_energy(a: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """E|z_j|^2 per rotary plane of projection(s) a (..., d, n): (..., d/2)."""
    rows = torch.einsum("...dn,nm,...dm->...d", a, sigma, a)
    half = rows.shape[-1] // 2
    return rows[..., :half] + rows[..., half:]


# ---------------------------------------------------------------- keys


def merge_keys_mean(k: torch.Tensor):
    """Ainslie et al. 2023 mean-pooling: k (r, d, n) -> merged (d, n), compensations ones (r, d/2)."""
    r, d, _ = k.shape
    return k.mean(0), torch.ones(r, d // 2, dtype=torch.complex128)


def phase_coherence(inv_freq: torch.Tensor, context: int) -> torch.Tensor:
    """|E exp(i delta theta_j)|^2 over the query-key distances delta of a causal window of `context` tokens.

    Near 1 for planes that barely rotate within the window: there a key error that is the same
    for every key adds the same amount to all of a query's scores, which softmax ignores.
    """
    delta = torch.arange(context, dtype=torch.float64)
    weight = (context - delta) / (context - delta).sum()  # pairs at distance delta in a causal window
    phase = torch.exp(1j * delta[None, :] * inv_freq.double()[:, None])
    return (phase * weight).sum(1).abs().pow(2)


def _key_cross(u, sigma, mean, coherence):
    """E[k_a conj(k_b)] per plane, less the softmax-invariant part of the keys' mean: (p, r, r)."""
    cross = torch.einsum("apn,nm,bpm->pab", u, sigma.to(u.dtype), u.conj())
    if mean is not None:
        mu = torch.einsum("apn,n->pa", u, mean.to(u.dtype))
        cross = cross - coherence[:, None, None] * mu[:, :, None] * mu.conj()[:, None, :]
    return cross


def merge_keys_calibrated(k: torch.Tensor, omega: torch.Tensor, sigma: torch.Tensor, mean=None, coherence=None, eps: float = 1e-12):
    """Per rotary plane, the best rank-1 complex approximation k_a ~ c_a * k_merged.

    Minimises sum_a omega_a E|k_a - c_a k~|^2 (omega_a: energy of the queries that read head a
    in that plane): the top eigenvector v of G_ab = sqrt(omega_a omega_b) E[k_a conj(k_b)]
    gives k~ = sum_b conj(v_b) sqrt(omega_b) k_b and c_a = v_a / sqrt(omega_a). A complex
    scalar per plane commutes with RoPE, so c folds into the queries (`fold_query`).
    k (r, d, n), omega (r, d/2), sigma (n, n) -> merged (d, n), c (r, d/2) complex.
    """
    u = planes(k)  # (r, p, n)
    w = (omega + eps * omega.mean().clamp_min(eps)).sqrt().to(u.dtype)  # (r, p)
    cross = _key_cross(u, sigma, mean, coherence)
    gram = w.T[:, :, None] * cross * w.T[:, None, :]  # (p, r, r) Hermitian
    _, vecs = torch.linalg.eigh(gram)
    v = vecs[..., -1]  # (p, r)
    merged = torch.einsum("pb,pb,bpn->pn", v.conj(), w.T, u)
    merged, c = _normalise((v / w.T).T, merged)
    return unplanes(merged), c


def _normalise(c: torch.Tensor, merged: torch.Tensor):
    """Fix the free complex scale per plane: |c| has RMS 1 and sum_a c_a is real positive."""
    total = c.sum(0)
    phase = torch.where(total.abs() > 0, total / total.abs().clamp_min(1e-300), torch.ones_like(total))
    scale = c.abs().pow(2).mean(0).sqrt().clamp_min(1e-300)
    t = phase * scale  # c_a = t * c'_a, k~' = t * k~
    return merged * t[:, None], c / t


def key_merge(k, omega, sigma, kind: str, mean=None, coherence=None):
    """(merged (d, n), c (r, d/2)) by merge kind."""
    return merge_keys_mean(k) if kind == "mean" else merge_keys_calibrated(k, omega, sigma, mean, coherence)


def fold_query(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """q' with q'_j = conj(c_j) q_j per plane, so Re(q' conj(k~)) = Re(q conj(c k~)). q (d, n), c (d/2,)."""
    return unplanes(c.conj()[:, None] * planes(q))


def key_loss(k, omega, sigma, merged, c, mean=None, coherence=None) -> float:
    """sum_a omega_a E|k_a - c_a k~|^2 summed over planes: the query-weighted score error."""
    err = planes(k) - c[:, :, None] * planes(merged)[None]
    e = torch.diagonal(_key_cross(err, sigma, mean, coherence), dim1=1, dim2=2).real.T  # (r, p)
    return float((omega * e).sum())


# ---------------------------------------------------------------- values


def merge_values_mean(v: torch.Tensor):
    """Mean-pooling: v (r, d, n) -> merged (d, n), compensations identity (r, d, d)."""
    r, d, _ = v.shape
    return v.mean(0), torch.eye(d, dtype=v.dtype).expand(r, d, d).clone()


def _sym_pow(s: torch.Tensor, power: float, rel_eps: float = 1e-10) -> torch.Tensor:
    vals, vecs = torch.linalg.eigh(s)
    floor = rel_eps * vals.max().clamp_min(1e-300)
    keep = vals > floor
    powed = torch.where(keep, vals.clamp_min(floor).pow(power), torch.zeros_like(vals))
    return (vecs * powed) @ vecs.T


def merge_values_calibrated(v: torch.Tensor, metric: torch.Tensor, sigma: torch.Tensor):
    """o_proj-metric PCA: v_a ~ B_a v~ minimising sum_a E||W_o^a (v_a - B_a v~)||^2.

    With V the stacked heads (r d, n), S = V Sigma V^T and M = blockdiag(W_o^a^T W_o^a), the top
    d eigenvectors Y of S^1/2 M S^1/2 give v~ = Y^T S^-1/2 V and B = S^1/2 Y (exact when r = 1).
    v (r, d, n), metric (r, d, d), sigma (n, n) -> merged (d, n), B (r, d, d).
    """
    r, d, n = v.shape
    stacked = v.reshape(r * d, n)
    s = stacked @ sigma @ stacked.T
    s_half, s_ihalf = _sym_pow(s, 0.5), _sym_pow(s, -0.5)
    m = torch.block_diag(*metric)
    k = s_half @ m @ s_half
    _, vecs = torch.linalg.eigh((k + k.T) / 2)
    y = vecs[:, -d:]
    merged = y.T @ s_ihalf @ stacked
    b = (s_half @ y).reshape(r, d, d)
    return _balance(merged, b, sigma)


def _balance(merged, b, sigma):
    """Free d x d gauge: make v~ whitened-orthogonal rows with the mean head's energy (keeps bf16 well scaled)."""
    cov = merged @ sigma @ merged.T
    target = torch.einsum("adn,nm,adm->", b @ merged, sigma, b @ merged) / (b.shape[0] * merged.shape[0])
    t = _sym_pow(cov, -0.5) * target.clamp_min(1e-300).sqrt()
    t_inv = torch.linalg.pinv(t)
    return t @ merged, b @ t_inv


def value_merge(v, metric, sigma, kind: str):
    if kind == "mean":
        return merge_values_mean(v)
    return merge_values_calibrated(v, metric, sigma)


def value_loss(v, metric, sigma, merged, b) -> float:
    """sum_a E||W_o^a (v_a - B_a v~)||^2: the output error the values cause."""
    err = v - b @ merged[None]
    return float(torch.einsum("adn,nm,aem,ade->", err, sigma, err, metric))


def fold_output(o_cols: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """o_proj columns of one query head (D, d) -> (D, d) @ B."""
    return o_cols @ b


# ---------------------------------------------------------------- grouping and accounting


def contiguous_groups(n_kv: int, n_groups: int) -> list[list[int]]:
    size = n_kv // n_groups
    return [list(range(g * size, (g + 1) * size)) for g in range(n_groups)]


def search_groups(n_kv: int, n_groups: int, loss, max_passes: int = 8) -> list[list[int]]:
    """Equal-sized groups by pairwise swaps from the contiguous start (exhaustive when small).

    `loss(group: tuple[int, ...]) -> float`; the total is the sum over groups.
    """
    cache: dict = {}

    def cost(group):
        key = tuple(sorted(group))
        if key not in cache:
            cache[key] = loss(key)
        return cache[key]

    groups = contiguous_groups(n_kv, n_groups)
    for _ in range(max_passes):
        improved = False
        for gi, gj in itertools.combinations(range(n_groups), 2):
            for ai, bj in itertools.product(range(len(groups[gi])), range(len(groups[gj]))):
                a, b = groups[gi][ai], groups[gj][bj]
                new_i = groups[gi][:ai] + [b] + groups[gi][ai + 1 :]
                new_j = groups[gj][:bj] + [a] + groups[gj][bj + 1 :]
                if cost(new_i) + cost(new_j) < cost(groups[gi]) + cost(groups[gj]) - 1e-12:
                    groups[gi], groups[gj] = new_i, new_j
                    improved = True
        if not improved:
            break
    return [sorted(g) for g in sorted(groups, key=min)]


def query_order(groups: list[list[int]], q_per_kv: int) -> list[int]:
    """Old query-head indices in their new order: group by group, each old KV head's queries together."""
    return [a * q_per_kv + i for g in groups for a in g for i in range(q_per_kv)]


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_elem: int = 2) -> int:
    """KV cache bytes per token: K and V, every layer (bf16: 2 bytes per element)."""
    return 2 * layers * kv_heads * head_dim * bytes_per_elem
