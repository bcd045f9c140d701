"""Architectures as data: which llama.cpp architecture a transformers model becomes, and its hparams.

llama.cpp's `llama` architecture (used for Llama and Mistral, as llama.cpp's own converter does)
rotates interleaved pairs (2i, 2i+1), transformers rotates halves (i, i + d/2): q/k rows are
permuted on the way (grids.rope_permute). `qwen2` runs NEOX-style RoPE, the same as transformers,
so its rows stay as they are. Keys are those llama.cpp reads (src/llama-model.cpp, llm_load_hparams).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import torch

from quantkit.errors import ModelError


@dataclass(frozen=True)
class ArchSpec:
    gguf_arch: str  # gguf.MODEL_ARCH member name
    permute_qk: bool
    classes: tuple[str, ...]


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec("LLAMA", True, ("LlamaForCausalLM",)),
    "mistral": ArchSpec("LLAMA", True, ("MistralForCausalLM",)),
    "qwen2": ArchSpec("QWEN2", False, ("Qwen2ForCausalLM",)),
}
# RoPE variants llama.cpp represents for these architectures ("llama3" through a rope_freqs tensor).
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class Hparams:
    spec: ArchSpec
    model_type: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    rms_eps: float
    rope_theta: float
    rope_type: str
    rope: dict
    vocab_size: int
    tied: bool
    notes: tuple[str, ...] = field(default_factory=tuple)


def spec_for(config: dict, where: Path) -> ArchSpec:
    mt = config.get("model_type")
    if mt not in ARCHS:
        raise ModelError(f"{where}: model_type {mt!r} is not exported to GGUF (supported: {', '.join(ARCHS)})")
    classes = config.get("architectures") or list(ARCHS[mt].classes)
    if classes[0] not in ARCHS[mt].classes:
        raise ModelError(
            f"{where}: architecture {classes[0]} is not exported to GGUF (supported: "
            f"{', '.join(c for s in ARCHS.values() for c in s.classes)})"
        )
    return ARCHS[mt]


def hparams(path: Path, config: dict) -> Hparams:
    """The hparams llama.cpp needs, read through transformers' own config class (it normalises
    rope_theta/rope_scaling of older configs into rope_parameters)."""
    from transformers import AutoConfig

    spec = spec_for(config, path)
    cfg = AutoConfig.from_pretrained(str(path))
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ModelError(f"{path}: hidden_act {cfg.hidden_act!r}; llama.cpp's {spec.gguf_arch.lower()} uses SiLU")
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelError(
            f"{path}: RoPE type {rope_type!r} is not exported to GGUF (supported: {', '.join(ROPE_TYPES)})"
        )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    notes = []
    window = getattr(cfg, "sliding_window", None)
    if (
        window
        and (spec.gguf_arch == "LLAMA" or getattr(cfg, "use_sliding_window", False))
        and window < cfg.max_position_embeddings
    ):
        notes.append(
            f"sliding_window {window} is not represented: llama.cpp's {spec.gguf_arch.lower()} attends to the "
            f"whole context, identical to transformers for contexts of at most {window} tokens"
        )
    return Hparams(
        spec=spec,
        model_type=config["model_type"],
        n_layer=cfg.num_hidden_layers,
        n_embd=cfg.hidden_size,
        n_ff=cfg.intermediate_size,
        n_head=cfg.num_attention_heads,
        n_head_kv=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        n_ctx=cfg.max_position_embeddings,
        rms_eps=float(cfg.rms_norm_eps),
        rope_theta=float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
        rope_type=rope_type,
        rope=rope,
        vocab_size=cfg.vocab_size,
        tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        notes=tuple(notes),
    )


def add_hparams(writer, hp: Hparams) -> None:
    writer.add_context_length(hp.n_ctx)
    writer.add_embedding_length(hp.n_embd)
    writer.add_block_count(hp.n_layer)
    writer.add_feed_forward_length(hp.n_ff)
    writer.add_head_count(hp.n_head)
    writer.add_head_count_kv(hp.n_head_kv)
    writer.add_layer_norm_rms_eps(hp.rms_eps)
    writer.add_rope_freq_base(hp.rope_theta)
    writer.add_rope_dimension_count(hp.head_dim)
    writer.add_vocab_size(hp.vocab_size)
    if hp.head_dim * hp.n_head != hp.n_embd:  # llama.cpp otherwise assumes n_embd / n_head
        writer.add_key_length(hp.head_dim)
        writer.add_value_length(hp.head_dim)
    if hp.rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(hp.rope["factor"]))


def extra_tensors(path: Path, hp: Hparams) -> dict[str, np.ndarray]:
    """Tensors llama.cpp needs that the checkpoint does not hold: Llama 3.1's RoPE frequency factors.

    llama.cpp divides each RoPE frequency by rope_freqs[i] (ggml_rope_ext's freq_factors), so the
    factors are the plain frequencies over the llama3-scaled ones, taken from transformers."""
    if hp.rope_type != "llama3":
        return {}
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = AutoConfig.from_pretrained(str(path))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    # the unscaled RoPE frequencies, theta^(-2i/d) (Su et al. 2021, RoFormer eq. 15)
    plain = 1.0 / (hp.rope_theta ** (torch.arange(0, hp.head_dim, 2, dtype=torch.int64).float() / hp.head_dim))
    return {"rope_freqs.weight": (plain / scaled.float()).numpy().astype(np.float32)}
