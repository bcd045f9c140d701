#!/usr/bin/env python3
"""AutoRound's CPU cost, from a timed partial run: its preset on the first LAYERS decoder layers of
a model, extrapolated to all of them. A full light run of the 135M demo takes about an hour of a
CPU core, so the speed check is a partial one (docs/PERFORMANCE.md, "INT4 methods beyond GPTQ").
CPU seconds are reported beside wall time: at one thread they are about the quiet machine's wall
time, whatever else runs.

  OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_autoround.py --layers 2 --preset light \\
      --text file:../shared/data/wikitext2-valid.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers to tune (the first N)")
    ap.add_argument("--preset", default="light", choices=("light", "default", "best"))
    ap.add_argument("--samples", type=int, default=64, help="calibration windows (512 tokens)")
    ap.add_argument("--text", required=True, help="calibration text SPEC; its second half is read")
    args = ap.parse_args()

    import torch

    from quantkit.data import calib
    from quantkit.methods import llmc
    from quantkit.models.checkpoint import load_model, load_tokenizer, resolve_model
    from quantkit.recipe.schema import recipe_from_dict

    src = resolve_model(args.model)
    tok = load_tokenizer(src)
    model = load_model(src, dtype="bfloat16")
    total = len(model.model.layers)
    model.model.layers = model.model.layers[: args.layers]
    model.config.num_hidden_layers = args.layers
    cs = calib.build(src, tok, args.text, samples=args.samples, seq_len=512, seed=0, region="second-half", chat_template=False)
    cfg = recipe_from_dict({"steps": [{"quantize": {"method": "autoround", "preset": args.preset, "bits": 4,
                                                    "group_size": 64, "symmetric": True}}]}).steps[0].quantize
    t, c = time.perf_counter(), time.process_time()
    llmc.quantize(model, cfg, cs.samples)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"threads": torch.get_num_threads(), "preset": args.preset, "iters": cfg.iters, "lr": cfg.lr,
                      "samples": cfg.resolved_samples(args.samples), "layers": args.layers, "model_layers": total,
                      "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cpu_s_per_layer": round(cpu / args.layers, 1),
                      "extrapolated_cpu_min": round(cpu / args.layers * total / 60, 1)}))


if __name__ == "__main__":
    main()
