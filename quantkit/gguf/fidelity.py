"""What a GGUF computes, measured in transformers: its tensors dequantized with the gguf package,
mapped back to the artifact's names (q/k rows un-permuted), loaded into a dense copy of the model,
and compared with the artifact as transformers loads it (float32 both, so only the weights differ).

A lossless export gives KL 0 exactly; a lossy one (--allow-lossy, --embeddings q8_0) reports its KL.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from quantkit.data.text import parse_spec, read_text, region_windows, tokenize_stream
from quantkit.errors import DataError, ModelError, VerificationError
from quantkit.gguf.artifact import Artifact
from quantkit.gguf.gguf_arch import Hparams
from quantkit.gguf.gguf_records import KlCheck
from quantkit.gguf.grids import rope_unpermute
from quantkit.gguf.read import open_reader
from quantkit.gguf.tensor_map import TensorPlan
from quantkit.gguf.tensors import column_weights
from quantkit.models.checkpoint import load_model, load_tokenizer, read_config
from quantkit.models.logits import compare_logits, fixed_tokens, logits


def gguf_weights(gguf_path: Path, plans: list[TensorPlan]) -> dict[str, torch.Tensor]:
    """The GGUF's tensors as float32, under the artifact's tensor names and in transformers' row order."""

    reader = open_reader(gguf_path)
    by_name = {t.name: t for t in reader.tensors}
    out = {}
    for p in plans:
        if p.how == "inverse-global-scale":
            continue  # NVFP4's per-tensor multiplier: applied to its weight below, as llama.cpp applies it
        t = by_name[p.name]
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)).reshape(p.shape)
        if p.scale_tensor is not None:
            w = w * float(np.asarray(by_name[p.scale_tensor].data, dtype=np.float32).reshape(-1)[0])
        out[p.source] = rope_unpermute(w, p.permute) if p.permute else w
    return out


def dense_model(artifact: Path, weights: dict[str, torch.Tensor]):
    """A float32 model of the artifact's architecture holding `weights` (no quantization config)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(artifact))
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fill the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.eval()


def token_windows(artifact: Path, text_spec: str | None, n: int = 4, length: int = 128) -> tuple[torch.Tensor, str]:
    """`n` windows of `length` tokens of real text (a text SPEC: the first n of
    its first half), else seeded random ids."""

    if text_spec:
        spec = parse_spec(text_spec)
        stream = tokenize_stream(load_tokenizer(artifact), read_text(spec).text)
        spans = region_windows(len(stream), length, "first-half")[:n]
        if not spans:
            raise DataError(
                f"{spec}: {len(stream)} tokens, shorter than one {length}-token window in region first-half"
            )
        return torch.stack([stream[s:e] for s, e in spans]), f"{text_spec} (first half, {len(spans)} x {length} tokens)"
    vocab = read_config(artifact)["vocab_size"]
    return fixed_tokens(
        vocab, n=n, length=length
    ), f"{n} x {length} seeded random token ids (pass --kl-text for real text)"


def artifact_weights(artifact: Path, plans: list[TensorPlan]) -> dict[str, torch.Tensor]:
    """The artifact's own float32 weights, (q - z) * s for every column's group, read without transformers."""

    out = {}
    with Artifact(artifact) as art:
        quantized = set(art.quantized_modules())
        for p in plans:
            if p.how == "inverse-global-scale":
                continue  # part of its NVFP4 weight
            if p.qtype in ("MXFP4", "NVFP4"):
                out[p.source] = art.fp4_weight(p.module).weight().to(torch.float32)
            elif p.module in quantized and p.source.endswith(".weight"):
                qw = art.quant_weight(p.module)
                out[p.source] = column_weights(qw.codes, qw.scale, qw.zero, qw.g_idx)
            else:
                out[p.source] = art.tensor(p.source).to(torch.float32)
    return out


def _reference(artifact: Path, plans: list[TensorPlan]):
    """The artifact as transformers loads it; when the installed transformers/compressed-tensors cannot
    load it (an older format, e.g. act-order g_idx), a dense model of its exact weights instead."""

    try:
        return load_model(artifact, dtype="float32"), "the artifact loaded by transformers (float32)"
    except ModelError as exc:
        why = str(exc).split("(", 1)[-1][:120]
        return dense_model(artifact, artifact_weights(artifact, plans)), (
            f"the artifact's weights (q - z) * s in a dense float32 model (transformers cannot load it: {why}"
        )


def logits_kl(
    artifact: Path, gguf_path: Path, plans: list[TensorPlan], hp: Hparams, text_spec: str | None = None
) -> KlCheck:
    """KL(artifact || GGUF weights) per token over the windows, both in transformers at float32."""

    ids, described = token_windows(artifact, text_spec)
    ref_model, reference = _reference(artifact, plans)
    ref = logits(ref_model, ids)
    del ref_model
    new = logits(dense_model(artifact, gguf_weights(gguf_path, plans)), ids)
    kl = KlCheck(
        **compare_logits(ref, new),
        tokens=int(ids.numel()),
        text=described,
        reference=reference,
        engine="transformers, float32",
    )
    if not kl.finite:  # a lossy GGUF's KL is its fidelity figure: NaN is a broken file, not a figure
        side = "the artifact" if not kl.reference_finite else "the GGUF's weights"
        raise VerificationError(
            f"the lossy GGUF's fidelity check against {artifact} gives no finite KL ({side} give non-finite logits "
            "on the check's tokens); nothing was written"
        )
    return kl
