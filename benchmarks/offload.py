#!/usr/bin/env python3
"""Peak memory of `quantkit convert` with and without disk offloading, on a model whose weights
dominate the process (the demo's weights are small beside what torch and the libraries take).

Builds a random-weight Llama checkpoint (default: 24 layers, hidden 2048, about 1.4 B parameters
at fp16 = 2.9 GB) in a temp dir, then converts it with RTN W4 g64 twice, each in its own
process: as is, and with --max-memory. Prints wall time, peak RSS and what was offloaded.

  python benchmarks/offload.py --max-memory 500MB
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
Q = REPO / ".venv" / "bin" / "quantkit"


def build(out: Path, layers: int, hidden: int) -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from quantkit.models.resolve import resolve_path

    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 256,
        vocab_size=49152,
        tie_word_embeddings=True,
        dtype="float16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float16)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(resolve_path("demo"))).save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--max-memory", default="500MB")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qk-offload-"))
    try:
        n = build(work / "src", args.layers, args.hidden)
        print(f"model: {n / 1e9:.2f} B parameters, {n * 2 / 1e9:.2f} GB at fp16", file=sys.stderr)
        rows = []
        for label, extra in [("in RAM", []), (f"--max-memory {args.max_memory}", ["--max-memory", args.max_memory])]:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run(
                [
                    sys.executable,
                    str(REPO / "benchmarks" / "rss.py"),
                    str(REPO / "recipes" / "int4-w4a16-rtn.yaml"),
                    "--model",
                    str(work / "src"),
                    "--out",
                    str(out),
                    *extra,
                    "--json",
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                raise SystemExit(f"{label}: {proc.stderr.strip().splitlines()[-1]}")
            m = json.loads(proc.stdout)
            phases = json.loads(proc.stderr.strip().splitlines()[-1])
            after_load = next(p["rss_mb_at_end"] for p in phases["phases"] if p["phase"].startswith("loading"))
            rows.append((label, m["wall_seconds"], phases, after_load, m["offload"], m["verification"]["mean_kl"]))
        print("| load | wall s | peak RSS MB (phase) | RSS after loading MB | offloaded | verification mean KL |")
        print("|---|---|---|---|---|---|")
        for label, wall, ph, after_load, off, kl in rows:
            where = f"{off['disk_tensors']} tensors on disk, {off['cpu_bytes'] / 1e6:.0f} MB in RAM" if off else "—"
            print(
                f"| {label} | {wall:.1f} | {ph['peak_mb']:.0f} ({ph['peak_phase']}) "
                f"| {after_load:.0f} | {where} | {kl:.2g} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
