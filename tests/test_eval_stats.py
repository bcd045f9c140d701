import math

import numpy as np
import pytest
import torch

from quantkit.evals.accuracy_stats import (
    bootstrap_ci,
    bucket_ranges,
    kl_exact,
    kl_full,
    kl_summary,
    kl_topk,
    perplexity,
    position_buckets,
    summarize,
)


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
    """Fixed next-token probabilities: uniform over V, or `p_next` on token id+1 (mod V) and the rest
    spread evenly. Built as a model is: the hidden state of token t is one-hot(t), and the output
    layer's column t holds the logits of the token after t, so its logits come from its lm_head."""

    device = torch.device("cpu")

    def __init__(self, vocab: int, p_next: float | None = None):
        super().__init__()
        from types import SimpleNamespace

        self.vocab, self.config = vocab, SimpleNamespace(final_logit_softcapping=None)
        self.lm_head = torch.nn.Linear(vocab, vocab, bias=False)
        w = torch.zeros(vocab, vocab)
        if p_next is not None:
            w[:] = math.log((1 - p_next) / (vocab - 1))
            w[(torch.arange(vocab) + 1) % vocab, torch.arange(vocab)] = math.log(p_next)
        self.lm_head.weight.data = w

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, use_cache=False):
        from types import SimpleNamespace

        hidden = torch.nn.functional.one_hot(input_ids, self.vocab).float()
        return SimpleNamespace(logits=self.lm_head(hidden))


def _toy_windows(n: int):
    from quantkit.evals.perplexity import Windows

    hits = torch.arange(n + 1)  # every next token is id+1
    misses = torch.arange(n + 1) * 5  # no next token is id+1
    return Windows([hits, misses], [0, 100], n + 1, {})


def test_perplexity_scoring_of_a_toy_model_with_known_probabilities():
    from quantkit.evals.perplexity import TOPK, baseline_pass, score, self_score, topk_references

    V, n = TOPK, 8  # the baseline's top-k covers the vocabulary, so even the bound is exact
    windows = _toy_windows(n)
    base = baseline_pass(ToyLM(V), windows)
    assert self_score(base, windows).figures()["ppl"] == pytest.approx(V, rel=1e-6)
    uniform = score(ToyLM(V), windows, topk_references(base)).figures()
    assert uniform["ppl"] == pytest.approx(V, rel=1e-6) and uniform["kld"]["max"] < 1e-6 and uniform["tokens"] == 2 * n
    # p = 1/2 on half the positions, (1/2)/(V-1) on the other half: PPL = exp(mean NLL) = sqrt(2 * 2(V-1))
    r = score(ToyLM(V, p_next=0.5), windows, topk_references(base)).figures()
    assert r["ppl"] == pytest.approx(2 * math.sqrt(V - 1), rel=1e-6) and r["baseline_ppl"] == pytest.approx(V, rel=1e-6)
    assert r["delta_ppl_pct"] == pytest.approx((2 * math.sqrt(V - 1) / V - 1) * 100, rel=1e-5)
    kl = (1 / V) * math.log(2 / V) + (V - 1) / V * math.log(2 * (V - 1) / V)  # KL(uniform || model), every position
    assert r["kld"]["mean"] == pytest.approx(kl, rel=1e-4) and r["kld"]["max"] == pytest.approx(kl, rel=1e-4)


