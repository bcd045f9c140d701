"""Sizes of a checkpoint read from safetensors headers (no tensors loaded): bytes on disk and
bits per weight of the decoder-layer linear weights (scales, zeros and packing included)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quantkit.core.roofline import Shape, kv_bytes_per_token
from quantkit.models.headers import tensor_bytes


def _is_layer_linear_tensor(name: str) -> bool:
    return ".layers." in name and "norm" not in name and not name.endswith("weight_shape")


@dataclass(frozen=True)
class CheckpointSizes:
    """A checkpoint's bytes: on disk (every file), in its weight files, and of the decoder layers'
    linear weights as stored (scales, zeros and packing included) with how many weights they hold;
    bits per decoder-layer weight and per parameter; the KV cache's bytes per token at 16 bits."""

    disk_bytes: int
    weight_file_bytes: int
    bits_per_weight: float | None
    linear_bytes: int
    linear_weights: int
    bits_per_param: float
    kv_bytes_per_token: int


def checkpoint_sizes(path: Path) -> CheckpointSizes:
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    shape = Shape.from_config(cfg.get("text_config", cfg))
    tb = tensor_bytes(path)
    linear_bytes = sum(b for n, b in tb.items() if _is_layer_linear_tensor(n) and not n.endswith("bias"))
    linear_weights = shape.layers * shape.layer_linear_params()
    total_bytes = sum(tb.values())
    return CheckpointSizes(
        disk_bytes=sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
        weight_file_bytes=total_bytes,
        bits_per_weight=8.0 * linear_bytes / linear_weights if linear_weights else None,
        linear_bytes=linear_bytes,
        linear_weights=linear_weights,
        bits_per_param=8.0 * total_bytes / shape.total_params(),
        kv_bytes_per_token=int(kv_bytes_per_token(shape)),
    )


def stored_read_bytes(path: Path) -> int:
    """Bytes per decode token from the stored tensors (for engines whose tensors we cannot see)."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    tb = tensor_bytes(path)
    emb = next((b for n, b in tb.items() if n.endswith("embed_tokens.weight")), 0)
    row = emb // cfg["vocab_size"] if emb else 0
    total = sum(b for n, b in tb.items() if not n.endswith("weight_shape"))
    tied = not any(n.startswith("lm_head.") for n in tb)
    return int(total + row if tied else total - emb + row)
