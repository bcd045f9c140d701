"""Which architectures the GQA step handles: a table of attention layouts, keyed by model_type.

Every entry has separate q/k/v/o projections named as in Llama (`model.layers.{i}.self_attn`)
and rotate-half RoPE over the whole head (dims j and j + d/2 form rotary plane j). `qk_norm`
says where a per-head RMSNorm sits between the projection and RoPE: there the norm undoes any
scale folded into q/k, so only `mean` merging is offered.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.errors import RecipeError


@dataclass(frozen=True)
class Layout:
    layers: str = "model.layers"  # ModuleList of decoder layers
    attn: str = "self_attn"  # attention module inside a layer
    qk_norm: str | None = None  # None | "head" (norm over head_dim) | "all" (norm over all heads' dims)
    rotary: str = "model.rotary_emb"  # module holding `inv_freq`


LLAMA = Layout()
HEAD_NORM = Layout(qk_norm="head")
ALL_NORM = Layout(qk_norm="all")

LAYOUTS: dict[str, Layout] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "mixtral": LLAMA,
    "qwen2": LLAMA,  # q/k/v biases: an extra input column of ones
    "gemma": LLAMA,
    "gemma2": LLAMA,
    "granite": LLAMA,
    "starcoder2": LLAMA,
    "qwen3": HEAD_NORM,
    "gemma3_text": HEAD_NORM,
    "olmo2": ALL_NORM,
}

# MHA families with fused or differently laid out attention and no num_key_value_heads.
UNSUPPORTED_HINT = {
    "gpt2": "fused c_attn projection and learned positions",
    "opt": "learned positions and no num_key_value_heads",
    "gpt_neox": "fused query_key_value projection and partial rotary",
    "gptj": "interleaved (not rotate-half) rotary",
    "phi3": "fused qkv_proj projection",
    "cohere": "interleaved (not rotate-half) rotary",
    "stablelm": "partial rotary",
    "falcon": "fused query_key_value projection",
    "bloom": "ALiBi and fused query_key_value projection",
}


def layout_for(model_type: str, key: str) -> Layout:
    if model_type in LAYOUTS:
        return LAYOUTS[model_type]
    why = UNSUPPORTED_HINT.get(model_type, "not in the table of supported layouts")
    raise RecipeError(
        f"{key}: GQA conversion does not support model_type {model_type!r} ({why}); supported: {', '.join(LAYOUTS)}"
    )


def head_counts(cfg: dict) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) from a config.json dict."""
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return heads, kv, head_dim
