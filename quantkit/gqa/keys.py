"""Key merging under rotate-half RoPE: per-plane complex compensations that fold into q_proj.

A head's key projection K (d x n, n = inputs + 1 for the bias) is read as p = d/2 complex rows,
u_j = K[j] + i K[j + p], because RoPE multiplies plane j by exp(i pos theta_j). A merged key k~
can stand in for member key k_a in query head h's scores if q_h is multiplied per plane by
conj(c_hj): Re(conj(c) q conj(k~)) = Re(q conj(c k~)), and a complex scalar commutes with the
rotation. So each query head may see the merged key through its own 2x2 rotation-and-scale
per plane, and nothing else. Derivation and measurements: docs/GQA.md.
"""

from __future__ import annotations

import torch


def planes(a: torch.Tensor) -> torch.Tensor:
    """(..., d, n) real rows -> (..., d/2, n) complex planes (rotate-half pairing)."""
    half = a.shape[-2] // 2
    return torch.complex(a[..., :half, :], a[..., half:, :])


def unplanes(z: torch.Tensor) -> torch.Tensor:
    """Inverse of `planes`."""
    return torch.cat([z.real, z.imag], dim=-2)


def plane_major(d: int) -> torch.Tensor:
    """Row order that puts each plane's two rows (j, j + d/2) next to each other."""
    half = d // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], 1).reshape(-1)


def rotscale(c: torch.Tensor) -> torch.Tensor:
    """Complex c (...) -> the 2x2 real matrices [[x, -y], [y, x]] (...,2, 2)."""
    return torch.stack([torch.stack([c.real, -c.imag], -1), torch.stack([c.imag, c.real], -1)], -2)


