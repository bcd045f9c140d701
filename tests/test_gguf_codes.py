"""gguf/codes.py: the code bits of each ggml block type, read and written apart from its scales,
checked against the gguf library's own dequantization."""

import gguf
import numpy as np
import pytest

from quantkit.gguf import codes

# where each type keeps its fp16 scales (the bytes a random block must hold finite values in)
FP16_AT = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


def _blocks(qtype: str, n: int = 40, seed: int = 0) -> np.ndarray:
    lay = codes.LAYOUTS[qtype]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, lay.size), dtype=np.uint8)
    for at in FP16_AT[qtype]:
        b[:, at : at + 2] = np.frombuffer(rng.uniform(0.01, 1.0, n).astype(np.float16).tobytes(), np.uint8).reshape(
            n, 2
        )
    return b


def test_every_mixable_type_has_a_layout_of_ggmls_size():
    from quantkit.recipe.schema import GGUF_MIXABLE

    assert set(codes.LAYOUTS) == set(GGUF_MIXABLE)
    for name, lay in codes.LAYOUTS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (lay.block, lay.size)


@pytest.mark.parametrize("qtype", sorted(codes.LAYOUTS))
def test_codes_read_back_as_written_and_the_scale_bytes_stay(qtype):
    lay, b = codes.LAYOUTS[qtype], _blocks(qtype)
    assert (codes.with_codes(b, lay, codes.codes(b, lay)) == b).all()  # every bit of the code bytes is a code bit
    q = np.random.default_rng(1).integers(0, 2**lay.code_bits, size=(b.shape[0], lay.block))
    new = codes.with_codes(b, lay, q)
    assert (codes.codes(new, lay) == q).all()
    start, end = lay.code_bytes
    assert (new[:, :start] == b[:, :start]).all() and (new[:, end:] == b[:, end:]).all()


@pytest.mark.parametrize("qtype", sorted(codes.LAYOUTS))
def test_the_grid_is_what_ggml_dequantizes_each_code_to(qtype):
    """scale · levels[code] + offset equals the gguf library's value for random codes under random scales."""
    lay, b = codes.LAYOUTS[qtype], _blocks(qtype, seed=2)
    scale, offset = codes.grid(b, lay)
    q = np.random.default_rng(3).integers(0, 2**lay.code_bits, size=(b.shape[0], lay.block))
    got = codes.dequantize(codes.with_codes(b, lay, q), lay)
    want = scale * lay.levels[q] + offset
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(got).max())


def test_q4_0_by_hand():
    """One Q4_0 block: d = 0.5 (fp16 0x3800), codes 0..15 then 15..0: value = d · (code - 8)."""
    lay = codes.LAYOUTS["Q4_0"]
    q = np.array([list(range(16)) + list(range(15, -1, -1))])
    block = codes.with_codes(np.zeros((1, 18), np.uint8), lay, q)
    block[0, :2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    assert block[0, 2] == 0 | (15 << 4) and block[0, 17] == 15 | (0 << 4)  # value j low nibble, j + 16 high
    assert codes.dequantize(block, lay)[0].tolist() == [0.5 * (c - 8) for c in q[0]]
    scale, offset = codes.grid(block, lay)
    assert (scale == 0.5).all() and (offset == -4.0).all()
