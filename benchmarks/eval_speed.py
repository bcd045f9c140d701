#!/usr/bin/env python3
"""Eval speed: scoring a model against a cached baseline vs one bare forward pass over the same tokens.

  python benchmarks/eval_speed.py --model ARTIFACT --baseline demo --text TEXT.txt --windows 64

The target: scoring within 1.3x of the bare forward pass when the baseline is cached.
"""

from __future__ import annotations

import argparse
import time

import torch

from quantkit.data.text import parse_spec
from quantkit.evals.perplexity import cached_baseline, score, text_windows, topk_references, vocab_fingerprint
from quantkit.models.checkpoint import checkpoint_hash, load_model, load_tokenizer
from quantkit.models.resolve import resolve_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--baseline", default="demo")
    ap.add_argument("--text", required=True)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    mp, bp = resolve_path(args.model), resolve_path(args.baseline)
    tok = load_tokenizer(bp)
    w = text_windows(
        tok,
        parse_spec(f"file:{args.text}"),
        seq_len=args.seq_len,
        max_tokens=args.windows * args.seq_len,
        region="first-half",
    )
    t = time.perf_counter()
    base, hit = cached_baseline(
        lambda: load_model(bp, dtype=args.dtype), checkpoint_hash(bp), w, vocab_fingerprint(tok), args.dtype
    )
    base_s = time.perf_counter() - t
    model = load_model(mp, dtype=args.dtype)
    with torch.inference_mode():
        model(input_ids=w.tokens[0].unsqueeze(0), use_cache=False)  # warm-up (first-forward decompression etc.)
        t = time.perf_counter()
        for ids in w.tokens:
            model(input_ids=ids.unsqueeze(0), use_cache=False)
        bare = time.perf_counter() - t
    t = time.perf_counter()
    result = score(model, w, topk_references(base)).figures()
    scored = time.perf_counter() - t
    print(f"{len(w.tokens)} x {args.seq_len} tokens, {args.dtype}, {torch.get_num_threads()} threads")
    print(f"baseline pass: {base_s:.1f} s ({'cached' if hit else 'computed and cached'})")
    print(
        f"bare forward: {bare:.1f} s; scoring against the cached baseline: {scored:.1f} s; "
        f"ratio {scored / bare:.3f} (target <= 1.3)"
    )
    print(
        f"PPL {result['ppl']:.3f} (baseline {result['baseline_ppl']:.3f}), "
        f"KL {result['kld']['mean']:.4f} (the top-256 bound)"
    )


if __name__ == "__main__":
    main()
