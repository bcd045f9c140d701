"""Perplexity, KL and top-1 agreement of a model against a cached baseline, window by window.

Each window of `seq_len` tokens is scored on its positions 1..seq_len-1 (no BOS is added;
every model sees exactly the same tokens). Only one window's logits exist at a time. The
baseline pass stores, per position, its top-k log-probabilities (float32) with their token ids,
its NLL of the true next token, its argmax and the input of its output layer (`hidden`): comparing
many variants costs one baseline pass (as llama.cpp's --kl-divergence-base does, but compact:
hidden-size floats per position instead of vocabulary-size ones).

The KL is exact (the whole vocabulary) where the model's scorer gives whole rows: the baseline's
rows are recomputed from `hidden` by its output layer, a chunk of positions at a time
(exact_references, stats.kl_exact); else it is the top-k bound (topk_references, stats.kl_topk).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from dataclasses import dataclass

import numpy as np
import torch

from quantkit.core.atomic import write_bytes
from quantkit.core.distributed import ONE_PROCESS, Runtime
from quantkit.data.text import read_text, tokenize_stream
from quantkit.errors import DataError
from quantkit.evals.accuracy_stats import TOPK, position_buckets, summarize
from quantkit.evals.scorers.scorer import Scorer
from quantkit.evals.scorers.transformers_scorer import TransformersScorer
from quantkit.evals.splits import split_range, split_windows, where
from quantkit.home import subdir

REFERENCE_KEYS = ("topk_logp", "topk_idx", "nll", "argmax")  # a baseline record (stats.window_reference)
# A pass whose output layer was checked and does not reproduce its logits (so no `hidden`): the
# exact KL is not available from it, and the pass is not made again for asking.
HEAD_CHECKED = "head_checked_without_hidden"


@dataclass
class Windows:
    tokens: list  # list of 1-D LongTensors of seq_len tokens
    starts: list[int]
    seq_len: int
    provenance: dict

    def describe(self) -> dict:
        return {**self.provenance, "seq_len": self.seq_len, "count": len(self.starts), "window_starts": self.starts}


def vocab_fingerprint(tokenizer) -> str:
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def text_windows(tokenizer, spec, *, seq_len: int, max_tokens: int, region: str, split: str = "all") -> Windows:
    """Up to max_tokens // seq_len non-overlapping windows from the start of the text's part
    `split` of `region` (evals/splits.py; `all`: the whole region)."""

    text = read_text(spec)
    stream = tokenize_stream(tokenizer, text.text)
    lo, hi = split_range(len(stream), region, split)
    all_windows = split_windows(len(stream), seq_len, region, split)
    if not all_windows:
        part = f"region {region}" if split == "all" else f"{where(region, split)} (tokens {lo} to {hi})"
        raise DataError(f"{spec}: {len(stream)} tokens, shorter than one {seq_len}-token window in {part}")
    n = max(1, max_tokens // seq_len)
    chosen = all_windows[:n]
    prov = {
        **text.provenance,
        "region": region,
        "split": split,
        "token_range": [lo, hi],
        "stream_tokens": len(stream),
        "overlap": "none (non-overlapping)",
    }
    return Windows([stream[s:e] for s, e in chosen], [s for s, _ in chosen], seq_len, prov)


def _cache_key(baseline_hash: str, windows: Windows, vocab: str, dtype: str) -> str:
    blob = json.dumps(
        [baseline_hash, windows.provenance.get("sha256"), vocab, windows.seq_len, windows.starts, TOPK, dtype]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def scorer_of(model, batch_size: int = 1):
    """A scorer (evals/scorers), or a transformers model wrapped in the transformers scorer."""

    return model if isinstance(model, Scorer) else TransformersScorer(model, batch_size)


def baseline_pass(model, windows: Windows, progress=None, batch_size: int = 1, runtime: Runtime = ONE_PROCESS) -> dict:
    """The baseline's record of every window (stats.window_reference), stacked: the cache's content.
    `hidden` (the output layer's inputs, what the exact KL recomputes the baseline's rows from)
    is kept where the baseline's scorer gives it for every window (scorers/transformers_scorer.py).
    Under torchrun (`runtime`) each rank passes its share of the windows, gathered in window order."""

    out: dict = {k: [] for k in (*REFERENCE_KEYS, "hidden")}
    mine = runtime.share(len(windows.tokens))
    for i, ref in zip(mine, scorer_of(model, batch_size).reference([windows.tokens[j] for j in mine], TOPK)):
        for k in out:
            out[k].append(ref.get(k))
        if progress:
            progress(i + 1)
    gathered = {k: runtime.gather(v) for k, v in out.items()}
    data = {k: torch.stack(gathered[k]) for k in REFERENCE_KEYS}
    hidden = gathered["hidden"]
    if all(h is not None for h in hidden):
        data["hidden"] = torch.stack(hidden)
    return data


def cached_baseline(
    load_baseline,
    baseline_hash: str,
    windows: Windows,
    vocab: str,
    dtype: str,
    progress=None,
    batch_size: int = 1,
    device_type: str = "cpu",
    exact: bool = False,
    runtime: Runtime = ONE_PROCESS,
) -> tuple[dict, bool]:
    """The baseline's per-window statistics, from disk when this exact pass was done before.
    `load_baseline` is called only on a miss. The key holds the device type: a GPU's kernels
    round differently from the CPU's, so their passes are different baselines. `exact`: a cached
    pass made before passes kept `hidden` (and so cannot give the exact KL) is made again."""

    key_dtype = dtype if device_type == "cpu" else f"{dtype}@{device_type}"  # CPU keys as before: old caches stay valid
    path = subdir("eval-cache") / f"{_cache_key(baseline_hash, windows, vocab, key_dtype)}.pt"
    cached = _read_cache(path, len(windows.tokens))
    if cached is not None and exact and "hidden" not in cached and HEAD_CHECKED not in cached:
        cached = None
    cached = runtime.everywhere(cached)  # under torchrun: a hit only if every rank reads it
    if cached is not None:
        return cached, True
    data = baseline_pass(load_baseline(), windows, progress, batch_size, runtime)
    if "hidden" not in data:  # checked, and the output layer does not reproduce the logits: no exact KL
        data[HEAD_CHECKED] = torch.zeros(len(windows.tokens), dtype=torch.bool)
    buf = io.BytesIO()
    torch.save(data, buf)
    write_bytes(path, buf.getvalue())  # write-then-rename: two evals of one baseline never see half a file
    return data, False


def _read_cache(path, n_windows: int) -> dict | None:
    """A cached baseline pass, or None when absent or damaged (then the pass is redone)."""

    if not path.is_file():
        return None
    try:
        data = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        return None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), torch.Tensor) and len(data[k]) == n_windows
        for k in (*REFERENCE_KEYS, *(k for k in ("hidden", HEAD_CHECKED) if k in data))
    ):
        return None
    return data


@dataclass
class TokenStats:
    """Per scored position of every window, back to back (window_len = seq_len - 1 each): the
    model's NLL of the true token, the baseline's, KL(base || model), whether the argmaxes agree."""

    nll: np.ndarray
    nll_base: np.ndarray
    kl: np.ndarray
    agree: np.ndarray
    window_len: int

    def figures(self) -> dict:
        return summarize(self.nll, self.nll_base, self.kl, self.agree, self.window_len)

    def buckets(self, edges) -> list[dict]:
        return position_buckets(self.nll, self.nll_base, self.kl, self.agree, self.window_len, edges)


def topk_references(base: dict):
    """j -> window j's record from the cached pass: what the top-k bound compares with."""
    return lambda j: {k: base[k][j] for k in REFERENCE_KEYS}


