"""quantkit/gguf/grids.py: the block math against hand-made values and the gguf package's own decoder."""

import numpy as np
import pytest
import torch

from quantkit.gguf import grids


def gguf_dequant(data: np.ndarray, qtype: str) -> torch.Tensor:
    import gguf

    return torch.from_numpy(
        np.asarray(gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, qtype)), dtype=np.float32)
    )


def test_q4_0_layout_by_hand():
    """ggml-common.h block_q4_0: fp16 d, then byte j = u[j] | u[j+16] << 4 with u = q + 8."""
    codes = torch.arange(32, dtype=torch.int8).remainder(16).sub(8).reshape(1, 32)  # -8..7, -8..7
    d = torch.tensor([[0.5]])
    data = grids.pack_q4_0(codes, d)
    assert data.shape == (1, 18)
    assert data[0, :2].view(np.float16)[0] == np.float16(0.5)
    u = (codes[0] + 8).numpy().astype(np.uint8)
    assert list(data[0, 2:]) == [int(u[j] | (u[j + 16] << 4)) for j in range(16)]
    assert torch.equal(gguf_dequant(data, "Q4_0"), codes.float() * 0.5)


@pytest.mark.parametrize("bits,qtype", [(4, "Q4_0"), (8, "Q8_0")])
def test_symmetric_codes_round_trip_exactly(bits, qtype):
    g = torch.Generator().manual_seed(0)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    codes = torch.randint(lo, hi + 1, (6, 128), generator=g, dtype=torch.int8)
    d = (torch.rand(6, 4, generator=g) * 0.1).half().float()  # fp16 values, one per 32-block
    data = (grids.pack_q4_0 if bits == 4 else grids.pack_q8_0)(codes, d)
    assert torch.equal(gguf_dequant(data, qtype), grids.dequantize_codes(codes, d))


def test_q4_1_offsets_make_minimums_exact_where_codes_allow():
    """m = -d*(z+8) is not always an fp16 value; another offset c is taken when the block's codes fit."""
    d = torch.tensor([[1.0009765625]])  # 1 + 2^-10: d*3 needs 13 significant bits, more than fp16 has
    zero = torch.tensor([[-5]], dtype=torch.int8)  # z + 8 = 3
    narrow = torch.tensor([[0] * 16 + [1] * 16], dtype=torch.int8)  # q - z in {5, 6}: c may move down to -5
    c, bad = grids.q4_1_offsets(narrow, d, zero)
    assert bad == 0 and int(c) != 3
    data = grids.pack_q4_1(narrow, d, zero, c)
    assert torch.equal(gguf_dequant(data, "Q4_1"), grids.dequantize_codes(narrow, d, zero))
    full = torch.tensor([list(range(-8, 8)) * 2], dtype=torch.int8)  # all 16 codes: c = z + 8 is forced
    c, bad = grids.q4_1_offsets(full, d, zero)
    assert bad == 1 and int(c) == 3


def test_block_map_groups_and_act_order():
    assert grids.block_map(128, 2).tolist() == [0, 0, 1, 1]
    assert grids.block_map(128, 1).tolist() == [0, 0, 0, 0]  # per channel
    with pytest.raises(grids.NotExact, match="group size 16"):
        grids.block_map(128, 8)
    with pytest.raises(grids.NotExact, match="not a multiple of 32"):
        grids.block_map(48, 1)
    same = torch.tensor([1] * 32 + [0] * 32)  # act-order that keeps 32-blocks whole: still exact
    assert grids.block_map(64, 2, same).tolist() == [1, 0]
    with pytest.raises(grids.NotExact, match="permuted"):
        grids.block_map(64, 2, torch.arange(64) % 2)


def test_fp16_representability():
    assert grids.fp16_inexact(torch.tensor([0.5, 1e-3, 65504.0])) == 1  # 1e-3 is not an fp16 value
    bf16 = torch.tensor([0.0078125, 1e-8, 70000.0]).bfloat16()  # exact, subnormal underflow, overflow
    assert grids.fp16_inexact(bf16) == 2


@pytest.mark.parametrize("n_head", [1, 2, 4])
def test_rope_permutation_is_a_row_permutation_with_an_inverse(n_head):
    x = torch.arange(16 * 3).reshape(16, 3)
    p = grids.rope_permute(x, n_head)
    assert sorted(p[:, 0].tolist()) == x[:, 0].tolist()  # whole rows move
    assert torch.equal(grids.rope_unpermute(p, n_head), x)
    # head h: rows (i, i + d/2) of transformers' halves become the adjacent pair (2i, 2i+1)
    d = 16 // n_head
    assert p[1, 0].item() == x[d // 2, 0].item()
