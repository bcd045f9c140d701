"""The exact grid mapping, pure math: compressed-tensors integer codes and scales -> ggml blocks.

compressed-tensors stores w = (q - z) * s with q, z in [-2^(b-1), 2^(b-1) - 1] and one (s, z) per
output row and group of input columns (compressed_tensors/quantization/lifecycle/forward_helpers.py,
`_dequantize`). ggml's blocks run along the input dimension too, 32 values each (ggml-common.h):

    Q4_0  {fp16 d; 16 bytes}        w = d * (u - 8),  u in [0, 15]   byte j: u[j] | u[j + 16] << 4
    Q4_1  {fp16 d; fp16 m; 16 bytes} w = d * u + m
    Q8_0  {fp16 d; int8 q[32]}       w = d * q

So symmetric INT4 -> Q4_0 with d = s, u = q + 8; symmetric INT8 -> Q8_0 with d = s. Asymmetric
INT4 -> Q4_1 with d = s, u = q - z + c and m = -s * c for any integer c that keeps u in [0, 15]:
d*u + m = s*(q - z). c = z + 8 always fits (q in [-8, 7]); it is the only choice when a block uses
all 16 codes, and then m = -s*(z + 8) may not be an fp16 value; any other c that fits the block's
codes and makes m exact is taken instead. Each mapping is exact iff every group is a whole number
of 32-column blocks and d and m are fp16 values: the sums and products are then exact in float32
(integers of at most 16 bits times one fp16 scale).
"""

from __future__ import annotations

import numpy as np
import torch

QK = 32  # values per ggml block for Q4_0, Q4_1, Q8_0 (ggml-common.h: QK4_0 = QK4_1 = QK8_0 = 32)


class NotExact(ValueError):
    """The integer grid of a tensor has no exact ggml counterpart; the message says why."""