def test_exact_kl_of_a_toy_model_equals_the_hand_computed_full_vocabulary_kl():
    """A vocabulary larger than the baseline's top-256: the exact KL (the baseline's rows recomputed
    from its pass's hidden states by its output layer) is the hand value; the bound, whose tail
    bucket is exact here (both tails uniform), is no higher."""
    from quantkit.evals.perplexity import baseline_pass, exact_references, score, topk_references
    from quantkit.evals.scorers.transformers_scorer import OutputHead

    V, n, p = 1024, 8, 0.3
    windows = _toy_windows(n)
    base_model = ToyLM(V, p_next=0.9)
    base = baseline_pass(base_model, windows)
    assert base["hidden"].shape == (2, n, V)  # the output layer reproduced the logits: its inputs kept
    exact = score(ToyLM(V, p_next=p), windows, exact_references(base, OutputHead.of(base_model))).figures()
    bound = score(ToyLM(V, p_next=p), windows, topk_references(base)).figures()
    # KL(base || model) at every position: base puts 0.9 on id+1 and 0.1/(V-1) elsewhere, the model p and (1-p)/(V-1)
    q_b, q_m = 0.1 / (V - 1), (1 - p) / (V - 1)
    hand = 0.9 * math.log(0.9 / p) + (V - 1) * q_b * math.log(q_b / q_m)
    assert exact["kld"]["mean"] == pytest.approx(hand, rel=1e-5) and exact["kld"]["max"] == pytest.approx(
        hand, rel=1e-5
    )
    assert bound["kld"]["mean"] <= exact["kld"]["mean"] * (1 + 1e-6)
    assert exact["ppl"] == bound["ppl"] and exact["top1_agreement"] == bound["top1_agreement"]


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


def test_exact_kl_in_chunks_equals_the_whole_rows_and_the_bound_never_exceeds_it():
    torch.manual_seed(1)
    for vocab, temp in ((300, 1.0), (2000, 3.0), (5000, 0.3)):
        lb = torch.log_softmax(torch.randn(37, vocab) * temp, -1)
        lm = torch.log_softmax(torch.randn(37, vocab) * temp + 0.5 * lb, -1)
        whole = kl_full(lb, lm)
        for chunk in (1, 8, 37, 512):
            got = kl_exact(lambda lo, hi: lb[lo:hi], lm, chunk=chunk)
            assert torch.allclose(got, whole, rtol=1e-6, atol=1e-7)
        for k in (1, 16, 256):
            top = lb.topk(min(k, vocab), -1)
            bound = kl_topk(top.values, top.indices, lm)
            assert torch.all(bound <= whole + 1e-5) and bound.mean() < whole.mean()  # short where the tail differs


def test_position_buckets_cover_the_window_and_sum_to_the_overall_figures():
    rng = np.random.default_rng(2)
    windows, window_len = 6, 100
    nb = rng.uniform(1, 3, windows * window_len)
    nm = nb + rng.uniform(0, 0.3, nb.size) * np.tile(np.linspace(0, 2, window_len), windows)  # worse deeper in
    kl = rng.uniform(0, 0.2, nb.size)
    agree = rng.uniform(size=nb.size) < 0.8
    buckets = position_buckets(nm, nb, kl, agree, window_len, (16, 64, 512))
    assert [(b["lo"], b["hi"]) for b in buckets] == [(0, 16), (16, 64), (64, 100)]  # 512 lies past the window
    overall = summarize(nm, nb, kl, agree, window_len)
    tokens = np.array([b["tokens"] for b in buckets])
    assert tokens.sum() == overall["tokens"] == windows * window_len
    w = tokens / tokens.sum()
    assert np.dot(w, [b["kld"]["mean"] for b in buckets]) == pytest.approx(overall["kld"]["mean"], rel=1e-12)
    assert np.dot(w, [b["top1_agreement"] for b in buckets]) == pytest.approx(overall["top1_agreement"], rel=1e-12)
    for key in ("ppl", "baseline_ppl"):  # log-PPL is the mean NLL: token-weighted
        assert np.dot(w, [math.log(b[key]) for b in buckets]) == pytest.approx(math.log(overall[key]), rel=1e-12)
    for b in buckets:
        lo, hi = b["ci95"]["kld_mean"]
        assert lo <= b["kld"]["mean"] <= hi
    assert buckets[-1]["delta_ppl_pct"] > buckets[0]["delta_ppl_pct"]


def test_bucket_ranges_drop_edges_past_the_window():
    assert bucket_ranges((512, 2048, 8192), 511) == [(0, 511)]
    assert bucket_ranges((512, 2048, 8192), 8191) == [(0, 512), (512, 2048), (2048, 8191)]
    assert bucket_ranges((512, 2048), 4095) == [(0, 512), (512, 2048), (2048, 4095)]  # past the last edge: one more
    assert bucket_ranges((512, 2048, 8192), 2048) == [(0, 512), (512, 2048)]
