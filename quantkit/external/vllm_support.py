"""Which artifacts vLLM serves, per device: what a model card may claim.

Decided on facts, never on names: each scheme an artifact holds (models/scheme_facts.py: read from
its config.json at conversion and kept in quantkit.json) is matched against RULES, a small table
keyed by those facts (weight format, bits, symmetry, activation format, dynamic or not); the first
rule whose every stated fact agrees decides. A scheme no rule matches is unknown and served
nowhere; an artifact is served on a device only when every scheme in it is.

The CPU column is measured: benchmarks/vllm_compat.py converts the demo model with every kind
quantkit writes and loads each in vLLM's CPU build, and a test holds each rule's CPU claim equal to
that result file. The GPU column is read from vLLM's code (vLLM 0.32.0), not run:
`model_executor/kernels/linear/__init__.py` (the CUDA entries of _POSSIBLE_KERNELS for mixed
precision, _POSSIBLE_INT8_KERNELS, _POSSIBLE_FP8_KERNELS, _POSSIBLE_WFP8A16_KERNELS,
_POSSIBLE_NVFP4_KERNELS with init_nvfp4_linear_kernel's weight-only choice, _POSSIBLE_MXFP4_KERNELS)
and `layers/quantization/compressed_tensors/compressed_tensors.py` (_get_scheme_from_parts: which
scheme class a checkpoint's arguments select, and its get_min_capability).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from quantkit.models import scheme_facts
from quantkit.models.kv_scheme import KvCacheFacts
from quantkit.models.scheme_facts import SchemeFacts

VLLM_VERSION = "0.32.0"  # the release both columns describe (external/vllm_env.py installs it)


@dataclass(frozen=True)
class Support:
    cpu: bool  # measured with vLLM's CPU build (False where it was not: a claim needs a measurement)
    gpu: bool  # read from vLLM's CUDA kernel lists
    cpu_why: str  # the kernel vLLM picked, or its own error
    gpu_why: str  # the kernels that implement it (and the GPUs they need), or why none does


@dataclass(frozen=True)
class Rule:
    """Schemes with these facts (a fact left None matches any value), and what vLLM does with them."""

    what: str  # the table's words for the schemes it covers
    support: Support
    container: str | None = "compressed-tensors"
    weights: str | None = None
    bits: int | None = None
    symmetric: bool | None = None
    activations: str | None = "16-bit"
    activation_bits: int | None = None
    dynamic: bool | None = None

    def matches(self, facts: SchemeFacts) -> bool:
        keys = [f.name for f in fields(self) if f.name not in ("what", "support")]
        return all(getattr(self, k) is None or getattr(self, k) == getattr(facts, k) for k in keys)


RULES: tuple[Rule, ...] = (
    Rule(
        "16-bit (no quantization)",
        Support(True, True, "dense bf16/fp32", "dense"),
        container="dense",
        activations=None,
    ),
    Rule(
        "INT4 weight-only (W4A16): groups or per channel, symmetric or with zero points",
        Support(
            True,
            True,
            "CPUWNA16LinearKernel (uint4b8; uint4 with zero points)",
            "Machete (sm90), Marlin (sm75+), Exllama: uint4b8, and uint4 with zero points on Marlin",
        ),
        weights="int",
        bits=4,
    ),
    Rule(
        "INT8 weight-only (W8A16)",
        Support(
            False,
            True,
            "refused, no CPU kernel for uint8b128 (CPUWNA16 takes uint4 and uint4b8 only)",
            "Marlin (sm75+), Exllama: uint8b128",
        ),
        weights="int",
        bits=8,
    ),
    Rule(
        "INT8 weights, INT8 activations rounded per token at run time (W8A8)",
        Support(
            True,
            True,
            "CPUInt8ScaledMMLinearKernel (int8 GEMM, dynamic per-token activations)",
            "CutlassInt8ScaledMMLinearKernel (sm75+), Triton",
        ),
        weights="int",
        bits=8,
        activations="int",
        activation_bits=8,
        dynamic=True,
    ),
    Rule(
        "FP8 E4M3 weights, FP8 activations rounded per token at run time",
        Support(
            True,
            True,
            "ChannelWiseTorchFP8ScaledMMLinearKernel (torch fallback: slow decode)",
            "CUTLASS / FlashInfer FP8 (sm89+), Marlin FP8 on older GPUs",
        ),
        weights="float",
        bits=8,
        activations="float",
        activation_bits=8,
        dynamic=True,
    ),
    Rule(
        "FP8 E4M3 weight-only",
        Support(
            False,
            True,
            "refused, no CPU kernel for FP8 weight-only (its CPU list is empty)",
            "Marlin FP8, Humming (weight-only)",
        ),
        weights="float",
        bits=8,
    ),
    Rule(
        "NVFP4 weight-only (FP4 E2M1, FP8 E4M3 scales per 16, FP32 per tensor)",
        Support(
            False,
            True,
            "refused: weight-only NVFP4 forces MarlinNvFp4LinearKernel, CUDA-only (init_nvfp4_linear_kernel; "
            "_POSSIBLE_NVFP4_KERNELS has no CPU entry)",
            "CompressedTensorsW4A4Fp4(use_a16), sm75+: FlashInfer CuTe-DSL W4A16 on Blackwell (sm100/103, "
            "FP4 tensor cores), Humming then Marlin FP4 on Hopper (sm90: H100, H200), Marlin FP4 on sm75-sm89; "
            "the activations stay 16-bit",
        ),
        weights="nvfp4",
        symmetric=True,
    ),
    Rule(
        "MXFP4 weight-only (FP4 E2M1, E8M0 scales per 32)",
        Support(
            False,
            True,
            "refused, no CPU kernel: _POSSIBLE_MXFP4_KERNELS has no CPU entry",
            "CompressedTensorsW4A4Mxfp4, sm80+: Humming then Marlin MXFP4 (weight-only) on Hopper (sm90: H100, "
            "H200) and Ampere/Ada; on Blackwell (sm100+) with FlashInfer its kernel rounds the activations to "
            "MXFP4 too (W4A4, not what the checkpoint asks), without it Marlin",
        ),
        weights="mxfp4",
        symmetric=True,
    ),
    Rule(
        "bitsandbytes (NF4, LLM.int8())",
        Support(False, False, "not a vLLM 0.32 quantization method", "not a vLLM 0.32 quantization method"),
        container="bitsandbytes",
        activations=None,
    ),
)


@dataclass(frozen=True)
class KvRule:
    """A KV cache scheme with these facts (models/kv_scheme.py; None matches any), and what vLLM does
    with it: `kv_cache_dtype` "auto" takes FP8 for a checkpoint that declares one (and "fp8" asks for
    it), its scales loaded by CompressedTensorsKVCacheMethod (float, 8 bits, tensor or attn_head,
    symmetric; anything else refused)."""

    what: str
    support: Support
    format: str | None = None
    strategy: str | None = None

    def matches(self, facts: KvCacheFacts) -> bool:
        return all(getattr(self, k) in (None, getattr(facts, k)) for k in ("format", "strategy"))


# GPU: the CUDA attention backends that take an FP8 cache (v1/attention/backends: flash_attn.py with
# fa_utils.flash_attn_supports_kv_cache_dtype, flashinfer.py, triton_attn.py) in platforms/cuda.py's
# priority order; per-head scales only where supports_per_head_quant_scales (FlashAttention 3 and up).
KV_RULES: tuple[KvRule, ...] = (
    KvRule(
        "FP8 E4M3 K/V, a scale per tensor (a layer's K, its V)",
        Support(
            True,
            True,
            "CPU_ATTN with an FP8 cache (AVX-512 or AMX: cpu_attn.py _get_attn_isa; head size a multiple of 32)",
            "FlashAttention 3 on Hopper (sm90: H100, H200), FlashInfer on Blackwell (sm100) and on Ampere/Ada "
            "(sm80-sm89, whose FlashAttention 2 has no FP8 cache), Triton elsewhere",
        ),
        format="fp8_e4m3",
        strategy="tensor",
    ),
    KvRule(
        "FP8 E4M3 K/V, a scale per KV head",
        Support(
            True,
            True,
            "CPU_ATTN with an FP8 cache, the per-head scales reduced to one per layer (their largest: "
            "CompressedTensorsKVCacheMethod.process_weights_after_loading), so each head is not rounded as calibrated",
            "only FlashAttention 3 and up take per-head scales: Hopper (sm90: H100, H200, FA3) and Blackwell "
            "(sm100, FA4); on Ampere/Ada no backend takes them (FlashInfer and Triton have no per-head scales)",
        ),
        format="fp8_e4m3",
        strategy="attn_head",
    ),
)


def kv_rule_for(facts: KvCacheFacts) -> KvRule | None:
    """The rule that decides a KV cache scheme, or None: unknown, served nowhere."""
    return next((r for r in KV_RULES if r.matches(facts)), None) if facts.known else None


def kv_facts(meta: dict) -> KvCacheFacts | None:
    """The KV cache scheme an artifact's quantkit.json records (None: none, the cache is 16-bit)."""
    q = meta.get("quantization") if isinstance(meta, dict) else None
    found = q.get("kv_cache") if isinstance(q, dict) else None
    return None if found is None else KvCacheFacts.from_dict(found) or KvCacheFacts("unknown", "unreadable", True, 0)


