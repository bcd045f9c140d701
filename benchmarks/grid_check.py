#!/usr/bin/env python3
"""Do a checkpoint's linear weights still lie on a 4-bit grid, as they are and after a rotation?

The demo is built from a Q4_1 GGUF (w = d*u + m per block of 32, float minimum m), so its weights
sit exactly on that grid and a quantizer that re-finds it looks better than it is. A dense
rotation of the input dimension (what SpinQuant's R1 does before quantization) mixes every block,
and a rotated weight should then quantize like Gaussian weights of the same row spread. This
prints the mean relative round-to-nearest error ||Q(W) - W|| / ||W|| over the decoder-layer
linears for: Q4_1's grid (group 32, float minimum), asymmetric INT4 with an integer zero point
(compressed-tensors', groups 32 and 64) and symmetric INT4 (group 64), each for the weights as
they are, after a random orthogonal rotation of the input dimension, and for Gaussian weights
with each row's standard deviation.

  python benchmarks/grid_check.py --model demo
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantkit.quiet import quiet_libraries  # noqa: E402

quiet_libraries()  # as the CLI does: no third-party import chatter
from quantkit.methods.schemes import Scheme  # noqa: E402
from quantkit.quantize.sensitivity import fake_quant  # noqa: E402

# name -> (group, kind); kind: "float-min" (Q4_1: group 32 only), "asym" (integer zero point), "sym"
GRIDS = {
    "Q4_1 g32 (float minimum)": (32, "float-min"),
    "asym g32 (integer zero)": (32, "asym"),
    "asym g64": (64, "asym"),
    "sym g64": (64, "sym"),
}


def rtn_relative_error(w: torch.Tensor, group: int, kind: str) -> float:
    """Round to nearest on a grid: Q4_1 through gguf-py's own quantizer (llama.cpp's reference),
    the INT4 grids through compressed-tensors' min-max qparams and fake quantizer."""
    if kind == "float-min":
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize, quantize

        x = w.float().numpy()
        q = torch.from_numpy(dequantize(quantize(x, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1))
    else:
        q = fake_quant(w.float(), Scheme(4, group, symmetric=kind == "sym"))
    return ((q - w).norm() / w.norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="a model directory or quantkit's name for one")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from safetensors.torch import load_file

    from quantkit.models.resolve import resolve_path

    gen = torch.Generator().manual_seed(args.seed)
    path = resolve_path(args.model, pull=False)
    weights = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update({k: v for k, v in load_file(f).items() if ".layers." in k and k.endswith("proj.weight")})
    rotations: dict[int, torch.Tensor] = {}
    errors: dict[tuple[str, str], list[float]] = {}
    for w in weights.values():
        w = w.float()
        cols = w.shape[1]
        if cols not in rotations:
            rotations[cols] = torch.linalg.qr(torch.randn(cols, cols, dtype=torch.float64, generator=gen))[0].float()
        variants = {
            "as is": w,
            "rotated": w @ rotations[cols],
            "Gaussian": torch.randn(w.shape, generator=gen) * w.std(dim=1, keepdim=True),
        }
        for label, m in variants.items():
            for grid, (group, kind) in GRIDS.items():
                if cols % group == 0:
                    errors.setdefault((label, grid), []).append(rtn_relative_error(m, group, kind))
    print(f"{path}: {len(weights)} decoder-layer linears; mean relative RTN error ||Q(W) - W|| / ||W||")
    print("| weights | " + " | ".join(GRIDS) + " |\n|---|" + "---|" * len(GRIDS))
    for label in ("as is", "rotated", "Gaussian"):
        cells = [errors.get((label, g)) for g in GRIDS]
        print(f"| {label} | " + " | ".join(f"{sum(c) / len(c):.4f}" if c else "n/a" for c in cells) + " |")


if __name__ == "__main__":
    main()
