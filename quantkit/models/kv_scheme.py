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
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from quantkit.core.kv_cache import FP8_BYTES
from quantkit.errors import ModelError


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


E4M3_MAX = 448.0  # FP8 E4M3's largest finite value
# A scale s stores K and V values up to 448·s. Within these bounds that largest value lies between
# F16's smallest normal and its largest value, the range a 16-bit model's activations have: a
# larger scale (60,000) leaves every activation a few of FP8's codes (most round to 0), a smaller
# one clamps every activation to ±448·s; 0, a negative or a non-finite scale is no scale at all.
SCALE_RANGE = (2.0**-14 / E4M3_MAX, 65504.0 / E4M3_MAX)
SCALE_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_SCALE = re.compile(r"(.*)\.([kv])_scale$")


def check_scales(cfg: dict, shards: list[tuple[Path, dict]]) -> None:
    """The K and V scales of a checkpoint that declares an FP8 KV cache scheme, checked where it is
    read (ModelError, one line naming the tensor): a k_scale and a v_scale for every layer, each of
    the shape its strategy gives (one value per tensor, one per KV head), in F32, F16 or BF16, and
    every value finite and within SCALE_RANGE. `shards`: (file, its header entries)."""
    facts = of_quantization_config(cfg.get("quantization_config"))
    if facts is None or not facts.known:
        return
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    kv_heads = text.get("num_key_value_heads") or text.get("num_attention_heads")
    per = kv_heads if facts.strategy == "attn_head" else 1
    found: dict[str, set[str]] = {}
    for path, table in shards:
        for name, e in table.items():
            m = _SCALE.fullmatch(name)
            if m is None:
                continue
            found.setdefault(m.group(2), set()).add(m.group(1))
            where = f"{path}: {name} ({facts.label})"
            if e.dtype not in SCALE_DTYPES:
                raise ModelError(f"{where}: a scale of dtype {e.dtype}; expected F32, F16 or BF16")
            if math.prod(e.shape) != per:
                raise ModelError(
                    f"{where}: shape {list(e.shape)}, {math.prod(e.shape)} values; a "
                    + (
                        "per-head scale holds one per KV head, "
                        if facts.strategy == "attn_head"
                        else "per-tensor scale holds "
                    )
                    + str(per)
                )
            _check_scale_values(path, name, e, where)
    layers = text.get("num_hidden_layers")
    for kind in ("k", "v"):
        have = found.get(kind, set())
        if isinstance(layers, int) and len(have) != layers:
            other = "v" if kind == "k" else "k"
            raise ModelError(
                f"{shards[0][0].parent}: {len(have)} {kind}_scale tensors for {layers} layers ({facts.label}); "
                f"every attention layer carries its {kind}_scale"
                + (f" (the {other}_scales are {len(found.get(other, set()))})" if found.get(other) else "")
            )


def _check_scale_values(path: Path, name: str, e, where: str) -> None:
    with open(path, "rb") as fh:
        fh.seek(e.start)
        raw = fh.read(e.end - e.start)
    values = torch.frombuffer(bytearray(raw), dtype=SCALE_DTYPES[e.dtype]).float() if raw else torch.empty(0)
    lo, hi = SCALE_RANGE
    bad = values[~(torch.isfinite(values) & (values >= lo) & (values <= hi))]
    if bad.numel():
        raise ModelError(
            f"{where}: a scale of {float(bad[0]):g}; an FP8 E4M3 scale is finite and between {lo:.3g} and {hi:.3g} "
            f"(so that 448 × scale, the largest value it stores, is within a 16-bit activation's range)"
        )


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
