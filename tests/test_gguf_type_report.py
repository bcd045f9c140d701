"""What llama-quantize gave each tensor, read back (gguf/type_report.py): the counts per type, the
bits per weight, and the weights whose rows no block of the requested type divides."""

import pytest

from quantkit.gguf.type_report import type_report


def _t(name, row, rows, qtype):
    """A tensor as read_types sees it: ggml shape (row length first) and its bytes."""
    block, size = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q5_0": (32, 22), "Q8_0": (32, 34), "F32": (1, 4)}[qtype]
    n = row * rows
    return (name, (row, rows) if rows > 1 else (row,), qtype, n // block * size)


def test_type_report_counts_types_bits_and_the_rows_no_block_divides():
    tensors = [
        _t("blk.0.ffn_down.weight", 256, 128, "Q4_K"),
        _t("blk.0.attn_q.weight", 576, 576, "Q5_0"),
        _t("blk.0.attn_v.weight", 576, 192, "Q8_0"),
        _t("output.weight", 512, 8, "Q6_K"),
        _t("blk.0.attn_norm.weight", 576, 1, "F32"),
    ]
    r = type_report(tensors, "Q4_K_M")
    assert r.block == 256 and r.tensor_types == {"F32": 1, "Q4_K": 1, "Q5_0": 1, "Q6_K": 1, "Q8_0": 1}
    assert [f["tensor"] for f in r.fallbacks] == ["blk.0.attn_q.weight", "blk.0.attn_v.weight"]
    assert r.fallback_types == {"Q5_0": 1, "Q8_0": 1} and {f["row"] for f in r.fallbacks} == {576}
    assert r.tensors == tuple({"name": t[0], "type": t[2]} for t in tensors)  # as the export record lists them
    weights = tensors[:4]
    elems = sum(t[1][0] * t[1][1] for t in weights)
    assert r.bits_per_weight_2d == pytest.approx(8 * sum(t[3] for t in weights) / elems)
    assert r.bits_per_weight == pytest.approx(8 * sum(t[3] for t in tensors) / (elems + 576))
    # Q4_K: 144 bytes per 256 weights = 4.5 bits; Q8_0: 34 per 32 = 8.5 bits
    assert type_report([_t("a", 256, 4, "Q4_K")], "Q4_K_M").bits_per_weight == pytest.approx(4.5)
    assert type_report([_t("a", 64, 4, "Q8_0")], "Q4_0").fallbacks == []  # Q4_0's block is 32: 64 fits


@pytest.mark.parametrize(
    "qtype, block", [("Q4_K_M", 256), ("Q6_K", 256), ("IQ4_XS", 256), ("Q4_0", 32), ("IQ4_NL", 32)]
)
def test_each_type_is_checked_against_its_own_block(qtype, block):
    assert type_report([_t("w", block, 2, "F32")], qtype).fallbacks == []
    assert len(type_report([_t("w", block + 32 if block == 256 else 48, 2, "F32")], qtype).fallbacks) == 1
