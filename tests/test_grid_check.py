"""benchmarks/grid_check.py: a weight on Q4_1's grid is found as such, and a rotation removes the grid."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import grid_check  # noqa: E402


@pytest.fixture
def on_q4_1_grid() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    rows, blocks = 64, 8
    # Q4_1 stores each block's d and m as fp16
    d = (torch.rand(rows, blocks, 1, generator=g) * 0.01 + 0.001).half().float()
    m = (-torch.rand(rows, blocks, 1, generator=g) * 0.1).half().float()
    u = torch.randint(0, 16, (rows, blocks, 32), generator=g).float()
    u[..., 0], u[..., 1] = 0, 15  # llama.cpp's Q4_1 puts each block's extremes on levels 0 and 15
    return (d * u + m).reshape(rows, blocks * 32)


def test_weights_on_q4_1_grid_quantize_exactly_on_it_and_not_with_an_integer_zero(on_q4_1_grid):
    assert grid_check.rtn_relative_error(on_q4_1_grid, 32, "float-min") < 1e-5
    assert grid_check.rtn_relative_error(on_q4_1_grid, 32, "asym") > 1e-3  # m/d is not an integer


def test_a_rotation_leaves_no_grid(on_q4_1_grid):
    g = torch.Generator().manual_seed(2)
    cols = on_q4_1_grid.shape[1]
    rot = torch.linalg.qr(torch.randn(cols, cols, dtype=torch.float64, generator=g))[0].float()
    rotated = on_q4_1_grid @ rot
    gauss = torch.randn(on_q4_1_grid.shape, generator=g) * rotated.std(dim=1, keepdim=True)
    for group, kind in grid_check.GRIDS.values():
        r = grid_check.rtn_relative_error(rotated, group, kind)
        assert r == pytest.approx(grid_check.rtn_relative_error(gauss, group, kind), rel=0.1)


def test_symmetric_error_is_bounded_by_half_a_step():
    w = torch.linspace(-1, 1, 64).repeat(4, 1)
    half_step = 0.5 / 7.5  # scale = max|w| / 7.5
    bound = half_step / w.pow(2).mean().sqrt().item()  # every element off by at most half a step
    assert 0 < grid_check.rtn_relative_error(w, 64, "sym") <= bound
