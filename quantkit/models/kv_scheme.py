"""A checkpoint's KV cache scheme: what its config.json declares (compressed-tensors'
`kv_cache_scheme`) as facts, and that scheme's rounding switched on or off in a loaded model.

llm-compressor calibrates the scheme and saves it as `quantization_config.kv_cache_scheme` (FP8 E4M3,
`strategy` tensor or attn_head, symmetric) with `k_scale` and `v_scale` beside every attention
module. When transformers loads such a checkpoint, compressed-tensors (quantization/lifecycle/
apply.py `_apply_kv_cache_scheme`) attaches a `QuantizedKVCache` to each attention and a hook that
routes the attention's cache update through it (modeling/kvcache.py): the keys after RoPE and the
values are rounded to FP8 with those scales and back (`forward_quantize`), then cached. That is
what vLLM's FP8 cache stores (it writes K after RoPE and V as FP8 with the same per-layer scales:
`reshape_and_cache` with k_scale/v_scale) and reads back for every later token and the current
one: transformers' forward of such a checkpoint rounds the same values the same way (x / scale,
clamped to E4M3's ±448, rounded to nearest, times the scale), up to the float rounding of the
division. A hook on k_proj/v_proj would round the keys before RoPE, which no cache holds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from quantkit.core.kv_cache import FP8_BYTES


@dataclass(frozen=True)
class KvCacheFacts:
    """The KV cache scheme a checkpoint declares."""

    format: str  # "fp8_e4m3" (float, 8 bits), or "unknown"
    strategy: str  # what one scale covers: "tensor" (a layer's K, or V) or "attn_head" (one KV head of it)
    symmetric: bool
    bits: int

    @property
    def known(self) -> bool:
        return self.format == "fp8_e4m3" and self.strategy in ("tensor", "attn_head") and self.symmetric

    @property
    def label(self) -> str:
        scales = {"tensor": "per-tensor", "attn_head": "per-head"}.get(self.strategy, self.strategy)
        return f"{self.format} K/V, {scales} scales" if self.known else f"unknown KV cache scheme ({self.format})"

    @property
    def value_bytes(self) -> float:
        """Bytes per cached value where an engine stores this scheme (FP8: one)."""
        return FP8_BYTES

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> "KvCacheFacts | None":
        return cls(**d) if isinstance(d, dict) and set(d) == {"format", "strategy", "symmetric", "bits"} else None


def of_quantization_config(qc) -> KvCacheFacts | None:
    """The facts of a `quantization_config`'s kv_cache_scheme; None where it declares none."""
    kv = qc.get("kv_cache_scheme") if isinstance(qc, dict) else None
    if not kv:
        return None
    if not isinstance(kv, dict):
        return KvCacheFacts("unknown", "unknown", True, 0)
    bits, kind = kv.get("num_bits"), kv.get("type", "int")
    fmt = "fp8_e4m3" if kind == "float" and bits == 8 else f"{kind}{bits}"
    return KvCacheFacts(fmt, str(kv.get("strategy")), bool(kv.get("symmetric", True)), int(bits or 0))


def of_checkpoint(path: Path) -> KvCacheFacts | None:
    """The KV scheme a checkpoint directory's config.json declares (None: none, or no config)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    cfg = json.loads(config.read_text())
    return of_quantization_config(cfg.get("quantization_config"))


def rounding_modules(model) -> list:
    """The attention modules whose cache update rounds K and V (compressed-tensors' QuantizedKVCache)."""
    return [m for m in model.modules() if hasattr(m, "kv_cache") and hasattr(m, "quantization_scheme")]


def set_rounding(model, on: bool) -> int:
    """Switch the checkpoint's K/V rounding on or off in a model transformers loaded; returns how
    many attention modules it applies to (0: the model has no KV scheme)."""
    found = rounding_modules(model)
    for m in found:
        m.quantization_enabled = on
    return len(found)
