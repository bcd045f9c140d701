"""Value merging: no RoPE on values, so any d x d map B_a folds into the o_proj columns.

Head a's output through o_proj is W_o^a v_a. With v_a ~ B_a v~, query head h's o_proj columns
become W_o^h B_a, exactly as in a low-rank factorisation. The merged value is a combination of
the members' values, v~ = C u with u the stacked member values (r d); everything below works
on C and on S = E[u u^T], the members' value second moment (plain, or as attention averages it).
"""

from __future__ import annotations

import torch


def merge_values_mean(r: int, d: int):
    """Mean-pooling: C = [I/r ... I/r] (d, r d), compensations identity (r, d, d)."""
    eye = torch.eye(d, dtype=torch.float64)
    return torch.cat([eye / r] * r, dim=1), eye.expand(r, d, d).clone()


def sym_pow(s: torch.Tensor, power: float, rel_eps: float = 1e-10) -> torch.Tensor:
    """s^power for a symmetric PSD matrix; eigenvalues below rel_eps * max count as zero."""
    vals, vecs = torch.linalg.eigh((s + s.T) / 2)
    keep = vals > rel_eps * vals.max().clamp_min(1e-300)
    powed = torch.where(keep, vals.clamp_min(1e-300).pow(power), torch.zeros_like(vals))
    return (vecs * powed) @ vecs.T


def merge_values_pca(metric: torch.Tensor, s: torch.Tensor):
    """o_proj-metric PCA: minimise sum_a E||W_o^a (u_a - B_a v~)||^2 over C and B.

    With M = blockdiag(W_o^a^T W_o^a), the top d eigenvectors Y of S^1/2 M S^1/2 give
    C = Y^T S^-1/2 and B = S^1/2 Y: the best rank-d fit of the members' output maps in that
    metric (exact when the members are one head or copies). C is then scaled so that v~ has the
    members' mean energy per dimension (its rows are already uncorrelated under S).
    metric (r, d, d), s (r d, r d) -> C (d, r d), B (r, d, d).
    """
    r, d, _ = metric.shape
    s_half, s_ihalf = sym_pow(s, 0.5), sym_pow(s, -0.5)
    k = s_half @ torch.block_diag(*metric) @ s_half
    y = torch.linalg.eigh((k + k.T) / 2)[1][:, -d:]
    scale = (s.diagonal().sum() / (r * d)).clamp_min(1e-300).sqrt()
    return scale * (y.T @ s_ihalf), (s_half @ y).reshape(r, d, d) / scale


def value_loss(metric, s, coef, b) -> float:
    """sum_a E||W_o^a (u_a - B_a v~)||^2: the output error the values cause."""
    r, d, _ = metric.shape
    err = torch.eye(r * d, dtype=coef.dtype).reshape(r, d, r * d) - b @ coef  # u_a - B_a C u, per member
    return float(torch.einsum("adx,xy,aey,ade->", err, s, err, metric))


def fold_output(o_cols: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """o_proj columns of one query head (D, d) -> (D, d) @ B."""
    return o_cols @ b