def plane_energy(a: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """E|z_j|^2 per rotary plane of projection(s) a (..., d, n): (..., d/2)."""
    rows = torch.einsum("...dn,nm,...dm->...d", a, sigma, a)
    half = rows.shape[-1] // 2
    return rows[..., :half] + rows[..., half:]


def fold_query(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """q' with q'_j = conj(c_j) q_j per plane. q (d, n), c (d/2,) complex."""
    return unplanes(c.conj()[:, None] * planes(q))


def merge_keys_mean(k: torch.Tensor, owner: torch.Tensor):
    """Ainslie et al. 2023 mean-pooling: k (r, d, n) -> merged (d, n), c ones (Hg, d/2)."""
    return k.mean(0), torch.ones(len(owner), k.shape[1] // 2, dtype=torch.complex128)


def causal_average(freq: torch.Tensor, context: int) -> torch.Tensor:
    """E exp(i delta freq) over the query-key distances delta of a causal window of `context` tokens."""
    delta = torch.arange(context, dtype=torch.float64)
    weight = (context - delta) / (context - delta).sum()  # context - delta pairs at distance delta
    return (torch.exp(1j * delta * freq.double()[..., None]) * weight).sum(-1)


def merge_keys_rank1(k, energy, owner, sigma, mean, inv_freq, context: int):
    """Per plane the best rank-1 complex fit k_a ~ c_a k~ (the top eigenvector of the
    query-energy-weighted key covariance), the reference calibrated merge.

    Minimises sum_a w_a E|k_a - c_a k~|^2 with w_a the energy of the queries that read head a in
    that plane: with v the top eigenvector of G_ab = sqrt(w_a w_b) E[k_a conj(k_b)],
    k~ = sum_b conj(v_b) sqrt(w_b) k_b and c_a = v_a / sqrt(w_a). The part of the keys' mean that
    RoPE does not turn within `context` adds the same to all of a query's scores (softmax
    ignores it), so it is left out of E (weight |E exp(i delta theta_j)|^2).
    k (r, d, n), energy (Hg, d/2) per query head, owner (Hg,) member of each query head.
    """
    u = planes(k)  # (r, p, n)
    w = torch.zeros(k.shape[0], u.shape[1], dtype=torch.float64).index_add_(0, owner, energy)
    w = (w + 1e-12 * w.mean().clamp_min(1e-300)).sqrt().to(u.dtype)
    cross = torch.einsum("apn,nm,bpm->pab", u, sigma.to(u.dtype), u.conj())
    mu = torch.einsum("apn,n->pa", u, mean.to(u.dtype))
    coherence = causal_average(inv_freq, context).abs().pow(2)
    cross = cross - coherence[:, None, None] * mu[:, :, None] * mu.conj()[:, None, :]
    gram = w.T[:, :, None] * cross * w.T[:, None, :]  # (p, r, r) Hermitian
    v = torch.linalg.eigh(gram)[1][..., -1]  # (p, r)
    merged = torch.einsum("pb,pb,bpn->pn", v.conj(), w.T, u)
    merged, c = normalise((v / w.T).T[owner], merged)
    return unplanes(merged), c


def normalise(c: torch.Tensor, merged: torch.Tensor):
    """Fix the free complex scale per plane: |c| has RMS 1 and sum_h c_h is real positive."""
    total = c.sum(0)
    phase = torch.where(total.abs() > 0, total / total.abs().clamp_min(1e-300), torch.ones_like(total))
    t = phase * c.abs().pow(2).mean(0).sqrt().clamp_min(1e-300)
    return merged * t[:, None], c / t


def rope_averaged(qcov: torch.Tensor, inv_freq: torch.Tensor, context: int):
    """RoPE-averaged query second moments (plane-major rows, (..., d, d)).

    Returns Qbar = E_delta[R(delta) E[q q^T] R(delta)^T] and Qmean = E[R] E[q q^T] E[R]^T. For a
    pair of planes (j, k), the rotation-and-scale part of a 2x2 block turns with
    delta (theta_j - theta_k) and the reflection part with delta (theta_j + theta_k).
    """
    p = inv_freq.shape[0]
    th = inv_freq.double()
    blocks = qcov.reshape(*qcov.shape[:-2], p, 2, p, 2).transpose(-3, -2)  # (..., p, p, 2, 2)
    a = torch.complex((blocks[..., 0, 0] + blocks[..., 1, 1]) / 2, (blocks[..., 1, 0] - blocks[..., 0, 1]) / 2)
    b = torch.complex((blocks[..., 0, 0] - blocks[..., 1, 1]) / 2, (blocks[..., 0, 1] + blocks[..., 1, 0]) / 2)
    a = a * causal_average(th[:, None] - th[None, :], context)
    b = b * causal_average(th[:, None] + th[None, :], context)
    out = torch.stack(
        [torch.stack([a.real + b.real, b.imag - a.imag], -1), torch.stack([a.imag + b.imag, a.real - b.real], -1)], -2
    )
    psi = _blockdiag(rotscale(causal_average(th, context)))
    return out.transpose(-3, -2).reshape(qcov.shape), psi @ qcov @ psi.T


def _blockdiag(blocks: torch.Tensor) -> torch.Tensor:
    """(..., p, 2, 2) -> (..., 2p, 2p) block diagonal."""
    *lead, p, _, _ = blocks.shape
    out = blocks.new_zeros(*lead, p, p, 2, 2)
    idx = torch.arange(p)
    out[..., idx, idx, :, :] = blocks
    return out.transpose(-3, -2).reshape(*lead, 2 * p, 2 * p)


def key_loss(k, qbar, qmean, owner, sigma, mean, merged, c) -> float:
    """sum_h tr(Qbar_h E[e e^T]) - E[e]^T Qmean_h E[e], e = (k_a(h) - C_h k~) x: the spread over
    keys of each query head's logit error, less the part softmax ignores (same for every key)."""
    perm = plane_major(k.shape[1])
    e = unplanes(planes(k)[owner] - c[:, :, None] * planes(merged)[None])[:, perm]  # (Hg, d, n)
    em = e @ mean
    return float(torch.einsum("hxn,nm,hym,hxy->", e, sigma, e, qbar) - torch.einsum("hx,hxy,hy->", em, qmean, em))


_BASIS = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, -1.0], [1.0, 0.0]]], dtype=torch.float64)  # 1 and i


