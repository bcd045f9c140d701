"""What each tensor of an artifact becomes in the GGUF, decided before a byte is written.

Which GGUF type holds a quantized module is decided on its scheme's facts (models/scheme_facts.py:
integer codes, MXFP4, NVFP4, ...), never on a scheme's name. Only scales and zero points are read
here (about 1/16 of a 4-bit model's bytes; asymmetric INT4 also unpacks its codes, as Q4_1's
offsets depend on them), so a refusal costs little and the GGUF header can state losslessness
before the tensor data follows it.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

import gguf

from quantkit.errors import ModelError, QuantkitError
from quantkit.gguf import grids
from quantkit.gguf.artifact import QUANT_SUFFIXES, Artifact
from quantkit.gguf.gguf_arch import Hparams

# a buffer some old checkpoints saved (llama.cpp computes RoPE itself); an FP8 KV cache scheme's K/V scales,
# which the serving engine's cache applies and llama.cpp's cache types replace (gguf/artifact_to_gguf.py _kv_cache_note)
SKIP = re.compile(r".*rotary_emb\.inv_freq$|.*\.(k|v|q)_(scale|zero_point)$")
EMBEDDING_TYPES = ("keep", "q8_0")


class NotLosslessError(QuantkitError):
    """The artifact's grid has no exact GGUF counterpart (and --allow-lossy was not given)."""


@dataclass(frozen=True)
class TensorPlan:
    name: str  # GGUF name
    source: str  # the artifact's tensor name (a quantized module's `.weight`)
    shape: tuple[int, ...]  # torch order: (rows, cols) or (n,)
    qtype: str  # gguf.GGMLQuantizationType member name
    how: str  # copy | grid | round-scales | requant | quantize
    permute: int | None  # heads for the q/k RoPE row permutation, None if rows stay
    exact: bool
    mapping: str  # e.g. "INT4 symmetric group 64 -> Q4_0"
    reason: str | None = None  # why it is not exact
    scale_tensor: str | None = None  # NVFP4: the GGUF name of the F32 `.scale` llama.cpp multiplies its output by

    @property
    def module(self) -> str:
        return self.source[: -len(".weight")]


def _dense_type(dtype: str, ndim: int, embedding: bool, embeddings: str) -> tuple[str, str, bool]:
    if ndim == 1:
        return "F32", "copy", True  # norms and biases: F32 as llama.cpp's converter writes them (exact from 16 bits)
    if embedding and embeddings == "q8_0":
        return "Q8_0", "quantize", False
    return {"F16": "F16", "BF16": "BF16", "F32": "F32"}[dtype], "copy", True


def _quant_plan(art: Artifact, module: str, allow_lossy: bool) -> tuple:
    """((rows, cols), qtype, how, exact, mapping, reason) for a quantized module."""
    facts = art.facts(module)
    if facts.weights in ("mxfp4", "nvfp4"):
        return _fp4_plan(art, module, allow_lossy)
    if facts.weights != "int":
        raise NotLosslessError(
            f"{module}: {facts.label} weights ({facts.weights}, {facts.bits} bits) have no exact GGUF type "
            "(exact: INT4/INT8 codes -> Q4_0, Q4_1, Q8_0; MXFP4 -> MXFP4; NVFP4 -> NVFP4); export the 16-bit "
            "checkpoint instead"
        )
    scale, zero, g_idx, (rows, cols), sch = art.quant_params(module)
    label = f"INT{sch.bits} {'symmetric' if sch.symmetric else 'asymmetric'} " + (
        "per channel" if sch.strategy == "channel" else f"group {sch.group_size}"
    )
    targets = {(4, True): "Q4_0", (4, False): "Q4_1", (8, True): "Q8_0"}
    qtype = targets.get((sch.bits, sch.symmetric))
    reason = None
    if qtype is None:
        reason = (
            f"{label} has no GGUF type with the same grid (Q4_0: INT4 symmetric, "
            "Q4_1: INT4 asymmetric, Q8_0: INT8 symmetric)"
        )
        qtype = "Q8_0" if sch.bits > 4 else ("Q4_0" if sch.symmetric else "Q4_1")
        return (rows, cols), *_lossy(module, qtype, "requant", label, reason, allow_lossy)
    try:
        blocks = grids.block_map(cols, scale.shape[1], g_idx)
    except grids.NotExact as exc:
        return (rows, cols), *_lossy(module, qtype, "requant", label, str(exc), allow_lossy)
    d = grids.expand(scale.float(), blocks)
    bad = grids.fp16_inexact(d)
    if bad:
        reason = f"{bad} of {d.numel()} block scales ({scale.dtype}) are not representable in GGUF's fp16"
    elif qtype == "Q4_1":
        qw = art.quant_weight(module)  # the offsets depend on each block's codes
        _, bad = grids.q4_1_offsets(qw.codes, d, grids.expand(zero, blocks))
        if bad:
            reason = (
                f"in {bad} of {d.numel()} blocks no Q4_1 minimum m = -scale*c (c an integer keeping the block's "
                "codes in [0, 15]) is an fp16 value"
            )
    if reason:
        return (rows, cols), *_lossy(module, qtype, "round-scales", label, reason, allow_lossy)
    return (rows, cols), qtype, "grid", True, f"{label} -> {qtype}", None


