"""The roofline: bytes read per decode token and prefill FLOPs, as pure functions.

Decode at batch 1 reads every weight once per token, so TPOT >= bytes / bandwidth.
Prefill is a matmul over the prompt, so TTFT >= FLOPs / compute rate (and never below the
time to read the weights once). Efficiency = predicted / measured: above 100% means the
byte or FLOP accounting is wrong, and is flagged. The fits over measured points (the rule check,
the prefill split) are core/fits.py; a row's TPOT split into its causes, core/attribution.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from quantkit.errors import QuantkitError


@dataclass(frozen=True)
class Shape:
    """What the roofline needs to know about a decoder-only transformer."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    gated_mlp: bool = True  # SwiGLU: gate, up, down

    @classmethod
    def from_config(cls, cfg: dict) -> "Shape":
        heads = cfg["num_attention_heads"]
        return cls(
            vocab=cfg["vocab_size"],
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """(out_features, in_features) of each per-layer linear."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        mats = {
            "q_proj": (q, h),
            "k_proj": (kv, h),
            "v_proj": (kv, h),
            "o_proj": (h, q),
            "up_proj": (i, h),
            "down_proj": (h, i),
        }
        if self.gated_mlp:
            mats["gate_proj"] = (i, h)
        return mats

    def layer_linear_params(self) -> int:
        return sum(o * i for o, i in self.linears().values())

    def total_params(self) -> int:
        norms = (2 * self.layers + 1) * self.hidden
        emb = self.vocab * self.hidden
        return self.layers * self.layer_linear_params() + emb * (1 if self.tied else 2) + norms


@dataclass(frozen=True)
class WeightFormat:
    """How linear weights are stored: bits per weight plus per-group scale (and zero) bytes."""

    bits: float = 16.0
    group_size: int = -1  # -1: one scale per output channel; 0: no separate scales (bits is the all-in rate)
    scale_bytes: int = 2
    zero_bits: float = 0.0  # 0 when symmetric

    def __post_init__(self) -> None:
        """A geometry that stores something: any other group size (-7) would count fewer bytes than
        the weights hold, quietly."""
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < -1:
            raise QuantkitError(f"group size {g!r}: -1 (one scale per output channel) or a number of weights per scale")
        for name in ("bits", "scale_bytes", "zero_bits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise QuantkitError(f"{name} {v!r}: a finite number of at least 0")

    def bytes_for(self, out_features: int, in_features: int) -> float:
        n = out_features * in_features
        total = n * self.bits / 8
        if self.group_size == 0:
            return total
        groups = out_features * (1 if self.group_size == -1 else -(-in_features // self.group_size))
        return total + groups * (self.scale_bytes + self.zero_bits / 8)


FP16 = WeightFormat(16.0, 0)


@dataclass(frozen=True)
class Layout:
    """Storage of each part of the model."""

    linear: WeightFormat = FP16
    lm_head: WeightFormat = FP16
    embedding_bytes: float = 2.0  # per element
    kv_bytes: float = 2.0  # per cached element
    norm_bytes: float = 2.0
    overrides: dict[str, WeightFormat] = field(default_factory=dict)  # per linear name, e.g. {"down_proj": ...}


def weight_bytes_per_token(shape: Shape, layout: Layout) -> float:
    """Bytes of weights read by one decode step.

    Every layer linear once at its stored precision (with scales and zeros); the input
    embedding one row; the lm_head as a full matrix (for tied weights, the embedding table
    is read in full as the lm_head); norm weights.
    """
    per_layer = sum(
        layout.overrides.get(name, layout.linear).bytes_for(o, i) for name, (o, i) in shape.linears().items()
    )
    emb_row = shape.hidden * layout.embedding_bytes
    head = layout.lm_head.bytes_for(shape.vocab, shape.hidden)
    norms = (2 * shape.layers + 1) * shape.hidden * layout.norm_bytes
    return shape.layers * per_layer + emb_row + head + norms


def kv_bytes(
    layers: int, kv_heads: int, head_dim: int, bytes_per_elem: float = 2, v_bytes_per_elem: float | None = None
):
    """Bytes one token occupies in the KV cache: K and V, every layer, one vector per KV head
    (GQA-aware), each value at its cache type's bytes (core/kv_cache.py: 2 for f16, 1 for FP8,
    34/32 for llama.cpp's q8_0); `v_bytes_per_elem` where V's type differs from K's. The one place
    this formula is written; everything else calls it."""
    v = bytes_per_elem if v_bytes_per_elem is None else v_bytes_per_elem
    return 2 * layers * kv_heads * head_dim * (bytes_per_elem + v) / 2  # K and V, at the mean of their bytes


def kv_bytes_per_token(shape: Shape, layout: Layout = Layout()) -> float:
    """`kv_bytes` of a model shape at the layout's cache precision."""
    return kv_bytes(shape.layers, shape.kv_heads, shape.head_dim, layout.kv_bytes)


def decode_bytes(shape: Shape, layout: Layout, context_len: int) -> float:
    """Bytes read (and the new KV written) by the decode step at a given context length."""
    kv = kv_bytes_per_token(shape, layout)
    return weight_bytes_per_token(shape, layout) + kv * context_len + kv


def prefill_flops(shape: Shape, prompt_len: int, logits_positions: int = 1) -> float:
    """2 * layer-linear parameters * prompt length, the lm_head at `logits_positions` positions,
    plus causal attention.

    The engines ask for the last position's logits only (transformers' `logits_to_keep=1`,
    llama.cpp's default, vLLM's sampler), so the lm_head runs once per prefill, not once per
    prompt token: counting it P times overstated the demo's floor by ~26% (Qwen2.5-0.5B ~38%).
    Attention at position t costs 2*h*d*t for QK^T and the same for AV (Kaplan et al. 2020,
    "Scaling Laws for Neural Language Models", Table 1); summed over t = 1..P that is
    2*L*h*d*P*(P+1).
    """
    layers = 2.0 * shape.layers * shape.layer_linear_params() * prompt_len
    head = 2.0 * shape.vocab * shape.hidden * min(logits_positions, prompt_len)
    attn = 2.0 * shape.layers * shape.heads * shape.head_dim * prompt_len * (prompt_len + 1)
    return layers + head + attn


def prefill_bytes(shape: Shape, layout: Layout, prompt_len: int) -> float:
    return weight_bytes_per_token(shape, layout) + kv_bytes_per_token(shape, layout) * prompt_len


def predict_ttft_s(flops: float, compute_rate: float, bytes_read: float, bandwidth: float) -> float:
    return max(flops / compute_rate, bytes_read / bandwidth)


def efficiency(predicted: float, measured: float) -> tuple[float, bool]:
    """predicted / measured, and whether it is impossible (> 100%: an accounting error)."""
    eff = predicted / measured if measured > 0 else float("nan")
    return eff, bool(eff > 1.0)


def linear_bits_for_tpot(
    shape: Shape, tpot_s: float, bandwidth: float, context: int, layout: Layout = Layout()
) -> float:
    """The stored bits per decoder-linear weight (scales and zero points included) at which one
    decode step at `context` cached tokens reads tpot_s x bandwidth bytes: what the step may read
    once the lm_head, the embedding row, the norms and the KV cache (at the layout's precisions)
    have taken theirs. Negative when those alone exceed it."""
    fixed = weight_bytes_per_token(shape, replace(layout, linear=WeightFormat(0.0, 0), overrides={}))
    fixed += kv_bytes_per_token(shape, layout) * (context + 1)
    return (tpot_s * bandwidth - fixed) * 8 / (shape.layers * shape.layer_linear_params())


def quantized_layout(
    bits: int, group_size: int = 128, symmetric: bool = True, quantize_lm_head: bool = False
) -> Layout:
    """A what-if layout: layer linears at `bits` with fp16 scales per group (16 = unquantized).
    8 bits per channel is INT8 and FP8 E4M3 alike: one byte per weight and a 16-bit scale per
    output channel (compressed-tensors stores both so; FP8's dynamic activation scales are
    computed at run time and stored nowhere)."""
    if bits >= 16:
        return Layout()
    fmt = WeightFormat(float(bits), group_size, 2, 0.0 if symmetric else float(bits))
    return replace(Layout(), linear=fmt, lm_head=fmt if quantize_lm_head else FP16)
