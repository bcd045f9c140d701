"""gqa.keys / gqa.values / gqa.groups: the merge math against hand-built cases."""

import pytest
import torch

from quantkit.core.roofline import kv_bytes
from quantkit.gqa import keys as K
from quantkit.gqa import values as V
from quantkit.gqa.groups import contiguous_groups, query_order, search_groups

F64 = torch.float64


def inputs(n=17, tokens=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (
        torch.randn(tokens, n - 1, generator=g, dtype=F64) @ torch.randn(n - 1, n - 1, generator=g, dtype=F64) / n**0.5
        + 0.3
    )
    x = torch.cat([x, torch.ones(tokens, 1, dtype=F64)], 1)  # the bias column
    return x, x.T @ x / tokens


def rope(x, pos, inv_freq):
    """transformers' rotate-half RoPE on rows x (..., d)."""
    ang = pos * inv_freq
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def setting(r=3, hq=2, d=8, n=17, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    x, sigma = inputs(n, seed=seed)
    k = torch.randn(r, d, n, generator=g, dtype=F64)
    q = torch.randn(r * hq, d, n, generator=g, dtype=F64)
    inv = 100.0 ** (-torch.arange(d // 2, dtype=F64) / (d // 2))
    owner = torch.arange(r).repeat_interleave(hq)
    perm = K.plane_major(d)
    qbar, qmean = K.rope_averaged(q[:, perm] @ sigma @ q[:, perm].transpose(1, 2), inv, 64)
    return dict(x=x, sigma=sigma, k=k, q=q, inv=inv, owner=owner, qbar=qbar, qmean=qmean)


def test_compensation_commutes_with_rope():
    """Re(conj(c) q conj(k/c)) per plane: rotating q and k/c then dotting equals the original score."""
    s = setting()
    c = torch.complex(torch.randn(4, dtype=F64), torch.randn(4, dtype=F64))
    q, k = s["q"][0] @ s["x"][:5].T, s["k"][0] @ s["x"][5:10].T  # (d, tokens)
    k_div = K.unplanes(K.planes(s["k"][0]) / c[:, None]) @ s["x"][5:10].T
    q_fold = K.fold_query(s["q"][0], c) @ s["x"][:5].T
    for pq, pk in [(3, 1), (40, 7)]:
        ref = rope(q.T, pq, s["inv"]) @ rope(k.T, pk, s["inv"]).T
        new = rope(q_fold.T, pq, s["inv"]) @ rope(k_div.T, pk, s["inv"]).T
        assert torch.allclose(ref, new, atol=1e-9)


def test_mean_merge_is_the_plain_mean():
    k = torch.randn(3, 8, 5, dtype=F64)
    merged, c = K.merge_keys_mean(k, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.equal(merged, (k[0] + k[1] + k[2]) / 3) and torch.equal(c, torch.ones(6, 4, dtype=torch.complex128))
    coef, b = V.merge_values_mean(3, 8)
    assert torch.allclose(coef @ k.reshape(24, 5), k.mean(0)) and torch.equal(
        b, torch.eye(8, dtype=F64).expand(3, 8, 8)
    )


@pytest.mark.parametrize("refine", [False, True])
def test_keys_exact_for_complex_scaled_copies(refine):
    """Members that differ by a complex scale per plane merge with zero error."""
    s = setting()
    cs = torch.complex(torch.randn(3, 4, dtype=F64), torch.randn(3, 4, dtype=F64))
    k = K.unplanes(cs[:, :, None] * K.planes(s["k"][0])[None])
    energy = K.plane_energy(s["q"], s["sigma"])
    merged, c = K.merge_keys_rank1(k, energy, s["owner"], s["sigma"], s["sigma"][-1], s["inv"], 64)
    if refine:
        merged, c = K.refine_keys(k, s["qbar"], s["qmean"], s["owner"], s["sigma"], s["sigma"][-1], merged, c)
    approx = K.unplanes(c[:, :, None] * K.planes(merged)[None])
    assert torch.allclose(approx, k[s["owner"]], atol=1e-8)
    assert torch.allclose(c.abs().pow(2).mean(0), torch.ones(4, dtype=F64))  # normalised gauge


def test_rope_averaged_matches_monte_carlo():
    s = setting(r=1, hq=1)
    perm, ctx = K.plane_major(8), 64
    qcov = s["q"][:, perm] @ s["sigma"] @ s["q"][:, perm].transpose(1, 2)
    qbar, qmean = K.rope_averaged(qcov, s["inv"], ctx)
    w = (ctx - torch.arange(ctx, dtype=F64)) / (ctx - torch.arange(ctx, dtype=F64)).sum()
    rots = [
        torch.block_diag(
            *[
                torch.tensor([[torch.cos(t * f), -torch.sin(t * f)], [torch.sin(t * f), torch.cos(t * f)]], dtype=F64)
                for f in s["inv"]
            ]
        )
        for t in range(ctx)
    ]
    mc = sum(wt * r @ qcov[0] @ r.T for wt, r in zip(w, rots))
    mean_r = sum(wt * r for wt, r in zip(w, rots))
    assert torch.allclose(qbar[0], mc, atol=1e-9) and torch.allclose(qmean[0], mean_r @ qcov[0] @ mean_r.T, atol=1e-9)


def test_refine_keys_lowers_the_loss_and_reaches_a_stationary_point():
    s = setting(seed=3)
    mean = s["sigma"][-1]
    energy = K.plane_energy(s["q"], s["sigma"])
    m0, c0 = K.merge_keys_rank1(s["k"], energy, s["owner"], s["sigma"], mean, s["inv"], 64)
    args = (s["k"], s["qbar"], s["qmean"], s["owner"], s["sigma"], mean)
    m1, c1 = K.refine_keys(*args, m0, c0, iters=200)
    mm, cm = K.merge_keys_mean(s["k"], s["owner"])
    losses = [K.key_loss(*args, m, c) for m, c in [(mm, cm), (m0, c0), (m1, c1)]]
    assert losses[2] < losses[1] < losses[0]
    # gradient of the loss at the solution (c per head, merged in the span of the keys) ~ 0
    coef = torch.zeros(8, 3 * 8, dtype=F64, requires_grad=True)
    cp = torch.stack([c1.real, c1.imag], -1).clone().requires_grad_(True)
    basis = s["k"].reshape(24, -1)
    fit = torch.linalg.lstsq(basis.T, m1.T).solution.T
    perm = K.plane_major(8)
    e = K.unplanes(
        K.planes(s["k"])[s["owner"]]
        - torch.complex(cp[..., 0], cp[..., 1])[:, :, None] * K.planes((fit + coef) @ basis)[None]
    )[:, perm]
    em = e @ mean
    loss = torch.einsum("hxn,nm,hym,hxy->", e, s["sigma"], e, s["qbar"]) - torch.einsum(
        "hx,hxy,hy->", em, s["qmean"], em
    )
    loss.backward()
    assert coef.grad.abs().max() / loss.item() < 1e-4 and cp.grad.abs().max() / loss.item() < 1e-4


def test_values_pca_exact_cases_and_beats_mean():
    _, sigma = inputs()
    o = torch.randn(3, 12, 8, dtype=F64)
    metric = o.transpose(1, 2) @ o
    v1 = torch.randn(8, 17, dtype=F64)
    for v in (v1[None], torch.stack([v1] * 3)):  # one head, identical heads
        stacked = v.reshape(-1, 17)
        coef, b = V.merge_values_pca(metric[: len(v)], stacked @ sigma @ stacked.T)
        assert torch.allclose(b @ (coef @ stacked), v, atol=1e-7)
    v = torch.randn(3, 8, 17, dtype=F64).reshape(24, 17)
    s = v @ sigma @ v.T
    coef, b = V.merge_values_pca(metric, s)
    cm, bm = V.merge_values_mean(3, 8)
    assert V.value_loss(metric, s, coef, b) < V.value_loss(metric, s, cm, bm)
    cov = coef @ s @ coef.T  # balanced gauge: uncorrelated rows with the members' mean energy
    assert torch.allclose(cov, torch.eye(8, dtype=F64) * s.trace() / 24, rtol=1e-6)


def test_groups_search_and_order():
    assert contiguous_groups(6, 3) == [[0, 1], [2, 3], [4, 5]]
    planted = {(0, 3), (1, 4), (2, 5)}
    assert search_groups(6, 3, lambda g: 0.0 if tuple(g) in planted else 1.0) == [[0, 3], [1, 4], [2, 5]]
    assert query_order([[0, 2], [1, 3]], 2) == [0, 1, 4, 5, 2, 3, 6, 7]


def test_kv_bytes_per_token():
    # SmolLM2-135M: 30 layers, head_dim 64; K and V, bf16
    assert kv_bytes(30, 3, 64) == 23040 and kv_bytes(30, 1, 64) == 7680
