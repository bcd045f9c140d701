#!/usr/bin/env python3
"""Which parts of a model to keep at 8 bits: RTN sensitivity per vLLM-fusable unit.

For every decoder layer and each unit vLLM serves as one kernel (q/k/v fused as qkv_proj,
gate/up as gate_up_proj, o_proj, down_proj), fake-quantize that unit alone to INT4 (RTN,
symmetric, group G) and measure the mean KL against the FP model on held-out windows. A greedy
pick by KL per extra bit then fills a bits-per-weight budget with 8-bit units; it prints the
`overrides:` block for a recipe. Units are never split: vLLM refuses a fused layer whose shards
have different schemes.

  .venv/bin/python scripts/sensitivity.py --text ../shared/data/wikitext2-valid.txt --budget 4.5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

UNITS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
         "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def fake_int4(w, group: int):
    """RTN INT4, symmetric, per group: compressed-tensors' own min-max qparams and fake quantizer."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    from quantkit.methods.llmc import weight_args

    args = weight_args(4, group, True)
    g = w.float().reshape(w.shape[0], -1, group)
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
    return fake_quantize(w.float(), scale, zp, args).to(w.dtype)


def main() -> None:
    import torch

    from quantkit.evals.stats import kl_full
    from quantkit.models import load_model, load_tokenizer, resolve_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--text", required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--budget", type=float, default=4.5, help="average bits per weight over the decoder linears")
    ap.add_argument("--units", default=",".join(UNITS), help="candidate units, comma-separated (qkv,o,gate_up,down)")
    args = ap.parse_args()

    src = resolve_model(args.model)
    tok = load_tokenizer(src)
    model = load_model(src, dtype="float32")
    ids = tok(Path(args.text).read_text(), return_tensors="pt").input_ids[0]
    start = ids.shape[0] // 2  # the calibration half: quantkit eval reads the first half, keep it held out
    rows = torch.stack([ids[start + i * args.seq_len: start + (i + 1) * args.seq_len] for i in range(args.windows)])

    def logp():
        with torch.inference_mode():
            return torch.log_softmax(model(input_ids=rows, use_cache=False).logits.float(), -1)

    ref = logp()
    layers = model.model.layers
    n_weights = sum(layer.get_submodule(m).weight.numel() for layer in layers for names in UNITS.values() for m in names)
    results = []
    candidates = {u: UNITS[u] for u in args.units.split(",")}
    for i, layer in enumerate(layers):
        for unit, names in candidates.items():
            mods = [layer.get_submodule(m) for m in names]
            saved = [m.weight.data.clone() for m in mods]
            for m in mods:
                m.weight.data = fake_int4(m.weight.data, args.group)
            kl = float(kl_full(ref, logp()).mean())
            for m, w in zip(mods, saved):
                m.weight.data = w
            size = sum(w.numel() for w in saved)
            results.append({"layer": i, "unit": unit, "weights": size, "kl": kl})
            print(f"layer {i:2d} {unit:8s} KL {kl:.4f}", file=sys.stderr)

    base = 4 + 16 / args.group  # INT4 + an fp16 scale per group
    eight = 8 + 16 / model.config.hidden_size  # INT8 per channel (approximately)
    spare = (args.budget - base) * n_weights
    picked, used = [], 0.0
    for r in sorted(results, key=lambda r: r["kl"] / r["weights"], reverse=True):
        cost = (eight - base) * r["weights"]
        if used + cost <= spare:
            picked.append(r)
            used += cost
    bpw = base + used / n_weights
    print(json.dumps({"ranking": sorted(results, key=lambda r: -r["kl"])[:20], "picked": picked, "bits_per_weight": bpw}, indent=1))
    print(f"# {len(picked)} units at INT8, {bpw:.3f} bits/weight")
    print("overrides:")
    for unit, names in UNITS.items():
        chosen = sorted(r["layer"] for r in picked if r["unit"] == unit)
        if chosen:
            layers_re = "|".join(map(str, chosen))
            mods = "|".join(m.split(".")[-1] for m in names)
            parent = names[0].split(".")[0]
            print(f'  - targets: ["model\\\\.layers\\\\.({layers_re})\\\\.{parent}\\\\.({mods})$"]\n    bits: 8\n    group_size: -1')


if __name__ == "__main__":
    main()
