"""Roofline math against hand-computed numbers."""

import pytest

from quantkit.core.hardware import SHAPES, get_device, shape_config
from quantkit.core.roofline import (
    FP16,
    Layout,
    Shape,
    WeightFormat,
    decode_bytes,
    efficiency,
    kv_bytes_per_token,
    predict_ttft_s,
    prefill_flops,
    quantized_layout,
    weight_bytes_per_token,
)

TOY = Shape(vocab=10, hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, head_dim=2, tied=True)


def test_toy_weight_bytes_by_hand():
    # per layer: q 4x4=16, k 2x4=8, v 8, o 16, gate 8x4=32, up 32, down 32 -> 144 weights
    assert TOY.layer_linear_params() == 144
    # fp16: 2 layers * 144 * 2 B = 576; embedding row 4*2 = 8; tied lm_head full 10*4*2 = 80; norms (2*2+1)*4*2 = 40
    assert weight_bytes_per_token(TOY, Layout()) == 576 + 8 + 80 + 40


def test_toy_int4_group_bytes_by_hand():
    fmt = WeightFormat(bits=4, group_size=4, scale_bytes=2)
    # q: 16 weights * 0.5 B = 8, groups 4 rows * 1 = 4 scales * 2 B = 8 -> 16
    assert fmt.bytes_for(4, 4) == 16
    # asymmetric with 4-bit zeros: + 4 groups * 0.5 B
    assert WeightFormat(4, 4, 2, 4).bytes_for(4, 4) == 18
    # per channel: one scale per output row
    assert WeightFormat(8, -1, 2).bytes_for(4, 4) == 16 + 8


def test_kv_bytes_gqa_aware():
    # 2 (K,V) * 2 layers * 1 kv head * 2 dims * 2 B = 16 per token
    assert kv_bytes_per_token(TOY) == 16
    mha = Shape(**{**TOY.__dict__, "kv_heads": 2})
    assert kv_bytes_per_token(mha) == 32
    # decode at context 10: weights + 10 tokens read + 1 written
    assert decode_bytes(TOY, Layout(), 10) == 704 + 16 * 11


def test_prefill_flops_by_hand():
    # layer linears: 2 layers * 144 = 288 params, 2*288*P with P=3 -> 1728
    # lm_head (10 x 4 = 40 params) at the last position only (logits_to_keep=1): 2*40 -> 80
    # attention: 2 * L(2) * h(2) * d(2) * P(3) * (P+1)(4) = 192
    assert prefill_flops(TOY, 3) == 1728 + 80 + 192
    assert prefill_flops(TOY, 3, logits_positions=3) == 1728 + 240 + 192  # logits at every position


def test_demo_ttft_floor_no_longer_counts_lm_head_per_token():
    """Counting the lm_head at all 256 positions overstated the demo's floor by ~26%."""
    shape = Shape.from_config(SHAPES["smollm2-135m"])
    old = prefill_flops(shape, 256, logits_positions=256)
    assert old / prefill_flops(shape, 256) == pytest.approx(1.26, abs=0.01)
    qwen = Shape.from_config(SHAPES["qwen2.5-0.5b"])
    assert prefill_flops(qwen, 256, logits_positions=256) / prefill_flops(qwen, 256) == pytest.approx(1.38, abs=0.01)


