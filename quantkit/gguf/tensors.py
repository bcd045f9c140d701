"""One planned tensor -> its GGUF bytes, checked with the gguf package's own dequantization.

Every tensor is dequantized back with `gguf.quants.dequantize` (the reference the gguf package
shares with ggml) before it is written and compared with the artifact's exact weight, (q - z) * s
(float32), or for FP4 q * s (/ g) (float64; an NVFP4 weight's dequantized blocks times its F32
`.scale`, as llama.cpp computes it): a tensor planned as exact that does not come back bit for bit
stops the export.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from quantkit.gguf import grids
from quantkit.gguf.artifact import Artifact
from quantkit.gguf.tensor_map import TensorPlan

ROW_CHUNK_ELEMS = 1 << 24  # pack and check this many weights at a time (bounds the float32 copies)


class ExactnessFault(RuntimeError):
    """A tensor planned as exact did not dequantize to the artifact's weight: a bug, not bad input."""


def _permute(x: torch.Tensor | None, heads: int | None) -> torch.Tensor | None:
    return x if x is None or heads is None else grids.rope_permute(x, heads)


def column_weights(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, g_idx: torch.Tensor | None
) -> torch.Tensor:
    """The artifact's own float32 weight for any group layout (each column's group by g_idx or position)."""
    rows, cols = codes.shape
    n_groups = scale.shape[1]
    col_group = g_idx.reshape(-1).long() if g_idx is not None else torch.arange(cols) * n_groups // cols
    w = codes.to(torch.float32)
    if zero is not None:
        w = w - zero.to(torch.float32)[:, col_group]
    return w * scale.to(torch.float32)[:, col_group]


def _pack(qtype: str, codes, d, z) -> np.ndarray:
    if qtype == "Q4_0":
        return grids.pack_q4_0(codes, d)
    if qtype == "Q4_1":
        return grids.pack_q4_1(codes, d, z, grids.q4_1_offsets(codes, d, z)[0])
    return grids.pack_q8_0(codes, d)


class Check:
    """Running max |difference| and relative RMS error between written and artifact weights."""

    def __init__(self):
        self.max_abs = 0.0
        self.err2 = 0.0
        self.ref2 = 0.0

    def add(self, data: np.ndarray, qtype: str, ref: torch.Tensor, multiplier: float | None = None) -> None:
        """`multiplier`: the per-tensor F32 factor llama.cpp applies after the matmul (NVFP4's .scale);
        the reference is then compared in float64, as it was computed."""
        back = torch.from_numpy(
            np.asarray(gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, qtype)), dtype=np.float32)
        )
        if multiplier is None:
            diff = (back.reshape(ref.shape) - ref.to(torch.float32)).double()
        else:
            diff = back.reshape(ref.shape).double() * multiplier - ref.double()
        self.max_abs = max(self.max_abs, float(diff.abs().max()) if diff.numel() else 0.0)
        self.err2 += float((diff * diff).sum())
        self.ref2 += float((ref.double() ** 2).sum())

    def result(self) -> dict:
        return {"max_abs_diff": self.max_abs, "rel_rmse": (self.err2 / self.ref2) ** 0.5 if self.ref2 else 0.0}


