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


def rotation_average(inv_freq: torch.Tensor, context: int) -> torch.Tensor:
    """E exp(2 i delta theta_j) over causal pairs: how a 2x2 query covariance's anisotropy survives RoPE."""
    delta = torch.arange(context, dtype=torch.float64)
    weight = (context - delta) / (context - delta).sum()
    return (torch.exp(2j * delta[None, :] * inv_freq.double()[:, None]) * weight).sum(1)


def plane_cov(a: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """2x2 second moment of each rotary plane of projection(s) a (..., d, n): (..., d/2, 2, 2)."""
    half = a.shape[-2] // 2
    pa = torch.stack([a[..., :half, :], a[..., half:, :]], dim=-2)  # (..., p, 2, n)
    return pa @ sigma @ pa.transpose(-1, -2)


def averaged_query_cov(qcov: torch.Tensor, rot2: torch.Tensor) -> torch.Tensor:
    """E_delta R qcov R^T: the isotropic part stays, the anisotropic part turns by 2 delta theta_j.

    qcov (..., p, 2, 2), rot2 (p,) complex from `rotation_average`.
    """
    iso = (qcov[..., 0, 0] + qcov[..., 1, 1]) / 2
    z = torch.complex((qcov[..., 0, 0] - qcov[..., 1, 1]) / 2, qcov[..., 0, 1]) * rot2
    out = torch.empty_like(qcov)
    out[..., 0, 0], out[..., 1, 1] = iso + z.real, iso - z.real
    out[..., 0, 1] = out[..., 1, 0] = z.imag
    return out


def _rotscale(c: torch.Tensor) -> torch.Tensor:
    """Complex c (...) -> its 2x2 real matrix [[x, -y], [y, x]]."""
    return torch.stack([torch.stack([c.real, -c.imag], -1), torch.stack([c.imag, c.real], -1)], -2)


def refine_keys(k, qbar, owner, sigma, mean, coherence, c0, merged0, iters: int = 30):
    """Alternating least squares for sum_h tr(Qbar_h E[e_h e_h^T]), e_h = k_a(h) - C_h k~ per plane.

    Qbar_h is query head h's RoPE-averaged 2x2 covariance (anisotropic in slow planes), C_h a
    per-query-head rotation-and-scale (so it still folds into q_proj exactly). Given the C_h, k~
    is a 2x2-weighted average of the member keys; given k~, each C_h is a 2-parameter least
    squares. k (r, d, n), qbar (Hg, p, 2, 2), owner (Hg,) member index of each query head,
    c0 (r, p) and merged0 (d, n) the isotropic solution -> merged (d, n), c (Hg, p).
    """
    r, d, n = k.shape
    p = d // 2
    kp = torch.stack([k[:, :p], k[:, p:]], dim=2)  # (r, p, 2, n)
    sig_j = sigma[None] - coherence[:, None, None] * (mean[:, None] * mean[None, :])[None] if mean is not None else sigma[None]
    gram = torch.einsum("apxn,pnm,bpym->pabxy", kp, sig_j, kp)  # (p, r, r, 2, 2)
    # k~ = sum_a M_a k_a; initial M from the isotropic merge: merged0 = sum_a m_a k_a (least squares in key space)
    coef = torch.linalg.lstsq(planes(k).permute(1, 2, 0), planes(merged0)[:, :, None]).solution[..., 0]  # (p, r)
    m = _rotscale(coef)  # (p, r, 2, 2)
    cmat = _rotscale(c0[owner].T)  # (p, Hg, 2, 2)
    qb = qbar.transpose(0, 1)  # (p, Hg, 2, 2)
    basis = torch.stack([torch.eye(2, dtype=k.dtype), torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=k.dtype)])
    onehot = torch.nn.functional.one_hot(owner, r).to(k.dtype)  # (Hg, r)
    for _ in range(iters):
        ctq = cmat.transpose(-1, -2) @ qb  # (p, Hg, 2, 2)
        lhs = (ctq @ cmat).sum(1)  # (p, 2, 2)
        rhs = torch.einsum("ha,phxy->paxy", onehot, ctq)  # (p, r, 2, 2)
        m = torch.linalg.solve(lhs[:, None], rhs)
        pm = torch.einsum("paxy,pabyz,pbwz->pxw", m, gram, m)  # k~ Sigma k~^T (p, 2, 2)
        x = torch.einsum("ha,pabxy,pbzy->phxz", onehot, gram, m)  # k_a Sigma k~^T (p, Hg, 2, 2)
        h_mat = torch.einsum("phxy,myz,pzw,nxw->phmn", qb, basis, pm, basis)
        h_mat = (h_mat + h_mat.transpose(-1, -2)) / 2
        g = torch.einsum("phxy,myz,phxz->phm", qb, basis, x)  # tr(Qbar E_m X^T), Qbar symmetric
        theta = torch.linalg.solve(h_mat + 1e-12 * torch.eye(2, dtype=k.dtype), g[..., None])[..., 0]
        cmat = _rotscale(torch.complex(theta[..., 0], theta[..., 1]))
    merged = torch.einsum("paxy,apyn->pxn", m, kp)
    c = torch.complex(cmat[..., 0, 0], cmat[..., 1, 0]).T  # (Hg, p)
    merged_c, c = _normalise(c, torch.complex(merged[:, 0], merged[:, 1]))
    return unplanes(merged_c), c


