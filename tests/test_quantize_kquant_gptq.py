"""quantize/kquant_gptq.py: GPTQ's codes inside a block's fixed grid."""

import gguf
import numpy as np
import pytest
import torch

from quantkit.gguf import codes
from quantkit.quantize.kquant_gptq import gptq_codes, proxy_error


def _problem(qtype: str, seed: int = 0, out: int = 48, inn: int = 256):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4 * inn, inn, generator=g) @ torch.randn(inn, inn, generator=g) * 0.2  # correlated inputs
    w = torch.randn(out, inn, generator=g) * 0.05
    lay = codes.LAYOUTS[qtype]
    blocks = codes.blocks_of(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[qtype]), lay)
    s, o = codes.grid(blocks, lay)
    return w, x.T @ x, torch.from_numpy(s.reshape(out, inn)), torch.from_numpy(o.reshape(out, inn)), lay, blocks


def _values(q, scale, offset, lay):
    return scale * torch.from_numpy(lay.levels[np.asarray(q)]) + offset


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0"])
def test_gptq_codes_lie_on_the_grid_and_lose_less_than_rounding_alone(qtype):
    w, h, scale, offset, lay, blocks = _problem(qtype)
    q = gptq_codes(w, h, scale, offset, lay.levels)
    assert q.min() >= 0 and q.max() < 2**lay.code_bits
    after = _values(q, scale, offset, lay)
    written = codes.with_codes(blocks, lay, q.numpy().reshape(-1, lay.block))
    assert torch.allclose(torch.from_numpy(codes.dequantize(written, lay).reshape(w.shape)), after, atol=1e-7)
    rounded = _values(codes.codes(blocks, lay).reshape(w.shape), scale, offset, lay)
    assert proxy_error(after - w, h) < 0.7 * proxy_error(rounded - w, h)  # 2x less on these inputs


def test_with_uncorrelated_inputs_gptq_is_rounding_to_the_nearest_point():
    """H diagonal: no error is carried to another column, so each value takes its nearest grid point."""
    w, _, scale, offset, lay, blocks = _problem("Q4_0", seed=1)
    h = torch.diag(torch.rand(w.shape[1], generator=torch.Generator().manual_seed(2)) + 0.5)
    q = gptq_codes(w, h, scale, offset, lay.levels)
    grid = scale[..., None] * torch.from_numpy(lay.levels) + offset[..., None]
    assert torch.equal(q, (grid - w[..., None].double()).abs().argmin(-1))


def test_a_column_no_input_reaches_keeps_a_grid_point_and_the_rest_are_solved():
    w, h, scale, offset, lay, _ = _problem("Q5_0", seed=3)
    h[:, 5] = 0
    h[5, :] = 0
    q = gptq_codes(w, h, scale, offset, lay.levels)
    assert torch.isfinite(_values(q, scale, offset, lay)).all()
