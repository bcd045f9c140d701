"""The KV cache's element types: what one cached value costs in bytes, llama.cpp's cache types, and
the recipe key that says how an artifact's cache is quantized.

Two kinds of quantized cache exist, one per serving stack:

- FP8 E4M3 with calibrated scales (compressed-tensors' `kv_cache_scheme`): llm-compressor
  calibrates a scale per tensor or per KV head on the calibration windows and stores it in the
  checkpoint (`k_scale`, `v_scale` beside each attention); vLLM stores K and V in FP8 with those
  scales (its `kv_cache_dtype` "auto" picks fp8 for such a checkpoint), transformers with
  compressed-tensors rounds K and V to FP8 and back at the cache update (models/kv_scheme.py).
- llama.cpp's cache types (`-ctk`/`-ctv`, llama-cpp-python's `type_k`/`type_v`): a setting of the
  run, not of the file; blocks of 32 values with an fp16 scale each (ggml-common.h), computed as
  the cache is written. llama.cpp runs a quantized V cache only with flash attention
  (llama-context.cpp refuses the context otherwise; measured: "Failed to create llama_context").
  A quantized K or V cache holds whole blocks of each attention head (llama 0.3.36's
  llama-context.cpp refuses a K type whose block does not divide n_embd_head_k, and a V type
  whose block does not divide n_embd_head_v, when flash attention is on; without it, the K
  cache is read per head through a view of ggml_row_size(type, n_embd_head_k) bytes
  (llama-kv-cache.cpp get_k), which for a head of 24 values and a block of 32 is no whole row
  and ggml aborts the process: ggml.c `GGML_ASSERT(view_src == NULL || ... <= ggml_nbytes(view_src))`).
  So `check_heads` refuses both before the context is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import field_validator, model_validator

from quantkit.core.yamlio import StrictConfig
from quantkit.errors import QuantkitError


@dataclass(frozen=True)
class CacheType:
    """One llama.cpp cache type: its ggml type id and its bytes per cached value."""

    name: str
    ggml_id: int  # ggml.h enum ggml_type (gguf-py GGMLQuantizationType)
    block: int  # values per block
    block_bytes: int  # bytes per block (ggml-common.h: a q8_0 block is an fp16 scale and 32 int8)

    @property
    def bytes_per_value(self) -> float:
        return self.block_bytes / self.block

    @property
    def quantized(self) -> bool:
        return self.block > 1


# The types llama.cpp's `--cache-type-k/-v` accept (common/arg.cpp kv_cache_types), in its order.
LLAMACPP_TYPES: dict[str, CacheType] = {
    t.name: t
    for t in (
        CacheType("f32", 0, 1, 4),
        CacheType("f16", 1, 1, 2),
        CacheType("bf16", 30, 1, 2),
        CacheType("q8_0", 8, 32, 34),
        CacheType("q4_0", 2, 32, 18),
        CacheType("q4_1", 3, 32, 20),
        CacheType("iq4_nl", 20, 32, 18),
        CacheType("q5_0", 6, 32, 22),
        CacheType("q5_1", 7, 32, 24),
    )
}
LLAMACPP_DEFAULT = "f16"  # llama.cpp's and llama-cpp-python's default for K and V
FP8_BYTES = 1.0  # an FP8 E4M3 value; its scales are one float per tensor or per KV head, not per token


@dataclass(frozen=True)
class LlamaCache:
    """The K and V cache types of a llama.cpp run."""

    k: str = LLAMACPP_DEFAULT
    v: str = LLAMACPP_DEFAULT

    @property
    def label(self) -> str:
        """`q8_0` where K and V share the type, else `q8_0/f16` (K/V), as --kv-cache takes it."""
        return self.k if self.k == self.v else f"{self.k}/{self.v}"

    @property
    def quantized(self) -> bool:
        return LLAMACPP_TYPES[self.k].quantized or LLAMACPP_TYPES[self.v].quantized

    @property
    def needs_flash_attn(self) -> bool:
        """llama.cpp refuses a quantized V cache without flash attention."""
        return LLAMACPP_TYPES[self.v].quantized

    def value_bytes(self) -> tuple[float, float]:
        """Bytes per cached K value and per cached V value."""
        return LLAMACPP_TYPES[self.k].bytes_per_value, LLAMACPP_TYPES[self.v].bytes_per_value

    def flash_attn(self, asked: bool | None) -> bool | None:
        """The flash-attention setting this cache runs with: as asked, and on where asked nothing
        (None) and the V cache is quantized (the only way llama.cpp runs it)."""
        return True if asked is None and self.needs_flash_attn else asked

    def check_flash_attn(self, asked: bool | None, where: str) -> None:
        """One line where flash attention is asked off for a cache llama.cpp runs only with it."""
        if asked is False and self.needs_flash_attn:
            raise QuantkitError(
                f"{where}: a {self.v} V cache runs in llama.cpp only with flash attention (llama.cpp refuses the "
                "context without it); use flash attention on, or a 16-bit V cache (K alone may be quantized)"
            )

    def check_heads(self, head_k: int, head_v: int, asked: bool | None, where: str) -> None:
        """One line, naming the rule, for a cache llama.cpp cannot hold for these heads: a quantized
        type holds whole blocks of each head (llama-context.cpp; without flash attention ggml aborts
        on the K cache's view instead), and a quantized V cache needs flash attention."""
        self.check_flash_attn(self.flash_attn(asked), where)
        for part, name, head in (("K", self.k, head_k), ("V", self.v, head_v)):
            block = LLAMACPP_TYPES[name].block
            if head % block:
                raise QuantkitError(
                    f"{where}: a {name} {part} cache holds whole blocks of {block} values per attention head, and "
                    f"this model's heads hold {head}, not a multiple of {block} (llama.cpp refuses that with flash "
                    f"attention and aborts without it); keep {part} in f16 or bf16"
                )


def head_dims(cfg: dict) -> tuple[int, int]:
    """Values per attention head of K and of V from a model's config (a GGUF's: key_length and
    value_length), where a config names none: hidden size / heads."""
    default = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(default), int(cfg.get("value_head_dim") or default)


def parse_llama_cache(spec: str, where: str = "--kv-cache") -> LlamaCache:
    """`q8_0` (K and V) or `q8_0/f16` (K, V) -> LlamaCache; an unknown type is one line listing them."""
    parts = [p.strip().lower() for p in str(spec).split("/")]
    if len(parts) not in (1, 2) or not all(parts):
        raise QuantkitError(f"{where} {spec!r}: give one cache type for K and V, or K/V (e.g. q8_0 or q8_0/f16)")
    for p in parts:
        if p not in LLAMACPP_TYPES:
            raise QuantkitError(
                f"{where} {spec!r}: {p!r} is not a llama.cpp cache type; valid: {', '.join(LLAMACPP_TYPES)}"
            )
    return LlamaCache(parts[0], parts[-1])


def value_bytes(spec: str, where: str = "--kv-cache") -> float:
    """Bytes per cached value of a cache: `fp8` (E4M3, an FP8 kv_cache_scheme), or llama.cpp's types
    (`q8_0`, K/V `q8_0/f16`: the mean of K's and V's, as core/roofline.kv_bytes counts a token)."""
    if str(spec).strip().lower() == "fp8":
        return FP8_BYTES
    if "fp8" in [p.strip().lower() for p in str(spec).split("/")]:
        raise QuantkitError(
            f"{where} {spec!r}: fp8 is one cache for K and V together (an FP8 kv_cache_scheme); a K/V pair "
            f"takes llama.cpp's types: {', '.join(LLAMACPP_TYPES)}"
        )
    try:
        k, v = parse_llama_cache(spec, where).value_bytes()
    except QuantkitError as exc:
        raise QuantkitError(f"{exc}, or fp8") from None
    return (k + v) / 2


def parse_llama_caches(spec: str, where: str = "--kv-cache") -> tuple[LlamaCache, ...]:
    """A comma-separated list (`f16,q8_0,q4_0`), each once."""
    caches = tuple(parse_llama_cache(s, where) for s in str(spec).split(",") if s.strip())
    if len(set(caches)) != len(caches):
        raise QuantkitError(f"{where} {spec!r}: give each cache once")
    return caches


class KvCacheConfig(StrictConfig):
    """A quantize step's `kv_cache:`: how the artifact's KV cache is quantized where it is served.

    `fp8: tensor | head`: FP8 E4M3 K and V with a scale per tensor or per KV head, calibrated by
    llm-compressor in the step's own pass on the calibration windows and stored in the checkpoint
    (compressed-tensors' kv_cache_scheme; vLLM and transformers read it). `llamacpp: q8_0` (or
    `q8_0/f16`, K/V): the cache types the artifact's GGUF runs with in llama.cpp, a setting of the
    run that quantkit's llama.cpp engine and scorer apply (llama.cpp has no FP8 cache)."""

    fp8: Literal["tensor", "head"] | None = None
    llamacpp: str | None = None

    @field_validator("llamacpp")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return parse_llama_cache(v, "llamacpp").label
        except QuantkitError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _something(self) -> "KvCacheConfig":
        if self.fp8 is None and self.llamacpp is None:
            raise ValueError("give fp8: tensor | head (the checkpoint's FP8 scales) or llamacpp: TYPE, or both")
        return self

    @property
    def llama_cache(self) -> LlamaCache | None:
        return parse_llama_cache(self.llamacpp, "llamacpp") if self.llamacpp else None

    @property
    def strategy(self) -> str | None:
        """compressed-tensors' strategy of the FP8 scales (quant_args.py QuantizationStrategy)."""
        return {"tensor": "tensor", "head": "attn_head"}.get(self.fp8 or "")
