"""Which artifacts vLLM serves, per device: what a model card may claim.

An artifact's weight schemes (`schemes`: from quantkit.json, the base scheme plus every override a
mixed precision wrote) each map to one entry of SUPPORT; the artifact is served on a device when
every scheme in it is. The CPU column is measured: benchmarks/vllm_compat.py converts the demo
model with every kind quantkit writes and loads each in vLLM's CPU build, and a test holds this
table equal to that result file. The GPU column is read from vLLM's kernel lists (vLLM 0.32.0,
`model_executor/kernels/linear/__init__.py`: the CUDA entries of _POSSIBLE_KERNELS for mixed
precision, _POSSIBLE_INT8_KERNELS, _POSSIBLE_FP8_KERNELS, _POSSIBLE_WFP8A16_KERNELS), not run.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM_VERSION = "0.32.0"  # the release both columns describe (external/vllm_env.py installs it)


@dataclass(frozen=True)
class Support:
    cpu: bool  # measured with vLLM's CPU build (False where it was not: a claim needs a measurement)
    gpu: bool  # read from vLLM's CUDA kernel lists
    cpu_why: str  # the kernel vLLM picked, or its own error
    gpu_why: str  # the kernels that implement it, or why none does


SUPPORT: dict[str, Support] = {
    "16-bit": Support(True, True, "dense bf16/fp32", "dense"),
    "int4-w4a16": Support(
        True,
        True,
        "CPUWNA16LinearKernel (uint4b8; uint4 with zero points)",
        "Machete (sm90), Marlin (sm75+), Exllama: uint4b8, and uint4 with zero points on Marlin",
    ),
    "int8-w8a16": Support(
        False,
        True,
        "refused, no CPU kernel for uint8b128 (CPUWNA16 takes uint4 and uint4b8 only)",
        "Marlin (sm75+), Exllama: uint8b128",
    ),
    "int8-w8a8": Support(
        True,
        True,
        "CPUInt8ScaledMMLinearKernel (int8 GEMM, dynamic per-token activations)",
        "CutlassInt8ScaledMMLinearKernel (sm75+), Triton",
    ),
    "fp8-w8a8": Support(
        True,
        True,
        "ChannelWiseTorchFP8ScaledMMLinearKernel (torch fallback: slow decode)",
        "CUTLASS / FlashInfer FP8 (sm89+), Marlin FP8 on older GPUs",
    ),
    "fp8-w8a16": Support(
        False,
        True,
        "refused, no CPU kernel for FP8 weight-only (its CPU list is empty)",
        "Marlin FP8, Humming (weight-only)",
    ),
    "bitsandbytes": Support(False, False, "not a vLLM 0.32 quantization method", "not a vLLM 0.32 quantization method"),
}


def _weight_only(bits: int) -> str:
    return f"int{bits}-w{bits}a16"


def schemes(meta: dict) -> list[str]:
    """The SUPPORT keys an artifact's quantkit.json describes, base scheme first (deduplicated)."""
    q = meta.get("quantization") or {}
    if not q:
        return ["16-bit"]
    if q.get("format") == "bitsandbytes":
        return ["bitsandbytes"]
    if str(q.get("weight_type", "")).startswith("float8"):
        return ["fp8-w8a8" if q.get("scheme") == "FP8-W8A8" else "fp8-w8a16"]
    if q.get("scheme") == "W8A8":
        return ["int8-w8a8"]
    found = [_weight_only(int(q.get("weight_bits", 16)))]
    # mixed precision: hand-written overrides, or those an auto step chose (written into the config it ran)
    found += [_weight_only(int(o.get("bits", 8))) for o in q.get("overrides") or []]
    return list(dict.fromkeys(found))


def verdict(found: list[str]) -> dict:
    """{"cpu": bool, "gpu": bool, "unknown": [...]} for an artifact holding these schemes: served on
    a device only when every scheme is; a scheme not in SUPPORT is served nowhere (never claimed)."""
    unknown = [s for s in found if s not in SUPPORT]
    known = [SUPPORT[s] for s in found if s in SUPPORT]
    return {
        "cpu": not unknown and all(s.cpu for s in known),
        "gpu": not unknown and all(s.gpu for s in known),
        "unknown": unknown,
    }


def card_lines(meta: dict) -> list[str]:
    """The model card's sentence on vLLM: where it serves this artifact, and what the claim rests on."""
    found = schemes(meta)
    v = verdict(found)
    what = ", ".join(found)
    if v["cpu"] and v["gpu"]:
        return [
            f"vLLM {VLLM_VERSION} serves it unchanged (`vllm serve PATH_OR_REPO`; {what}): on the CPU (measured with "
            "vLLM's CPU build) and on NVIDIA GPUs (from vLLM's CUDA kernel list, not run)."
        ]
    if v["gpu"]:
        why = "; ".join(SUPPORT[s].cpu_why for s in found if not SUPPORT[s].cpu)
        return [
            f"vLLM {VLLM_VERSION} serves it on NVIDIA GPUs (`vllm serve "
            f"PATH_OR_REPO`; {what}; from vLLM's CUDA kernel list, "
            f"not run); on the CPU: {why}."
        ]
    why = (
        "; ".join(SUPPORT[s].gpu_why for s in found if s in SUPPORT and not SUPPORT[s].gpu) or f"unknown scheme {what}"
    )
    return [f"vLLM {VLLM_VERSION} does not load it ({what}): {why}."]