def test_one_kv_formula_everywhere(tmp_path):
    """The KV-bytes formula is written once (roofline.kv_bytes) and everything uses it."""
    import json
    import re
    from pathlib import Path

    import quantkit.bench.accounting as accounting
    from quantkit.core.roofline import kv_bytes
    from quantkit.gqa import groups
    from quantkit.models.sizes import checkpoint_sizes

    assert kv_bytes(30, 3, 64) == 23040 and kv_bytes(30, 3, 64, 1) == 11520
    assert not hasattr(groups, "kv_bytes_per_token")
    assert not hasattr(accounting, "kv_bytes_per_token")
    cfg = {**SHAPES["smollm2-135m"], "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert checkpoint_sizes(tmp_path).kv_bytes_per_token == kv_bytes_per_token(Shape.from_config(cfg)) == 23040
    repo = Path(__file__).resolve().parents[1] / "quantkit"
    written = [
        f.relative_to(repo).as_posix()
        for f in repo.rglob("*.py")
        if re.search(r"2 \* \w*layers \* \w*kv_heads", f.read_text())
    ]
    assert written == ["core/roofline.py"]


def test_llama3_8b_on_h200_bf16_floor_is_3_1_ms():
    shape = Shape.from_config(shape_config("llama3-8b"))
    tpot = weight_bytes_per_token(shape, Layout()) / get_device("h200").bandwidth
    assert tpot * 1e3 == pytest.approx(3.13, abs=0.02)


def test_demo_shape_bf16_bytes():
    shape = Shape.from_config(SHAPES["smollm2-135m"])
    # 30 layers * 3,538,944 weights * 2 B + lm_head 49152*576*2 + one row + norms
    expected = 30 * 3_538_944 * 2 + 49152 * 576 * 2 + 576 * 2 + 61 * 576 * 2
    assert weight_bytes_per_token(shape, Layout()) == expected
    assert shape.total_params() == 30 * 3_538_944 + 49152 * 576 + 61 * 576


def test_quantized_layout_keeps_lm_head_fp16():
    lay = quantized_layout(4, 128)
    assert lay.lm_head == FP16 and lay.linear.bits == 4
    assert quantized_layout(16) == Layout()


def test_ttft_never_below_reading_weights():
    assert predict_ttft_s(1e9, 1e12, 1e9, 1e11) == pytest.approx(0.01)
    assert predict_ttft_s(1e12, 1e12, 1e6, 1e11) == pytest.approx(1.0)


def test_efficiency_flags_impossible():
    assert efficiency(1.0, 2.0) == (0.5, False)
    assert efficiency(2.0, 1.0) == (2.0, True)


def test_roofline_cli_json(cli):
    code, _, err, data = cli("roofline", "--shape", "llama3-8b", "--device", "h200", "--bits", "16,8,4", "--json")
    assert code == 0, err
    t16, t8, t4 = (r["predicted_tpot_ms"] for r in data["rows"])
    assert t16 == pytest.approx(3.13, abs=0.03) and t16 > t8 > t4


def test_roofline_cli_bad_input(cli):
    code, _, err, _ = cli("roofline", "--shape", "nope", "--device", "h200")
    assert code == 2 and "unknown shape" in err
    code, _, err, _ = cli("roofline", "--shape", "llama3-8b", "--device", "tpu9")
    assert code == 2 and "unknown device" in err


@pytest.mark.parametrize("group", [-7, -2, 2.5, True, "128", None])
def test_a_weight_format_with_no_real_group_size_is_refused(group):
    """A group size no format has would count fewer bytes than the weights hold (-7: 2.58 GB for an
    8B model at 4 bits, below its own weights)."""
    from quantkit.errors import QuantkitError

    with pytest.raises(QuantkitError, match="group size"):
        WeightFormat(4.0, group)


@pytest.mark.parametrize("bits", [2.0, 3.0, 4.0, 8.0])
def test_quantized_weights_always_carry_scales(bits):
    # group size 0 is an all-in rate (bits already counts the scales: the TPOT budget's inverse);
    # roofline's --group-size 0 is refused where the option is read
    assert WeightFormat(bits, 0).bytes_for(64, 256) == 64 * 256 * bits / 8
    per_channel, grouped = WeightFormat(bits, -1), WeightFormat(bits, 32)
    assert grouped.bytes_for(64, 256) > per_channel.bytes_for(64, 256) > 64 * 256 * bits / 8


@pytest.mark.parametrize("bad", [("bits", -4.0), ("bits", float("nan")), ("scale_bytes", -2), ("zero_bits", True)])
def test_a_weight_format_counts_no_negative_or_missing_bytes(bad):
    from quantkit.errors import QuantkitError

    with pytest.raises(QuantkitError, match=bad[0]):
        WeightFormat(**{"bits": 4.0, "group_size": 128, bad[0]: bad[1]})


@pytest.mark.parametrize("group", ["-7", "0", "-2", "-100000"])
def test_roofline_refuses_a_group_size_before_any_probe(cli, monkeypatch, group):
    def boom(*a, **k):
        raise AssertionError("probed before the check")

    monkeypatch.setattr("quantkit.bench.probe.cached_probe", boom)
    code, _, err, _ = cli("roofline", "--shape", "llama3-8b", "--bits", "4", "--group-size", group)
    assert code == 2 and f"--group-size {group}" in err and len(err.strip().splitlines()) == 1


def test_roofline_says_fp8_is_no_half_of_a_k_v_pair(cli):
    for spec in ("fp8/f16", "f16/fp8", "FP8/q8_0"):
        code, _, err, _ = cli("roofline", "--shape", "llama3-8b", "--device", "h200", "--kv-cache", spec)
        assert code == 2 and "fp8 is one cache for K and V together" in err and "or fp8" not in err, err