def refine_keys(k, qbar, qmean, owner, sigma, mean, merged0, c0, iters: int = 20):
    """Minimise `key_loss` over k~ and the per-query-head compensations, by alternating exact solves.

    k~ is sought in the span of the member keys, in a basis W with W Sigma W^T = I (L_a: member a
    in that basis, m = W mean). Given the C_h, its coefficients N (k~ = N W) solve
    A N - B N m m^T = R, with A = sum C^T Qbar C and B = sum C^T Qmean C: through u = N m, a
    d x d solve. Given N, each C_h is least squares in its 2p rotation-and-scale parameters.
    Each half-step is exact, so the loss never increases. k (r, d, n); qbar, qmean (Hg, d, d)
    plane-major; merged0 (d, n), c0 (Hg, d/2) a start -> merged (d, n), c (Hg, d/2).
    """
    r, d, _ = k.shape
    p, hg = d // 2, len(owner)
    perm = plane_major(d)
    basis = k[:, perm].reshape(r * d, -1)
    vals, vecs = torch.linalg.eigh(basis @ sigma @ basis.T)
    keep = vals > 1e-12 * vals.max()
    white = (vecs[:, keep] / vals[keep].sqrt()).T @ basis  # (rank, n), white Sigma white^T = I
    lift = (basis @ sigma @ white.T).reshape(r, d, -1)[owner]  # (Hg, d, rank): member keys in that basis
    m = white @ mean
    coef = merged0[perm] @ sigma @ white.T
    qb = qbar.reshape(hg, p, 2, p, 2).transpose(2, 3)  # [h, row block, col block, 2, 2]
    qm = qmean.reshape(hg, p, 2, p, 2).transpose(2, 3)
    theta = torch.stack([c0.real, c0.imag], -1)
    for _ in range(iters):
        cm = _blockdiag(rotscale(torch.complex(theta[..., 0], theta[..., 1])))  # (Hg, d, d)
        ctq, ctm = cm.transpose(1, 2) @ qbar, cm.transpose(1, 2) @ qmean
        a, b = (ctq @ cm).sum(0), (ctm @ cm).sum(0)
        rhs = (ctq @ lift).sum(0) - (ctm @ lift @ m).sum(0)[:, None] * m[None, :]
        a_rhs, a_b = torch.linalg.solve(a, rhs), torch.linalg.solve(a, b)
        u = torch.linalg.solve(torch.eye(d, dtype=a.dtype) - (m @ m) * a_b, a_rhs @ m)
        coef = a_rhs + a_b @ u[:, None] * m[None, :]
        theta = _solve_compensation(qb, qm, coef, lift, m)
    merged = torch.empty(d, basis.shape[1], dtype=basis.dtype)
    merged[perm] = coef @ white
    merged_c, c = normalise(torch.complex(theta[..., 0], theta[..., 1]), planes(merged))
    return unplanes(merged_c), c


def _solve_compensation(qb, qm, coef, lift, m):
    """Given k~ = coef W, each query head's best rotation-and-scale per plane: (Hg, p, 2) [re, im]."""
    hg, p = qb.shape[0], qb.shape[1]
    pb = (coef @ coef.T).reshape(p, 2, p, 2).transpose(1, 2)
    bpb = _BASIS[:, None, None, None] @ pb[None, None] @ _BASIS.transpose(1, 2)[None, :, None, None]  # [b, c, j, k]
    hess = torch.einsum("hkjxy,bcjkyx->hjbkc", qb, bpb)
    x = (lift @ coef.T).reshape(hg, p, 2, p, 2).transpose(2, 3)  # blocks of L_a N^T
    grad = torch.einsum("hkjxy,byz,hkjxz->hjb", qb, _BASIS, x)
    ut = torch.einsum("byz,jz->jyb", _BASIS, (coef @ m).reshape(p, 2))  # columns B_b u_j
    hess = hess - torch.einsum("jxb,hjkxy,kyc->hjbkc", ut, qm, ut)
    grad = grad - torch.einsum("hkx,hkjxy,jyb->hjb", (lift @ m).reshape(hg, p, 2), qm, ut)
    hess = hess.reshape(hg, 2 * p, 2 * p)
    hess = (hess + hess.transpose(1, 2)) / 2
    ridge = 1e-12 * hess.diagonal(dim1=1, dim2=2).abs().mean(-1)[:, None, None] * torch.eye(2 * p, dtype=hess.dtype)
    return torch.linalg.solve(hess + ridge, grad.reshape(hg, 2 * p, 1)).reshape(hg, p, 2)