def rule_for(facts: SchemeFacts) -> Rule | None:
    """The rule that decides a scheme, or None: unknown, served nowhere."""
    if not facts.known:
        return None
    return next((r for r in RULES if r.matches(facts)), None)


def schemes(meta: dict) -> list[SchemeFacts]:
    """The schemes an artifact's quantkit.json records, base scheme first."""
    return scheme_facts.of_meta(meta)


def verdict(found: list[SchemeFacts], kv: KvCacheFacts | None = None) -> dict:
    """{"cpu": bool, "gpu": bool, "unknown": [labels]} for an artifact holding these schemes (and this
    KV cache scheme): served on a device only when every scheme is; a scheme no rule matches is
    served nowhere (never claimed)."""
    rules = [rule_for(f) for f in found]
    unknown = [f.label for f, r in zip(found, rules) if r is None]
    supports = [r.support for r in rules if r is not None]
    if kv is not None:
        kv_rule = kv_rule_for(kv)
        unknown += [kv.label] if kv_rule is None else []
        supports += [kv_rule.support] if kv_rule is not None else []
    return {
        "cpu": bool(found) and not unknown and all(s.cpu for s in supports),
        "gpu": bool(found) and not unknown and all(s.gpu for s in supports),
        "unknown": unknown,
    }


