"""Pure statistics for accuracy deltas: perplexity, KL divergence, top-1 agreement, bootstrap intervals.

The reference is llama.cpp's `llama-perplexity --kl-divergence`, which reports PPL of both
models, KL(base || model) per token as mean/median/p99/max, and the top-token agreement.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Log-probabilities the baseline pass keeps per position: the KL's head (kl_topk); the rest of the
# vocabulary is one tail bucket.
TOPK = 256
# Positions whose whole-vocabulary rows exist at once in the exact KL (kl_exact): two float32 rows
# of a 128k vocabulary are 1 MB, so a chunk's temporaries stay near 0.5 GB.
KL_CHUNK = 512


def kl_full(logp_base, logp_model):
    """Exact per-position KL(base || model) from full log-probability rows (torch, [..., V])."""
    p = logp_base.exp()
    return (p * (logp_base - logp_model)).sum(-1)


def kl_exact(base_rows, logp_model, chunk: int = KL_CHUNK):
    """Exact per-position KL(base || model) over the whole vocabulary, `chunk` positions at a time:
    `base_rows(lo, hi)` gives the baseline's float32 log-probabilities of rows lo..hi-1 (recomputed
    from what the baseline pass kept), `logp_model` the model's rows [positions, V]. Equals
    kl_full on the whole arrays; only one chunk of the baseline's rows exists at a time."""
    n = logp_model.shape[0]
    parts = []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        lb = base_rows(lo, hi).to(logp_model.device)
        parts.append(kl_full(lb, logp_model[lo:hi]).clamp_min(0.0))
    return torch.cat(parts) if parts else logp_model.new_zeros(0)


def kl_topk(base_topk_logp, base_topk_idx, logp_model):
    """Per-position KL(base || model) on the base's top-k tokens plus one bucket for the rest.

    The tail bucket compares the base's remaining mass with the model's remaining mass, which
    by the log-sum inequality makes this a lower bound of the exact KL; it is exact when the
    base puts all its mass on its top k (and for a model compared with itself it is 0).
    """

    lb = base_topk_logp.float()
    lm = logp_model.gather(-1, base_topk_idx.long())
    pb = lb.exp()
    head = (pb * (lb - lm)).sum(-1)
    rest_b = (1.0 - pb.sum(-1)).clamp_min(0.0)
    rest_m = (1.0 - lm.exp().sum(-1)).clamp_min(0.0)
    tiny = torch.finfo(torch.float32).tiny
    tail = torch.where(
        rest_b > 1e-7, rest_b * (torch.log(rest_b + tiny) - torch.log(rest_m + tiny)), torch.zeros_like(rest_b)
    )
    return (head + tail).clamp_min(0.0)


def window_reference(logp, target, k: int = TOPK) -> dict:
    """The baseline's record of one window from its log-probabilities `logp` (positions, vocab) and
    the true next tokens `target`: top-k log-probabilities (float32) with their ids, the NLL of each
    true token and the argmax, as CPU tensors (what the baseline cache stores)."""
    top = logp.topk(k, dim=-1)
    return {
        "topk_logp": top.values.cpu(),
        "topk_idx": top.indices.int().cpu(),
        "nll": -logp.gather(-1, target[:, None])[:, 0].cpu(),
        "argmax": top.indices[:, 0].int().cpu(),
    }


def window_stats(logp, target, ref: dict) -> dict:
    """Per-token statistics of one window of the model under test against the baseline's record
    `ref` (window_reference): its NLL of each true token, KL(base || model) and whether both
    argmaxes agree; numpy arrays. The KL is exact (kl_exact) when `ref` carries
    `base_rows` (the baseline's whole rows, a chunk at a time), else the top-k bound (kl_topk)."""
    dev = logp.device
    if "base_rows" in ref:
        kl = kl_exact(ref["base_rows"], logp)
    else:
        kl = kl_topk(ref["topk_logp"].to(dev), ref["topk_idx"].to(dev), logp)
    return {
        "nll": -logp.gather(-1, target[:, None])[:, 0].cpu().numpy(),
        "kl": kl.cpu().numpy(),
        "agree": (logp.argmax(-1).int().cpu() == ref["argmax"]).numpy(),
    }


def perplexity(nll: np.ndarray) -> float:
    return float(math.exp(float(np.mean(nll))))


def kl_summary(kl: np.ndarray) -> dict:
    kl = np.asarray(kl, dtype=np.float64)
    return {
        "mean": float(kl.mean()),
        "median": float(np.median(kl)),
        "p99": float(np.percentile(kl, 99)),
        "max": float(kl.max()),
    }


def bootstrap_ci(
    nll_model: np.ndarray,
    nll_base: np.ndarray,
    kl: np.ndarray,
    window_len: int,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict:
    """95% intervals for dPPL% and mean KL, resampling whole windows (tokens within one are correlated)."""
    rng = np.random.default_rng(seed)
    n_win = len(nll_model) // window_len
    if n_win < 2:
        return {"delta_ppl_pct": [float("nan"), float("nan")], "kld_mean": [float("nan"), float("nan")]}
    nm = nll_model[: n_win * window_len].reshape(n_win, window_len).mean(1)
    nb = nll_base[: n_win * window_len].reshape(n_win, window_len).mean(1)
    kw = kl[: n_win * window_len].reshape(n_win, window_len).mean(1)
    idx = rng.integers(0, n_win, size=(n_boot, n_win))
    d = (np.exp(nm[idx].mean(1) - nb[idx].mean(1)) - 1.0) * 100.0
    k = kw[idx].mean(1)
    return {
        "delta_ppl_pct": [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))],
        "kld_mean": [float(np.percentile(k, 2.5)), float(np.percentile(k, 97.5))],
    }


def summarize(nll_model: np.ndarray, nll_base: np.ndarray, kl: np.ndarray, agree: np.ndarray, window_len: int) -> dict:
    ppl, base = perplexity(nll_model), perplexity(nll_base)
    return {
        "ppl": ppl,
        "baseline_ppl": base,
        "delta_ppl_pct": (ppl / base - 1.0) * 100.0,
        "kld": kl_summary(kl),
        "top1_agreement": float(np.mean(agree)),
        "ci95": bootstrap_ci(nll_model, nll_base, kl, window_len),
        "tokens": int(len(nll_model)),
    }


def bucket_ranges(edges, window_len: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges of a window of `window_len` scored positions cut at `edges` (increasing
    upper edges): edges at or past the window's end are dropped, the last bucket ends with the
    window, so the buckets always cover every position exactly once."""
    cuts = [e for e in edges if 0 < e < window_len]
    bounds = [0, *cuts, window_len]
    return list(zip(bounds[:-1], bounds[1:]))


def position_buckets(
    nll_model: np.ndarray, nll_base: np.ndarray, kl: np.ndarray, agree: np.ndarray, window_len: int, edges
) -> list[dict]:
    """summarize() of each position bucket (bucket_ranges) across all windows, with `lo` and `hi`.
    Arrays are the windows' positions back to back (window_len each); the bootstrap resamples whole
    windows, and with one seed the same windows in every bucket."""
    n_win = len(nll_model) // window_len

    def cut(a, lo, hi):
        return np.asarray(a)[: n_win * window_len].reshape(n_win, window_len)[:, lo:hi].reshape(-1)

    out = []
    for lo, hi in bucket_ranges(edges, window_len):
        parts = [cut(a, lo, hi) for a in (nll_model, nll_base, kl, agree)]
        out.append({"lo": lo, "hi": hi, **summarize(*parts, hi - lo)})
    return out
