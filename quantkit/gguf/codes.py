"""The integer codes inside ggml's quantized blocks, apart from their scales: read them, write new
ones into a block whose scales stay as they are, and the grid a block's scales allow each value.

Every ggml type quantkit mixes stores a weight as `scale · level[code] + offset`, the scale and
offset per block or sub-block (fp16 `d`, `dmin`, and 6- or 8-bit sub-block scales) and the code in
a few bits spread over the block's code bytes (ggml-common.h's block_q4_0 ... block_q6_K; the bit
positions below follow the gguf library's dequantize_blocks, which mirrors ggml-quants.c). The
bytes holding scales are never touched, so a tensor rewritten here has the same layout, size and
scales as the one llama-quantize made; only which grid point each weight sits on changes.

`grid` finds each value's scale and offset by dequantizing the block with every code at 0 and
then at 1 (the gguf library's own dequantization), so it depends on no decoding of the scale bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gguf
import numpy as np

IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # kvalues_iq4nl


@dataclass(frozen=True)
class Field:
    """Some bits of every value's code: value j's bits sit in code byte `byte[j]` from bit `shift[j]`."""

    byte: np.ndarray  # (block,) offsets within the block
    shift: np.ndarray  # (block,)
    bits: int


@dataclass(frozen=True)
class Layout:
    qtype: str
    block: int  # values per block
    size: int  # bytes per block
    code_bytes: tuple[int, int]  # [start, end): the bytes that hold nothing but codes
    fields: tuple[Field, ...]  # low bits first
    levels: np.ndarray  # level[code], float64

    @property
    def code_bits(self) -> int:
        return sum(f.bits for f in self.fields)


def _nibbles(start: int, n: int) -> Field:
    """Blocks of 32 values in 16 bytes from `start`: value j in the low nibble of byte j, j + 16 in the high one
    (block_q4_0's qs, repeated for each 32 of `n`)."""
    j = np.arange(n)
    return Field(start + 16 * (j // 32) + j % 16, 4 * ((j % 32) // 16), 4)


def _kquant_nibbles(start: int) -> Field:
    """Q4_K/Q5_K's qs: 4 chunks of 32 bytes; sub-block 2g in their low nibbles, 2g + 1 in the high."""
    j = np.arange(256)
    return Field(start + 32 * (j // 64) + j % 32, 4 * ((j // 32) % 2), 4)


def _crumbs(start: int, group: int) -> Field:
    """2 bits per value, in `group` bytes per 4·group values (Q6_K's qh, Q3_K's and Q2_K's qs)."""
    j = np.arange(256)
    half = 4 * group
    return Field(start + group * (j // half) + j % group, 2 * ((j % half) // group), 2)


def _bits(start: int, n: int) -> Field:
    """One bit per value, value j in byte start + j % 32 at bit j // 32 (Q5_K's qh, Q3_K's hmask);
    for blocks of 32 (Q5_0, Q5_1's qh, a little-endian uint32) byte start + j // 8 at bit j % 8."""
    j = np.arange(n)
    if n == 32:
        return Field(start + j // 8, j % 8, 1)
    return Field(start + j % 32, j // 32, 1)


def _q6k_low() -> Field:
    j = np.arange(256)
    return Field(64 * (j // 128) + j % 64, 4 * ((j % 128) // 64), 4)


def _uniform(bits: int) -> np.ndarray:
    return np.arange(2**bits, dtype=np.float64)


LAYOUTS: dict[str, Layout] = {
    lay.qtype: lay
    for lay in (
        Layout("Q4_0", 32, 18, (2, 18), (_nibbles(2, 32),), _uniform(4)),
        Layout("Q4_1", 32, 20, (4, 20), (_nibbles(4, 32),), _uniform(4)),
        Layout("Q5_0", 32, 22, (2, 22), (_nibbles(6, 32), _bits(2, 32)), _uniform(5)),
        Layout("Q5_1", 32, 24, (4, 24), (_nibbles(8, 32), _bits(4, 32)), _uniform(5)),
        # signed bytes: code c is the byte, level int8(c)
        Layout(
            "Q8_0",
            32,
            34,
            (2, 34),
            (Field(2 + np.arange(32), np.zeros(32, int), 8),),
            np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8).astype(np.float64),
        ),
        Layout("IQ4_NL", 32, 18, (2, 18), (_nibbles(2, 32),), np.array(IQ4_LEVELS, dtype=np.float64)),
        Layout("IQ4_XS", 256, 136, (8, 136), (_nibbles(8, 256),), np.array(IQ4_LEVELS, dtype=np.float64)),
        Layout("Q2_K", 256, 84, (16, 80), (_crumbs(16, 32),), _uniform(2)),
        # Q3_K: 2 low bits in qs, the third in hmask (set: no -4), so level = code - 4
        Layout("Q3_K", 256, 110, (0, 96), (_crumbs(32, 32), _bits(0, 256)), _uniform(3) - 4),
        Layout("Q4_K", 256, 144, (16, 144), (_kquant_nibbles(16),), _uniform(4)),
        Layout("Q5_K", 256, 176, (16, 176), (_kquant_nibbles(48), _bits(16, 256)), _uniform(5)),
        # Q6_K: ql (4 bits in 2 halves of 64 bytes), qh (2 bits in 2 halves of 32 bytes)
        Layout("Q6_K", 256, 210, (0, 192), (_q6k_low(), _crumbs(128, 32)), _uniform(6)),
    )
}


def layout(qtype: str) -> Layout:
    return LAYOUTS[qtype]


def blocks_of(data: np.ndarray, lay: Layout) -> np.ndarray:
    """A tensor's raw bytes (as the gguf library reads them) as (blocks, bytes per block)."""
    return np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, lay.size)


def codes(blocks: np.ndarray, lay: Layout) -> np.ndarray:
    """Every value's code, (blocks, values per block)."""
    out = np.zeros((blocks.shape[0], lay.block), dtype=np.int64)
    low = 0
    for f in lay.fields:
        part = (blocks[:, f.byte].astype(np.int64) >> f.shift) & ((1 << f.bits) - 1)
        out |= part << low
        low += f.bits
    return out


def with_codes(blocks: np.ndarray, lay: Layout, q: np.ndarray) -> np.ndarray:
    """The blocks with these codes (blocks, values per block) and their own scales."""
    if q.min() < 0 or q.max() >= 2**lay.code_bits:
        raise ValueError(f"{lay.qtype}: codes outside 0..{2**lay.code_bits - 1}")
    parts, low = [], 0
    for f in lay.fields:
        parts.append((q >> low) & ((1 << f.bits) - 1))
        low += f.bits
    parts.append(np.zeros_like(q))  # what a byte's unused slots read
    stacked = np.stack(parts)  # (fields + 1, blocks, values)
    field, value, shift = _sources(lay.qtype)
    acc = np.zeros((blocks.shape[0], field.shape[0]), dtype=np.int64)
    for k in range(field.shape[1]):  # the fields' bits never overlap: | of each byte's contributions
        acc |= stacked[field[:, k], :, value[:, k]].T << shift[:, k]
    out = blocks.copy()
    out[:, lay.code_bytes[0] : lay.code_bytes[1]] = acc.astype(np.uint8)
    return out


@functools.cache
def _sources(qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each code byte, the (field, value, shift) of every code bit-field written into it, as
    (code bytes, most contributions) arrays; a slot no field fills points at the zero part."""
    lay = LAYOUTS[qtype]
    start, end = lay.code_bytes
    slots: list[list[tuple[int, int, int]]] = [[] for _ in range(end - start)]
    for i, f in enumerate(lay.fields):
        for j, (b, sh) in enumerate(zip(f.byte.tolist(), f.shift.tolist())):
            slots[b - start].append((i, j, sh))
    width = max(len(x) for x in slots)
    pad = (len(lay.fields), 0, 0)
    table = np.array([x + [pad] * (width - len(x)) for x in slots], dtype=np.int64)
    return table[..., 0], table[..., 1], table[..., 2]


def dequantize(blocks: np.ndarray, lay: Layout) -> np.ndarray:
    """(blocks, values per block) float64, by the gguf library."""
    qt = gguf.GGMLQuantizationType[lay.qtype]
    return np.asarray(gguf.quants.dequantize(blocks, qt), dtype=np.float64).reshape(blocks.shape[0], lay.block)


def grid(blocks: np.ndarray, lay: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Each value's (scale, offset), (blocks, values per block): code c stands for
    scale · levels[c] + offset under the block's own scales."""
    zero = np.zeros((blocks.shape[0], lay.block), dtype=np.int64)
    v0 = dequantize(with_codes(blocks, lay, zero), lay)
    v1 = dequantize(with_codes(blocks, lay, zero + 1), lay)
    step = lay.levels[1] - lay.levels[0]
    scale = (v1 - v0) / step
    return scale, v0 - scale * lay.levels[0]
