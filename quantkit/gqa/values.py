"""Value merging: no RoPE on values, so any d x d map B_a folds into the o_proj columns.

Head a's output through o_proj is W_o^a v_a. With v_a ~ B_a v~, query head h's o_proj columns
become W_o^h B_a, exactly as in a low-rank factorisation.
"""

from __future__ import annotations

import torch


def merge_values_mean(v: torch.Tensor):
    """Mean-pooling: v (r, d, n) -> merged (d, n), compensations identity (r, d, d)."""
    r, d, _ = v.shape
    return v.mean(0), torch.eye(d, dtype=v.dtype).expand(r, d, d).clone()


def sym_pow(s: torch.Tensor, power: float, rel_eps: float = 1e-10) -> torch.Tensor:
    """s^power for a symmetric PSD matrix; eigenvalues below rel_eps * max count as zero."""
    vals, vecs = torch.linalg.eigh((s + s.T) / 2)
    keep = vals > rel_eps * vals.max().clamp_min(1e-300)
    powed = torch.where(keep, vals.clamp_min(1e-300).pow(power), torch.zeros_like(vals))
    return (vecs * powed) @ vecs.T


def merge_values_pca(v: torch.Tensor, metric: torch.Tensor, sigma: torch.Tensor):
    """o_proj-metric PCA: v_a ~ B_a v~ minimising sum_a E||W_o^a (v_a - B_a v~) x||^2.

    With V the stacked member heads (r d, n), S = V Sigma V^T and M = blockdiag(W_o^a^T W_o^a),
    the top d eigenvectors Y of S^1/2 M S^1/2 give v~ = Y^T S^-1/2 V and B = S^1/2 Y: the best
    rank-d fit of the output maps in that metric (exact when the members are one head).
    v (r, d, n), metric (r, d, d), sigma (n, n) -> merged (d, n), B (r, d, d).
    """
    r, d, n = v.shape
    stacked = v.reshape(r * d, n)
    s = stacked @ sigma @ stacked.T
    s_half, s_ihalf = sym_pow(s, 0.5), sym_pow(s, -0.5)
    k = s_half @ torch.block_diag(*metric) @ s_half
    y = torch.linalg.eigh((k + k.T) / 2)[1][:, -d:]
    merged, b = y.T @ s_ihalf @ stacked, (s_half @ y).reshape(r, d, d)
    return balance(merged, b, sigma)


def balance(merged, b, sigma):
    """Use the free d x d gauge to make v~'s rows uncorrelated with the members' mean energy (well scaled in bf16)."""
    target = torch.einsum("adn,nm,adm->", b @ merged, sigma, b @ merged) / (b.shape[0] * merged.shape[0])
    t = sym_pow(merged @ sigma @ merged.T, -0.5) * target.clamp_min(1e-300).sqrt()
    return t @ merged, b @ torch.linalg.pinv(t)


def value_loss(v, metric, sigma, merged, b) -> float:
    """sum_a E||W_o^a (v_a - B_a v~) x||^2: the output error the values cause."""
    err = v - b @ merged[None]
    return float(torch.einsum("adn,nm,aem,ade->", err, sigma, err, metric))


def fold_output(o_cols: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """o_proj columns of one query head (D, d) -> (D, d) @ B."""
    return o_cols @ b