def _fp4_plan(art: Artifact, module: str, allow_lossy: bool) -> tuple:
    """MXFP4 -> MXFP4 exactly (codes and E8M0 exponents kept); NVFP4 -> NVFP4 with codes and E4M3
    scales kept and the global scale as llama.cpp's F32 `.scale` multiplier, exact only when 1/g is
    a float32 value (grids.py says why)."""
    fw = art.fp4_weight(module, codes=False)
    rows, cols = fw.scale_bytes.shape[0], fw.scale_bytes.shape[1] * fw.block
    if fw.facts.weights == "mxfp4":
        if bool((fw.scale_bytes == 255).any()):
            raise NotLosslessError(f"{module}: an E8M0 scale byte is 255 (NaN in the MX format); nothing to export")
        return (rows, cols), "MXFP4", "grid", True, "MXFP4 (E2M1, E8M0 scale per 32) -> MXFP4", None
    if cols % grids.QK_NVFP4:
        raise NotLosslessError(
            f"{module}: {cols} input columns are not a multiple of {grids.QK_NVFP4}, ggml's NVFP4 block (four of "
            "compressed-tensors' 16-value groups); no GGUF type holds these groups"
        )
    odd = int(((fw.scale_bytes & 0x80) > 0).sum() + ((fw.scale_bytes & 0x7F) == 0x7F).sum())
    if odd:
        raise NotLosslessError(
            f"{module}: {odd} E4M3 block scales are negative or NaN, which ggml's unsigned UE4M3 reads otherwise"
        )
    label = "NVFP4 (E2M1, E4M3 scale per 16, FP32 per tensor)"
    g = fw.global_scale
    if grids.power_of_two(g):
        return (rows, cols), "NVFP4", "grid", True, f"{label} -> NVFP4 + F32 .scale 1/g", None
    inv = grids.inverse_f32(g)
    reason = (
        f"NVFP4's per-tensor scale: compressed-tensors computes w = q * s / g with g = {g:.9g}; llama.cpp "
        f"multiplies each matmul's output by the tensor's F32 .scale, and 1/g has no float32 value (g is not a "
        f"power of two: the nearest, {inv:.9g}, is off by {abs(inv * g - 1):.1e} of every weight); the codes and "
        "E4M3 block scales carry over bit for bit"
    )
    return (rows, cols), *_lossy(module, "NVFP4", "global-scale", label, reason, allow_lossy)


def _lossy(module, qtype, how, label, reason, allow_lossy):
    if not allow_lossy:
        how_lossy = "with 1/g rounded to float32" if how == "global-scale" else "with ggml's rounding"
        raise NotLosslessError(
            f"{module}: {reason}; not exported (--allow-lossy maps it to {qtype} {how_lossy} and reports the KL)"
        )
    kind = {"requant": "re-quantized", "round-scales": "fp16-rounded scales", "global-scale": "F32 1/g"}[how]
    return qtype, how, False, f"{label} -> {qtype} (lossy: {kind})", reason