def key_loss_2x2(k, qbar, owner, sigma, merged, c, mean=None, coherence=None) -> float:
    """sum_h tr(Qbar_h E[e_h e_h^T]) over planes, e_h = k_a(h) - C_h k~ (the objective of `refine_keys`)."""
    err = planes(k)[owner] - c[:, :, None] * planes(merged)[None]  # (Hg, p, n)
    e2 = torch.stack([err.real, err.imag], dim=2)  # (Hg, p, 2, n)
    cov = e2 @ sigma @ e2.transpose(-1, -2)
    if mean is not None:
        em = e2 @ mean
        cov = cov - coherence[None, :, None, None] * em[..., :, None] * em[..., None, :]
    return float((qbar * cov).sum())


def plane_major(d: int) -> torch.Tensor:
    """Row order that puts each rotary plane's two rows (j, j + d/2) next to each other."""
    half = d // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], 1).reshape(-1)


def rope_averaged(qcov: torch.Tensor, inv_freq: torch.Tensor, context: int):
    """RoPE-averaged query second moments, for the logit error of keys (plane-major, (..., d, d)).

    Returns (Qbar, Qmean): Qbar = E_delta[R(delta) E[q q^T] R(delta)^T] and
    Qmean = E[R] E[q q^T] E[R]^T. Per pair of planes (j, k) the rotation-and-scale part of a
    2x2 block turns with delta (theta_j - theta_k), the reflection part with delta (theta_j + theta_k).
    """
    p = inv_freq.shape[0]
    delta = torch.arange(context, dtype=torch.float64)
    weight = (context - delta) / (context - delta).sum()  # causal pairs at distance delta

    def avg(freq):  # E exp(i delta freq), broadcast over freq
        return (torch.exp(1j * delta * freq[..., None]) * weight).sum(-1)

    th = inv_freq.double()
    blocks = qcov.reshape(*qcov.shape[:-2], p, 2, p, 2).transpose(-3, -2)  # (..., p, p, 2, 2)
    a = torch.complex((blocks[..., 0, 0] + blocks[..., 1, 1]) / 2, (blocks[..., 1, 0] - blocks[..., 0, 1]) / 2)
    b = torch.complex((blocks[..., 0, 0] - blocks[..., 1, 1]) / 2, (blocks[..., 0, 1] + blocks[..., 1, 0]) / 2)
    a = a * avg(th[:, None] - th[None, :])
    b = b * avg(th[:, None] + th[None, :])
    out = torch.stack([torch.stack([a.real + b.real, -a.imag + b.imag], -1), torch.stack([a.imag + b.imag, a.real - b.real], -1)], -2)
    qbar = out.transpose(-3, -2).reshape(qcov.shape)
    psi = torch.block_diag(*_rotscale(avg(th)))
    return qbar, psi @ qcov @ psi.T


def refine_keys_joint(k, qbar, qmean, owner, sigma, mean, merged0, c0, steps: int = 200):
    """Minimise the RoPE-averaged logit error across all planes jointly (L-BFGS, float64).

    loss = sum_h tr(Qbar_h E[e_h e_h^T]) - E[e_h]^T Qmean_h E[e_h], e_h = (k_a(h) - C_h k~) x:
    the spread over keys of query head h's score error, less the part that is the same for
    every key (softmax ignores it). C_h stays one rotation-and-scale per plane, so it folds into
    q_proj exactly; k~ is searched in the span of the member keys. k (r, d, n) rotate-half rows,
    qbar/qmean (Hg, d, d) plane-major, c0 (Hg, p) -> merged (d, n), c (Hg, p).
    """
    r, d, n = k.shape
    p = d // 2
    perm = plane_major(d)
    basis = k[:, perm].reshape(r * d, n)  # member keys, plane-major rows
    gram, mu = basis @ sigma @ basis.T, basis @ mean
    select = torch.eye(r * d, dtype=k.dtype).reshape(r, d, r * d)[owner]  # (Hg, d, r d)
    coef0 = torch.linalg.lstsq(basis.T, merged0[perm].T).solution.T  # (d, r d)
    coef = coef0.clone().requires_grad_(True)
    cpar = torch.stack([c0.real, c0.imag], -1).clone().requires_grad_(True)

    def loss_fn():
        rot = _rotscale(torch.complex(cpar[..., 0], cpar[..., 1]))  # (Hg, p, 2, 2)
        cn = torch.einsum("hpxy,pyc->hpxc", rot, coef.reshape(p, 2, -1)).reshape(len(owner), d, -1)
        err = select - cn  # (Hg, d, r d)
        spread = torch.einsum("hxc,cD,hyD,hxy->", err, gram, err, qbar)
        em = err @ mu
        return spread - torch.einsum("hx,hxy,hy->", em, qmean, em)

    scale = float(loss_fn().detach().abs().clamp_min(1e-300))
    opt = torch.optim.LBFGS([coef, cpar], max_iter=steps, history_size=20, line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        out = loss_fn() / scale
        out.backward()
        return out

    opt.step(closure)
    merged = torch.empty_like(merged0)
    merged[perm] = (coef.detach() @ basis)
    c = torch.complex(cpar.detach()[..., 0], cpar.detach()[..., 1])
    merged_c, c = _normalise(c, planes(merged))
    return unplanes(merged_c), c


def key_loss_joint(k, qbar, qmean, owner, sigma, mean, merged, c) -> float:
    """The objective of `refine_keys_joint` (plane-major query moments)."""
    perm = plane_major(k.shape[1])
    err = planes(k)[owner] - c[:, :, None] * planes(merged)[None]
    e = unplanes(err)[:, perm]  # (Hg, d, n)
    em = e @ mean
    return float(torch.einsum("hxn,nm,hym,hxy->", e, sigma, e, qbar) - torch.einsum("hx,hxy,hy->", em, qmean, em))


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