def exact_references(base: dict, head):
    """j -> window j's record with `base_rows`: the baseline's whole-vocabulary rows recomputed a
    chunk of positions at a time by its output layer `head` from the pass's `hidden`
    (scorers/transformers_scorer.py OutputHead), which stats.window_stats turns into the exact KL."""
    return lambda j: {**{k: base[k][j] for k in REFERENCE_KEYS}, "base_rows": head.rows(base["hidden"][j])}


def score(
    model, windows: Windows, reference, progress=None, batch_size: int = 1, runtime: Runtime = ONE_PROCESS
) -> TokenStats:
    """Compare `model` (a scorer, or a transformers model) with the baseline on the same windows;
    `reference(j)` is window j's baseline record (topk_references, exact_references). Under torchrun
    (`runtime`) each rank scores its share of the windows, gathered in window order."""
    nll, nll_b, kl, agree = [], [], [], []
    mine = runtime.share(len(windows.tokens))
    refs = [reference(j) for j in mine]
    for i, ref, stats in zip(mine, refs, scorer_of(model, batch_size).compare([windows.tokens[j] for j in mine], refs)):
        nll.append(stats["nll"])
        nll_b.append(ref["nll"].numpy())
        kl.append(stats["kl"])
        agree.append(stats["agree"])
        if progress:
            progress(i + 1)
    nll, nll_b, kl, agree = (np.concatenate(runtime.gather(a)) for a in (nll, nll_b, kl, agree))
    return TokenStats(nll.astype(np.float64), nll_b.astype(np.float64), kl, agree, windows.seq_len - 1)


def self_score(base: dict, windows: Windows) -> TokenStats:
    """The baseline against itself, from its cached pass: KL 0 and agreement 1 by construction."""
    nll_b = base["nll"].reshape(-1).numpy().astype(np.float64)
    return TokenStats(nll_b, nll_b, np.zeros_like(nll_b), np.ones_like(nll_b, dtype=bool), windows.seq_len - 1)
