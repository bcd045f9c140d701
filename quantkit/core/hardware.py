"""Datasheet figures for what-if roofline predictions, and well-known model shapes.

Bandwidth is peak memory bandwidth; compute is dense (no sparsity) bf16/fp16 tensor-core
throughput with fp32 accumulate, from each vendor's datasheet. Measured figures for the
machine at hand come from `quantkit bench --probe` instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s
    compute: float  # FLOP/s, dense bf16
    source: str


TB, TF = 1e12, 1e12
DEVICES: dict[str, Device] = {
    "h200": Device(
        "NVIDIA H200 SXM", 4.8 * TB, 989 * TF, "NVIDIA H200 datasheet (4.8 TB/s HBM3e, 989 TFLOPS bf16 dense)"
    ),
    "h100": Device("NVIDIA H100 SXM", 3.35 * TB, 989 * TF, "NVIDIA H100 datasheet (3.35 TB/s, 989 TFLOPS bf16 dense)"),
    "h100-pcie": Device(
        "NVIDIA H100 PCIe", 2.0 * TB, 756 * TF, "NVIDIA H100 datasheet (2.0 TB/s, 756 TFLOPS bf16 dense)"
    ),
    "a100": Device("NVIDIA A100 80GB SXM", 2.039 * TB, 312 * TF, "NVIDIA A100 datasheet (2,039 GB/s, 312 TFLOPS bf16)"),
    "l40s": Device("NVIDIA L40S", 0.864 * TB, 362 * TF, "NVIDIA L40S datasheet (864 GB/s, 362 TFLOPS bf16 dense)"),
    "l4": Device("NVIDIA L4", 0.3 * TB, 121 * TF, "NVIDIA L4 datasheet (300 GB/s, 121 TFLOPS bf16 dense)"),
    "a10g": Device("NVIDIA A10G", 0.6 * TB, 70 * TF, "AWS/NVIDIA A10G (600 GB/s, ~70 TFLOPS bf16 dense)"),
    "rtx4090": Device(
        "NVIDIA RTX 4090", 1.008 * TB, 165.2 * TF, "Ada whitepaper (1,008 GB/s, 165.2 TFLOPS fp16/fp32-acc dense)"
    ),
    "mi300x": Device("AMD MI300X", 5.3 * TB, 1307 * TF, "AMD MI300X datasheet (5.3 TB/s, 1,307 TFLOPS bf16 dense)"),
}

# Public config.json figures of common models (hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied,
# context: max_position_embeddings, which bench's context check reads).
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    "llama3-70b": dict(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    "llama2-7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=128,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    "mistral-7b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32768,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    ),
    "llama3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
}
SHAPE_ARCH = {"qwen2.5-7b": "qwen2", "qwen2.5-0.5b": "qwen2", "mistral-7b": "mistral"}


def get_device(name: str) -> Device:
    key = name.lower()
    if key not in DEVICES:
        raise QuantkitError(
            f"unknown device {name!r}; known: {', '.join(DEVICES)} (or measure "
            "this machine with `quantkit bench --probe`)"
        )
    return DEVICES[key]


def shape_config(name_or_path: str) -> dict:
    """A named shape or a config.json path -> a config dict."""

    if name_or_path in SHAPES:
        return {"model_type": SHAPE_ARCH.get(name_or_path, "llama"), **SHAPES[name_or_path]}
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        try:
            cfg = json.loads(p.read_text())
        except json.JSONDecodeError:
            raise QuantkitError(f"{p}: not valid JSON") from None
        cfg = cfg.get("text_config", cfg)
        missing = [
            k
            for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
            if k not in cfg
        ]
        if missing:
            raise QuantkitError(f"{p}: config lacks {', '.join(missing)}")
        return cfg
    raise QuantkitError(f"unknown shape {name_or_path!r}; known: {', '.join(SHAPES)}, or a path to a config.json")