def card_lines(meta: dict) -> list[str]:
    """The model card's sentence on vLLM: where it serves this artifact, and what the claim rests on."""
    found, kv = schemes(meta), kv_facts(meta)
    v = verdict(found, kv)
    what = ", ".join(dict.fromkeys([f.label for f in found] + ([kv.label] if kv else [])))
    rules = [r for r in (rule_for(f) for f in found) if r is not None]
    rules += [r for r in ([kv_rule_for(kv)] if kv else []) if r is not None]
    if v["cpu"] and v["gpu"]:
        return [
            f"vLLM {VLLM_VERSION} serves it unchanged (`vllm serve PATH_OR_REPO`; {what}): on the CPU (measured with "
            "vLLM's CPU build) and on NVIDIA GPUs (from vLLM's CUDA kernel list, not run)."
        ]
    if v["gpu"]:
        why = "; ".join(dict.fromkeys(r.support.cpu_why for r in rules if not r.support.cpu))
        return [
            f"vLLM {VLLM_VERSION} serves it on NVIDIA GPUs (`vllm serve "
            f"PATH_OR_REPO`; {what}; from vLLM's CUDA kernel list, "
            f"not run); on the CPU: {why}."
        ]
    why = "; ".join(dict.fromkeys(r.support.gpu_why for r in rules if not r.support.gpu)) or f"unknown scheme {what}"
    return [f"vLLM {VLLM_VERSION} does not load it ({what}): {why}."]
