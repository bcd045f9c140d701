import math

import numpy as np
import pytest
import torch

from quantkit.evals.stats import bootstrap_ci, kl_full, kl_summary, kl_topk, perplexity, summarize


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


class ToyLM(torch.nn.Module):
    """Fixed next-token probabilities: uniform over V, or `p_next` on token id+1 (mod V) and the rest spread evenly."""

    device = torch.device("cpu")

    def __init__(self, vocab: int, p_next: float | None = None):
        super().__init__()
        self.vocab, self.p_next = vocab, p_next

    def forward(self, input_ids, use_cache=False):
        from types import SimpleNamespace

        logits = torch.zeros(*input_ids.shape, self.vocab)
        if self.p_next is not None:
            logits[:] = math.log((1 - self.p_next) / (self.vocab - 1))
            logits.scatter_(-1, ((input_ids + 1) % self.vocab)[..., None], math.log(self.p_next))
        return SimpleNamespace(logits=logits)


def test_perplexity_scoring_of_a_toy_model_with_known_probabilities():
    from quantkit.evals.perplexity import TOPK, Windows, baseline_pass, score, self_score

    V, n = TOPK, 8  # the baseline's top-k covers the vocabulary, so the KL is exact
    hits = torch.arange(n + 1)  # every next token is id+1
    misses = torch.arange(n + 1) * 5  # no next token is id+1
    windows = Windows([hits, misses], [0, 100], n + 1, {})
    base = baseline_pass(ToyLM(V), windows)
    assert self_score(base, windows)["ppl"] == pytest.approx(V, rel=1e-6)
    uniform = score(ToyLM(V), windows, base)
    assert uniform["ppl"] == pytest.approx(V, rel=1e-6) and uniform["kld"]["max"] < 1e-6 and uniform["tokens"] == 2 * n
    # p = 1/2 on half the positions, (1/2)/(V-1) on the other half: PPL = exp(mean NLL) = sqrt(2 * 2(V-1))
    r = score(ToyLM(V, p_next=0.5), windows, base)
    assert r["ppl"] == pytest.approx(2 * math.sqrt(V - 1), rel=1e-6) and r["baseline_ppl"] == pytest.approx(V, rel=1e-6)
    assert r["delta_ppl_pct"] == pytest.approx((2 * math.sqrt(V - 1) / V - 1) * 100, rel=1e-5)
    kl = (1 / V) * math.log(2 / V) + (V - 1) / V * math.log(2 * (V - 1) / V)  # KL(uniform || model), every position
    assert r["kld"]["mean"] == pytest.approx(kl, rel=1e-4) and r["kld"]["max"] == pytest.approx(kl, rel=1e-4)


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
