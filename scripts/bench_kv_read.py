#!/usr/bin/env python3
"""What the compiled engine's KV cache costs per decode step, before and after issue 15 A2.

Before: transformers' sdpa attention (K/V expanded to the query heads by `repeat_kv`, a copy,
because a static cache always passes a mask) over a cache sized to the longest sweep prompt.
After: quantkit's decode attention at the KV heads' width over a cache sized to the timed
sequence. Both on the demo's shape with 3 KV heads and with 1 (random bf16 weights: speed only),
the same process and minute, so the four TPOTs compare as ratios.

  flock /tmp/qk-cpu.lock .venv/bin/python scripts/bench_kv_read.py --prompt-len 1024 --gen-len 32 --sweep-max 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from quantkit.bench.accounting import kv_static
from quantkit.bench.engines import engine_class
from quantkit.bench.engines.base import EngineSettings
from quantkit.bench.harness import Clock
from quantkit.bench.synthetic import Synthetic
from quantkit.core.hardware import SHAPES


def tpot_ms(engine, prompt: list[int], gen_len: int, capacity: int, repeats: int) -> float:
    """Median over repeats of the mean decode step (one untimed warm-up run first)."""
    clock, ids, out = Clock(engine), engine.prepare(prompt), []
    for rep in range(repeats + 1):
        engine.reset(capacity)
        tok = engine.prefill(ids)
        t0 = clock.now()
        for i in range(gen_len - 1):
            tok = engine.decode(tok, len(prompt) + i)
        if rep:
            out.append((clock.now() - t0) / (gen_len - 1) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--sweep-max", type=int, default=2048, help="the longest sweep prompt the old cache was sized to")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qk-kvread-"))
    prompt = torch.randint(0, 49152, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    for kv_heads in (3, 1):
        cfg = {"model_type": "llama", **SHAPES["smollm2-135m"], "num_key_value_heads": kv_heads, "max_position_embeddings": 8192}
        (tmp / f"kv{kv_heads}.json").write_text(json.dumps(cfg))
        settings = EngineSettings(device=torch.device("cpu"), max_tokens=args.sweep_max + args.gen_len)
        for mode in ("before", "after"):
            engine = engine_class("compiled").load(Synthetic(str(tmp / f"kv{kv_heads}.json")), settings)
            if mode == "before":
                engine.model.set_attn_implementation("sdpa")  # transformers' own: repeat_kv under a mask
                cap = args.sweep_max + args.gen_len + 1
            else:
                cap = args.prompt_len + args.gen_len
            kv = engine.kv_bytes_per_token()
            groups = 9 // kv_heads
            # before: the expansion reads K/V (kv heads), writes and re-reads them at 9 heads; after: kv_static
            kv_read = kv * cap * (1 + 2 * groups) if mode == "before" and groups > 1 else kv_static(kv, cap)
            t = tpot_ms(engine, prompt, args.gen_len, cap, args.repeats)
            rows.append({"kv_heads": kv_heads, "mode": mode, "cache_tokens": cap, "weights_mb": engine.weight_bytes()["weight_bytes_per_token"] / 1e6,
                         "kv_mb_per_step": kv_read / 1e6, "tpot_ms": t})
            engine.close()
    print(f"demo shape, compiled engine, prompt {args.prompt_len}, {args.gen_len} tokens, {torch.get_num_threads()} threads")
    print("| KV heads | attention / cache | cache tokens | weights MB | KV MB per step | TPOT ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        what = "repeat_kv, sized to the sweep" if r["mode"] == "before" else "KV-width decode, sized per measurement"
        print(f"| {r['kv_heads']} | {what} | {r['cache_tokens']} | {r['weights_mb']:.1f} | {r['kv_mb_per_step']:.1f} | {r['tpot_ms']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