def block_map(cols: int, n_groups: int, g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """For each 32-column block, the index of the (scale, zero) group it takes.

    Without g_idx, group k covers columns [k*g, (k+1)*g) with g = cols / n_groups (a channel
    scale is one group of all columns). With g_idx (column -> group, as older act-order artifacts
    store it), every block's 32 columns must share one group."""
    if cols % QK:
        raise NotExact(f"{cols} input columns are not a multiple of {QK} (ggml's block size)")
    n_blocks = cols // QK
    if g_idx is None:
        if n_groups < 1 or cols % n_groups:
            raise NotExact(f"{n_groups} groups do not divide {cols} columns")
        width = cols // n_groups
        if width % QK:
            raise NotExact(f"group size {width} is not a multiple of {QK}")
        return torch.arange(n_blocks) * QK // width
    g = g_idx.reshape(-1).to(torch.int64)
    if g.numel() != cols or int(g.min()) < 0 or int(g.max()) >= n_groups:
        raise NotExact(
            f"g_idx has {g.numel()} entries in [{int(g.min())}, {int(g.max())}] "
            f"for {cols} columns and {n_groups} groups"
        )
    per_block = g.reshape(n_blocks, QK)
    if not bool((per_block == per_block[:, :1]).all()):
        raise NotExact("act-order g_idx gives columns of one 32-column block different groups (groups are permuted)")
    return per_block[:, 0].clone()


def expand(per_group: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """[rows, n_groups] -> [rows, n_blocks]: each block's group value."""
    return per_group.reshape(per_group.shape[0], -1)[:, blocks]


def fp16_inexact(x: torch.Tensor) -> int:
    """How many values of x change when rounded to fp16 (non-finite values count too)."""
    return int((~_exact16(x.to(torch.float32))).sum())


def _exact16(x: torch.Tensor) -> torch.Tensor:
    back = x.to(torch.float16).to(torch.float32)
    return torch.isfinite(back) & (back == x)


def q4_1_offsets(codes: torch.Tensor, d: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Per 32-column block the offset c of Q4_1's u = q - z + c, m = -d*c: z + 8 where m is then an fp16
    value, else another c that keeps the block's codes in [0, 15] and makes m exact. Returns c and the
    number of blocks where no c makes m exact (those keep z + 8, and m is rounded)."""
    rows, cols = codes.shape
    q = codes.to(torch.int32).reshape(rows, cols // QK, QK)
    z = zero.to(torch.int32)
    lo, hi = z - q.min(-1).values, 15 + z - q.max(-1).values  # u = q - z + c in [0, 15] for every code
    d32 = d.to(torch.float32)
    c = z + 8
    ok = _exact16(-d32 * c)
    for cand in range(-15, 31):  # q - z spans [-15, 15], so every usable c lies here
        fix = ~ok & (lo <= cand) & (cand <= hi) & _exact16(-d32 * cand)
        c = torch.where(fix, torch.full_like(c, cand), c)
        ok |= fix
    return c, int((~ok).sum())


def _fp16_bytes(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.float16).contiguous().numpy().view(np.uint8).reshape(*x.shape, 2)


def _nibbles(u: np.ndarray) -> np.ndarray:
    """[rows, n_blocks, 32] values in [0, 15] -> [rows, n_blocks, 16] bytes (value j low, j+16 high)."""
    return (u[..., : QK // 2] | (u[..., QK // 2 :] << 4)).astype(np.uint8)


def _codes_blocks(codes: torch.Tensor) -> np.ndarray:
    rows, cols = codes.shape
    return codes.to(torch.int16).numpy().reshape(rows, cols // QK, QK)


def pack_q4_0(codes: torch.Tensor, d: torch.Tensor) -> np.ndarray:
    """Symmetric 4-bit codes q in [-8, 7] [rows, cols] and per-block d [rows, cols/32] -> Q4_0 bytes."""
    c = _codes_blocks(codes)
    if c.min(initial=0) < -8 or c.max(initial=0) > 7:
        raise NotExact("4-bit codes outside [-8, 7]")
    body = _nibbles((c + 8).astype(np.uint8))
    out = np.concatenate([_fp16_bytes(d), body], axis=-1)
    return out.reshape(codes.shape[0], -1)


def pack_q4_1(codes: torch.Tensor, d: torch.Tensor, zero: torch.Tensor, offset: torch.Tensor) -> np.ndarray:
    """Asymmetric 4-bit codes, per-block d, zero point and offset c (q4_1_offsets) -> Q4_1 bytes."""
    rows, cols = codes.shape
    u = _codes_blocks(codes) - zero.to(torch.int16).numpy()[..., None] + offset.to(torch.int16).numpy()[..., None]
    if u.min(initial=0) < 0 or u.max(initial=0) > 15:
        raise NotExact("Q4_1 codes outside [0, 15]")
    m = -d.to(torch.float32) * offset.to(torch.float32)
    out = np.concatenate([_fp16_bytes(d), _fp16_bytes(m), _nibbles(u.astype(np.uint8))], axis=-1)
    return out.reshape(rows, -1)


def pack_q8_0(codes: torch.Tensor, d: torch.Tensor) -> np.ndarray:
    """Symmetric 8-bit codes in [-128, 127] and per-block d -> Q8_0 bytes."""
    c = _codes_blocks(codes)
    if c.min(initial=0) < -128 or c.max(initial=0) > 127:
        raise NotExact("8-bit codes outside [-128, 127]")
    body = c.astype(np.int8).view(np.uint8)
    out = np.concatenate([_fp16_bytes(d), body], axis=-1)
    return out.reshape(codes.shape[0], -1)


def dequantize_codes(codes: torch.Tensor, d: torch.Tensor, zero: torch.Tensor | None = None) -> torch.Tensor:
    """The exact float32 weight (q - z) * s from codes and per-block scale/zero ([rows, n_blocks])."""
    rows, cols = codes.shape
    q = codes.to(torch.float32).reshape(rows, cols // QK, QK)
    if zero is not None:
        q = q - zero.to(torch.float32).unsqueeze(-1)
    return (q * d.to(torch.float32).unsqueeze(-1)).reshape(rows, cols)


def rope_permute(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF q/k rows (rotate_half pairs i, i + d/2) -> llama.cpp's interleaved pairs (2i, 2i + 1).

    The inverse of the permutation in transformers' convert_llama_weights_to_hf.py; llama.cpp's
    convert_hf_to_gguf.py (LlamaModel.permute) applies the same to Llama and Mistral q/k weights.
    It moves whole rows, so the per-row groups along the input dimension move with their rows."""
    rows = x.shape[0]
    if rows % (2 * n_head):
        raise NotExact(f"{rows} rows do not split into {n_head} heads of an even size")
    return x.reshape(n_head, 2, rows // n_head // 2, *x.shape[1:]).transpose(1, 2).reshape(x.shape)


def rope_unpermute(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of rope_permute (llama.cpp's row order back to HF's)."""
    rows = x.shape[0]
    return x.reshape(n_head, rows // n_head // 2, 2, *x.shape[1:]).transpose(1, 2).reshape(x.shape)


# ---- FP4 (E2M1 codes) -------------------------------------------------------------------------
#
# compressed-tensors packs two 4-bit codes per byte along each row, the even column in the low
# nibble (compressors/nvfp4/helpers.py pack_fp4_to_uint8); a code is sign (bit 3) and an index into
# E2M1's magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. ggml's kvalues_fp4 (ggml-common.h) are those values
# doubled under the same 16 indices, and its blocks store them as Q4_0 does, the block's first half
# in the low nibbles:
#
#     MXFP4 {uint8 e; uint8 qs[16]}      32 values  w = kvalues[u] * 2^(e - 128)   (ggml_e8m0_to_fp32_half)
#     NVFP4 {uint8 d[4]; uint8 qs[32]}   64 values  w = kvalues[u] * ue4m3(d[s]) / 2, s = the 16-value sub-block
#
# So MXFP4 -> MXFP4 keeps each code and each E8M0 exponent byte (compressed-tensors' scale is
# 2^(e - 127): compressors/mx_utils.py), and NVFP4's codes and E4M3 scale bytes carry over into
# ggml's NVFP4 four groups at a time (UE4M3 is E4M3 without its sign bit, 0x7F read as 0). Every
# product is a 2-bit significand times a power of two (MXFP4) or a 4-bit one (NVFP4): exact in
# float32. NVFP4's per-tensor scale is not in the block: llama.cpp multiplies the matmul's output
# by the tensor's F32 `.scale` (llama-graph.cpp build_lora_mm), where compressed-tensors divides
# each weight by its global scale g, so that part is exact only when 1/g is a float32 value.

QK_MXFP4 = 32  # ggml-common.h: QK_MXFP4
QK_NVFP4, QK_NVFP4_SUB = 64, 16  # ggml-common.h: QK_NVFP4, QK_NVFP4_SUB
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' packed FP4 [rows, cols/2] (uint8) -> codes [rows, cols] (uint8, 0..15)."""
    p = packed.to(torch.uint8)
    return torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)


def fp4_values(codes: torch.Tensor) -> torch.Tensor:
    """Codes -> their E2M1 values, float32 (code 8, negative zero, as 0)."""
    mags = torch.tensor(E2M1, dtype=torch.float32)[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -mags, mags)


def e8m0_values(e: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent bytes -> 2^(e - 127) in float64 (exact; 255, the format's NaN, as inf)."""
    x = torch.exp2(e.to(torch.float64) - 127)
    return torch.where(e.to(torch.int32) == 255, torch.full_like(x, float("inf")), x)


def e4m3_values(bits: torch.Tensor) -> torch.Tensor:
    """E4M3 scale bytes (uint8) -> their values, float64."""
    return bits.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)


def _halves(codes: np.ndarray, size: int) -> np.ndarray:
    """[..., n_blocks, size] codes -> [..., n_blocks, size/2] bytes: value j low, value j + size/2 high."""
    return (codes[..., : size // 2] | (codes[..., size // 2 :] << 4)).astype(np.uint8)


def pack_mxfp4(codes: torch.Tensor, e: torch.Tensor) -> np.ndarray:
    """FP4 codes [rows, cols] and E8M0 bytes [rows, cols/32] -> ggml MXFP4 bytes [rows, cols/32 * 17]."""
    rows, cols = codes.shape
    c = codes.to(torch.uint8).numpy().reshape(rows, cols // QK_MXFP4, QK_MXFP4)
    out = np.concatenate([e.to(torch.uint8).numpy()[..., None], _halves(c, QK_MXFP4)], axis=-1)
    return out.reshape(rows, -1)


def pack_nvfp4(codes: torch.Tensor, d: torch.Tensor) -> np.ndarray:
    """FP4 codes [rows, cols] and E4M3 scale bytes [rows, cols/16] -> ggml NVFP4 bytes [rows, cols/64 * 36]."""
    rows, cols = codes.shape
    n = cols // QK_NVFP4
    c = codes.to(torch.uint8).numpy().reshape(rows, n, QK_NVFP4 // QK_NVFP4_SUB, QK_NVFP4_SUB)
    qs = _halves(c, QK_NVFP4_SUB).reshape(rows, n, QK_NVFP4 // 2)
    scales = d.to(torch.uint8).numpy().reshape(rows, n, QK_NVFP4 // QK_NVFP4_SUB)
    return np.concatenate([scales, qs], axis=-1).reshape(rows, -1)


def fp4_weight(codes: torch.Tensor, block_scale: torch.Tensor, block: int, global_scale: float | None = None):
    """The weight compressed-tensors' FP4 means, q * s (/ g), exactly (float64: products of at most
    4 + 2 significant bits, one division)."""
    w = fp4_values(codes).to(torch.float64) * block_scale.repeat_interleave(block, dim=1)
    return w if global_scale is None else w / global_scale


def inverse_f32(g: float) -> float:
    """llama.cpp's per-tensor multiplier for a compressed-tensors global scale: 1/g in float32."""
    return float(np.float32(1.0) / np.float32(g))


def power_of_two(g: float) -> bool:
    m, _ = np.frexp(np.float64(g))
    return bool(np.isfinite(g) and g > 0 and m == 0.5)