def make_plan(art: Artifact, hp: Hparams, *, embeddings: str = "keep", allow_lossy: bool = False) -> list[TensorPlan]:
    arch = getattr(gguf.MODEL_ARCH, hp.spec.gguf_arch)
    names = gguf.get_tensor_name_map(arch, hp.n_layer)
    quantized = set(art.quantized_modules())
    consumed = {f"{m}.{s}" for m in quantized for s in (*QUANT_SUFFIXES, "weight")}
    sources = sorted({f"{m}.weight" for m in quantized} | {n for n in art.names() if n not in consumed})
    plans = []
    for src in sources:
        if SKIP.match(src):
            continue
        if src == "lm_head.weight" and hp.tied:
            continue  # tied: llama.cpp reads the output projection from token_embd when output.weight is absent
        name = names.get_name(src, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ModelError(
                f"{art.path}: tensor {src} has no counterpart in llama.cpp's {hp.spec.gguf_arch.lower()} architecture"
            )
        permute = None
        if hp.spec.permute_qk and re.search(r"\.attn_(q|k)\.(weight|bias)$", name):
            permute = hp.n_head if ".attn_q." in name else hp.n_head_kv
        embedding = name in ("token_embd.weight", "output.weight")
        scale = None
        if src.endswith(".weight") and src[: -len(".weight")] in quantized:
            shape, qtype, how, exact, mapping, reason = _quant_plan(art, src[: -len(".weight")], allow_lossy)
            if qtype == "NVFP4":  # the global scale: llama.cpp's per-tensor multiplier beside the weight
                scale = name[: -len(".weight")] + ".scale"
                source = src[: -len(".weight")] + ".weight_global_scale"
                extra = TensorPlan(
                    scale, source, (1,), "F32", "inverse-global-scale", None, exact, "NVFP4 g -> F32 1/g"
                )
        else:
            dtype = art.dtype(src)
            if dtype not in ("F16", "BF16", "F32"):
                raise ModelError(
                    f"{art.path}: tensor {src} is {dtype}, neither a 16/32-bit float nor part of a quantized module"
                )
            shape = art.shape(src)
            qtype, how, exact = _dense_type(dtype, len(shape), embedding, embeddings)
            mapping = f"{dtype} -> {qtype}" + ("" if exact else " (lossy: requested with --embeddings q8_0)")
            reason = None if exact else "--embeddings q8_0"
        if qtype in ("Q4_0", "Q4_1", "Q8_0") and shape[-1] % grids.QK:
            raise NotLosslessError(f"{src}: {shape[-1]} columns are not a multiple of {grids.QK}, ggml's block size")
        plans.append(TensorPlan(name, src, tuple(shape), qtype, how, permute, exact, mapping, reason, scale))
        if scale is not None:
            plans.append(dataclasses.replace(extra, reason=reason))
    _check_complete(art, hp, plans)
    return plans


def _check_complete(art: Artifact, hp: Hparams, plans: list[TensorPlan]) -> None:
    have = {p.name for p in plans}
    need = ["token_embd.weight", "output_norm.weight"] + ([] if hp.tied else ["output.weight"])
    for i in range(hp.n_layer):
        need += [
            f"blk.{i}.{t}.weight"
            for t in (
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            )
        ]
    missing = [n for n in need if n not in have]
    if missing:
        raise ModelError(
            f"{art.path}: incomplete checkpoint, no tensor for llama.cpp's {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )


def file_type(plans: list[TensorPlan]) -> int:
    """general.file_type: the most common type among 2-D weights (llama.cpp's 'mostly X')."""

    counts = Counter(
        p.qtype for p in plans if len(p.shape) == 2 and p.name not in ("token_embd.weight", "output.weight")
    )
    top = counts.most_common(1)[0][0] if counts else "F16"
    return {
        "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "MXFP4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE,  # llama.cpp's one MXFP4 file type (a label: "MXFP4 MoE")
        "NVFP4": gguf.LlamaFileType.MOSTLY_NVFP4,
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "BF16": gguf.LlamaFileType.MOSTLY_BF16,
        "F32": gguf.LlamaFileType.ALL_F32,
    }[top]


def mapping_summary(plans: list[TensorPlan]) -> list[dict]:
    counts = Counter((p.mapping, p.exact) for p in plans)
    return [{"mapping": m, "tensors": n, "exact": e} for (m, e), n in sorted(counts.items())]