def _grid_tensor(art: Artifact, plan: TensorPlan, check: Check) -> np.ndarray:
    qw = art.quant_weight(plan.module)
    rows, cols = qw.codes.shape
    blocks = grids.block_map(cols, qw.scale.shape[1], qw.g_idx)
    d = _permute(grids.expand(qw.scale.to(torch.float32), blocks), plan.permute)
    z = _permute(grids.expand(qw.zero, blocks), plan.permute) if qw.zero is not None else None
    codes = _permute(qw.codes, plan.permute)
    step = max(1, ROW_CHUNK_ELEMS // cols)
    parts = []
    for r in range(0, rows, step):
        sl = slice(r, r + step)
        zs = z[sl] if z is not None else None
        data = _pack(plan.qtype, codes[sl], d[sl], zs)
        check.add(data, plan.qtype, grids.dequantize_codes(codes[sl], d[sl], zs))
        parts.append(data)
    return np.concatenate(parts, axis=0)


def _fp4_tensor(art: Artifact, plan: TensorPlan, check: Check) -> np.ndarray:
    """MXFP4 or NVFP4 bytes from the artifact's codes and scale bytes, rows permuted as planned."""
    fw = art.fp4_weight(plan.module)
    codes, scales = _permute(fw.codes, plan.permute), _permute(fw.scale_bytes, plan.permute)
    ref = _permute(fw.weight(), plan.permute)
    multiplier = None if fw.global_scale is None else grids.inverse_f32(fw.global_scale)
    pack = grids.pack_mxfp4 if plan.qtype == "MXFP4" else grids.pack_nvfp4
    step = max(1, ROW_CHUNK_ELEMS // codes.shape[1])
    parts = []
    for r in range(0, codes.shape[0], step):
        data = pack(codes[r : r + step], scales[r : r + step])
        check.add(data, plan.qtype, ref[r : r + step], multiplier)
        parts.append(data)
    return np.concatenate(parts, axis=0)


def _global_scale_tensor(art: Artifact, plan: TensorPlan, check: Check) -> np.ndarray:
    """NVFP4's global scale g as llama.cpp's per-tensor multiplier, 1/g in float32 (the value
    llama.cpp's own converter writes); checked against 1/g in float64."""
    g = art.fp4_weight(plan.source[: -len(".weight_global_scale")], codes=False).global_scale
    data = np.array([grids.inverse_f32(g)], dtype=np.float32)
    check.add(data, "F32", torch.tensor([1.0 / g], dtype=torch.float64), multiplier=1.0)
    return data


def _requant_tensor(art: Artifact, plan: TensorPlan, check: Check) -> np.ndarray:
    qw = art.quant_weight(plan.module)
    w = _permute(column_weights(qw.codes, qw.scale, qw.zero, qw.g_idx), plan.permute)
    data = gguf.quants.quantize(w.numpy(), getattr(gguf.GGMLQuantizationType, plan.qtype))
    check.add(data, plan.qtype, w)
    return data


def _dense_tensor(art: Artifact, plan: TensorPlan, check: Check) -> np.ndarray:
    t = _permute(art.tensor(plan.source), plan.permute)
    if plan.how == "quantize":
        w = t.to(torch.float32)
        data = gguf.quants.quantize(w.numpy(), getattr(gguf.GGMLQuantizationType, plan.qtype))
    elif plan.qtype == "F32":
        data = t.to(torch.float32).contiguous().numpy()
    elif plan.qtype == "F16":
        data = t.contiguous().numpy()
    else:  # BF16: numpy has no bfloat16; the raw 16-bit patterns are what GGUF stores
        data = t.contiguous().view(torch.int16).numpy()
    check.add(data.view(np.uint8).reshape(*data.shape[:-1], -1) if plan.qtype == "BF16" else data, plan.qtype, t)
    return data


def tensor_bytes(art: Artifact, plan: TensorPlan) -> tuple[np.ndarray, dict]:
    """The tensor's bytes as GGUF stores them (uint8, [rows, bytes per row]) and its check."""
    check = Check()
    if plan.qtype in ("MXFP4", "NVFP4"):
        data = _fp4_tensor(art, plan, check)
    elif plan.how == "inverse-global-scale":
        data = _global_scale_tensor(art, plan, check)
    elif plan.how in ("grid", "round-scales"):
        data = _grid_tensor(art, plan, check)
    elif plan.how == "requant":
        data = _requant_tensor(art, plan, check)
    else:
        data = _dense_tensor(art, plan, check)
    result = check.result()
    if plan.exact and result["max_abs_diff"] != 0.0:
        raise ExactnessFault(
            f"{plan.source} -> {plan.name} ({plan.qtype}) planned as exact differs by "
            f"{result['max_abs_diff']:.3g} after gguf dequantization"
        )
    flat = np.ascontiguousarray(data).view(np.uint8)
    return flat.reshape(*plan.shape[:-1], -1), result
