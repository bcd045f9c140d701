import math

import numpy as np
import pytest
import torch

from quantkit.evals.stats import bootstrap_ci, kl_full, kl_topk, kl_summary, perplexity, summarize


def test_kl_hand_computed():
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.5, 0.25])
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    assert kl_full(p.log(), q.log()).item() == pytest.approx(expected, abs=1e-6)
    assert kl_full(p.log(), p.log()).item() == 0.0


def test_kl_topk_exact_when_k_covers_vocab_and_zero_for_self():
    torch.manual_seed(0)
    lb = torch.log_softmax(torch.randn(7, 50), -1)
    lm = torch.log_softmax(torch.randn(7, 50), -1)
    top = lb.topk(50, -1)
    assert torch.allclose(kl_topk(top.values, top.indices, lm), kl_full(lb, lm), atol=1e-5)
    top5 = lb.topk(5, -1)
    assert torch.all(kl_topk(top5.values, top5.indices, lb) < 1e-6)
    # a lower bound of the exact KL when the tail is bucketed
    assert torch.all(kl_topk(top5.values, top5.indices, lm) <= kl_full(lb, lm) + 1e-5)


def test_kl_topk_tail_bucket_hand_computed():
    # base: top-1 token with p=0.5, tail 0.5; model: p=0.25 on it, tail 0.75
    lb = torch.tensor([[math.log(0.5)]])
    idx = torch.tensor([[0]])
    lm = torch.log(torch.tensor([[0.25, 0.375, 0.375]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_topk(lb, idx, lm).item() == pytest.approx(expected, abs=1e-6)


def test_perplexity_of_known_probabilities():
    # a model that gives every true token probability 1/4 has perplexity 4
    nll = np.full(100, math.log(4))
    assert perplexity(nll) == pytest.approx(4.0)


def test_summary_and_bootstrap():
    rng = np.random.default_rng(0)
    nb = rng.uniform(1, 3, 1000)
    nm = nb + 0.1
    kl = rng.uniform(0, 0.2, 1000)
    s = summarize(nm, nb, kl, np.ones(1000, bool), window_len=100)
    assert s["delta_ppl_pct"] == pytest.approx((math.exp(0.1) - 1) * 100, rel=1e-6)
    lo, hi = s["ci95"]["delta_ppl_pct"]
    assert lo <= s["delta_ppl_pct"] <= hi
    lo, hi = s["ci95"]["kld_mean"]
    assert lo <= s["kld"]["mean"] <= hi
    assert s["top1_agreement"] == 1.0
    k = kl_summary(np.array([0.0, 1.0, 2.0]))
    assert k == {"mean": 1.0, "median": 1.0, "p99": pytest.approx(1.98), "max": 2.0}
    assert math.isnan(bootstrap_ci(nm[:50], nb[:50], kl[:50], 100)["kld_mean"][0])
