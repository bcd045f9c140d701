#!/usr/bin/env python3
"""Decode-time ceiling of the matmul kernels alone: one token through every linear layer of a
model shape (distinct weights, so they stream from memory as in decode), per kernel.

Prints, per kernel, the time for all linears of one decode step and the bandwidth it implies
(stored bytes ÷ time), next to a plain memory read of the same size. When a kernel's figure is
far below the read bandwidth, no engine around it can reach the roofline: the kernel is the
limit. Compare within one run: on a shared machine the read bandwidth moves between runs.

  python benchmarks/kernels.py --shape smollm2-135m --repeats 10
"""

from __future__ import annotations

import argparse
import time

import torch

from quantkit.bench import kernels
from quantkit.core.hardware import SHAPES, shape_config
from quantkit.core.roofline import Shape


def linear_shapes(shape: Shape) -> list[tuple[int, int]]:
    """(out, in) of every per-layer linear in one decode step (the lm_head stays 16-bit and is left out)."""
    return list(shape.linears().values()) * shape.layers


def timed(step, repeats: int) -> float:
    step()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="smollm2-135m", help=f"one of {', '.join(SHAPES)} or a config.json")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=64)
    args = ap.parse_args()
    shape = Shape.from_config(shape_config(args.shape))
    shapes = linear_shapes(shape)
    g = torch.Generator().manual_seed(0)
    rows = []

    dense = [torch.randn(o, i, generator=g).to(torch.bfloat16) for o, i in shapes]
    xs = {i: torch.randn(1, i, generator=g).to(torch.bfloat16) for _, i in shapes}
    nbytes = sum(w.numel() * 2 for w in dense)
    rows.append(
        (
            "bf16 dense (F.linear, oneDNN)",
            nbytes,
            timed(lambda dense=dense: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in dense], args.repeats),
        )
    )
    flat = torch.cat([w.reshape(-1) for w in dense])
    rows.append(("memory read (sum of the same bytes)", nbytes, timed(lambda flat=flat: flat.sum(), args.repeats)))
    del dense, flat

    int8 = [
        kernels.Int8WeightOnlyLinear(
            torch.randint(-128, 128, (o, i), dtype=torch.int8, generator=g), torch.rand(o, 1) * 0.01, None, None, "cpu"
        )
        for o, i in shapes
    ]
    rows.append(
        (
            "int8 weight-only (aten._weight_int8pack_mm)",
            sum(m.weight.numel() + m.scales.numel() * 2 for m in int8),
            timed(lambda int8=int8: [m(xs[m.in_features]) for m in int8], args.repeats),
        )
    )
    del int8

    gs = args.group_size
    int4 = [
        kernels.Int4WeightOnlyLinear(
            torch.randint(-8, 8, (o, i), dtype=torch.int8, generator=g),
            torch.rand(o, i // gs) * 0.05,
            None,
            gs,
            None,
            "cpu",
        )
        for o, i in shapes
    ]
    rows.append(
        (
            f"int4 weight-only g{gs} (aten._weight_int4pack_mm_for_cpu)",
            sum(m.weight.numel() + m.scales_and_zeros.numel() * 2 for m in int4),
            timed(lambda: [m(xs[m.in_features]) for m in int4], args.repeats),
        )
    )

    print(
        f"{args.shape}: {len(shapes)} linears per decode step (lm_head not included), {torch.get_num_threads()} threads"
    )
    print("| kernel | MB per step | ms per step (best of %d) | GB/s |" % args.repeats)
    print("|---|---|---|---|")
    for name, b, s in rows:
        print(f"| {name} | {b / 1e6:.1f} | {s * 1e3:.2f} | {b / s / 1e9:.1f} |")


if __name__ == "__main__":
    main()
