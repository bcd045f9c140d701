#!/usr/bin/env python
"""Logits of an exported GGUF through llama.cpp against the artifact's logits in transformers.

The weights are identical (quantkit export checks that bit for bit), so what differs is how each
engine rounds activations. llama.cpp's CPU backend multiplies Q4_0/Q8_0 weights with activations
quantized to Q8_0 (blocks of 32 values, fp16 scale: ggml-cpu's vec_dot_type for these types), F16
weights with fp16 activations, and keeps its KV cache in fp16. Measured per token:

  engines    KL(transformers fp32 || llama.cpp, default settings)
  simulated  KL(transformers fp32 || transformers fp32 with those roundings applied to its activations)
  same_prefix / residual: llama.cpp with an F32 KV cache against the simulation without KV rounding:
             the number of leading positions whose logits agree to float32 noise (KL < 1e-9), the
             fraction of all positions that do, and the mean KL.
             Rounding is discontinuous: once fp32-level differences (attention sums, accumulation
             order) flip one Q8_0 code, the two runs differ by a rounding step, so the residual is of
             the order of the rounding itself; an export error would show at position 0.

Usage: benchmarks/gguf_logits_agreement.py ARTIFACT FILE.gguf --text file:PATH [--tokens 512] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


FP32_NOISE_KL = 1e-9  # KL between two float32 evaluations of the same logits is ~1e-14 here


def q8_0_round(x: torch.Tensor) -> torch.Tensor:
    """ggml's quantize_row_q8_0_ref: per 32 values along the last dim, d = amax/127 (stored fp16), q = round(x/d)."""
    shape = x.shape
    xb = x.float().reshape(-1, shape[-1] // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.sign(xb * inv) * torch.floor((xb * inv).abs() + 0.5)  # roundf: half away from zero
    return (q * d.half().float()).reshape(shape)


@contextmanager
def llama_cpp_rounding(model, quantized: set[str], kv_fp16: bool = True):
    """Round each Linear's input as llama.cpp's CPU matmul does (Q8_0 for quantized weights, fp16 otherwise)
    and, with kv_fp16, k/v projections' outputs to fp16 (its default KV cache type)."""
    hooks = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        rnd = q8_0_round if name in quantized else (lambda t: t.half().float())
        hooks.append(mod.register_forward_pre_hook(lambda m, args, rnd=rnd: (rnd(args[0]),)))
        if kv_fp16 and name.endswith(("k_proj", "v_proj")):
            hooks.append(mod.register_forward_hook(lambda m, args, out: out.half().float()))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def kl_rows(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    lp, lq = torch.log_softmax(logits_p.double(), -1), torch.log_softmax(logits_q.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def llama_cpp_logits(gguf_path: Path, ids: list[int], threads: int, **settings) -> torch.Tensor:
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    llama_cpp = import_llama_cpp()

    llm = llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=max(512, len(ids) + 8),
        n_batch=512,
        logits_all=True,
        verbose=False,
        n_threads=threads,
        **settings,
    )
    try:
        llm.reset()
        llm.eval(ids)
        return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))
    finally:
        llm.close()


def tokens(artifact: Path, text_spec: str, n: int) -> list[int]:
    from quantkit.data.text import parse_spec, read_text
    from quantkit.models.checkpoint import load_tokenizer

    text = read_text(parse_spec(text_spec)).text
    return load_tokenizer(artifact)(text[: n * 20], add_special_tokens=False)["input_ids"][:n]


def tokenizations_agree(artifact: Path, gguf_path: Path, text: str) -> bool:
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    llama_cpp = import_llama_cpp()

    from quantkit.models.checkpoint import load_tokenizer

    hf = load_tokenizer(artifact)(text, add_special_tokens=False)["input_ids"]
    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    try:
        return (
            llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) == hf
        )  # transformers always parses special tokens
    finally:
        llm.close()


def measure(artifact: Path, gguf_path: Path, ids: list[int], threads: int = 2) -> dict:
    from quantkit.gguf.target import record_path
    from quantkit.models.checkpoint import load_model

    record = json.loads(record_path(gguf_path).read_text())
    # the types whose CPU matmul takes Q8_0 activations (ggml-cpu.c type_traits_cpu: vec_dot_type GGML_TYPE_Q8_0)
    q8_inputs = ("Q4_0", "Q4_1", "Q8_0", "MXFP4", "NVFP4")
    quantized = {t["source"][: -len(".weight")] for t in record["tensors"] if t["type"] in q8_inputs}
    model = load_model(artifact, dtype="float32")
    x = torch.tensor([ids])
    with torch.inference_mode():
        ref = model(x, use_cache=False).logits[0].float()
        with llama_cpp_rounding(model, quantized):
            sim = model(x, use_cache=False).logits[0].float()
        with llama_cpp_rounding(model, quantized, kv_fp16=False):
            sim32 = model(x, use_cache=False).logits[0].float()
    lcpp = llama_cpp_logits(gguf_path, ids, threads)
    lcpp32 = llama_cpp_logits(gguf_path, ids, threads, flash_attn=False, type_k=0, type_v=0)  # 0 = GGML_TYPE_F32
    engines, simulated, residual = kl_rows(ref, lcpp), kl_rows(ref, sim), kl_rows(sim32, lcpp32)
    noisy = residual > FP32_NOISE_KL
    prefix = int(torch.nonzero(noisy)[0]) if bool(noisy.any()) else len(ids)
    summary = lambda k: {"mean": float(k.mean()), "p99": float(k.quantile(0.99)), "max": float(k.max())}  # noqa: E731
    return {
        "tokens": len(ids),
        "engines": summary(engines),
        "simulated": summary(simulated),
        "same_prefix": prefix,
        "same_fraction": float((~noisy).float().mean()),
        "residual": summary(residual),
        "top1_engines": float((ref.argmax(-1) == lcpp.argmax(-1)).float().mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--text", required=True, help="text SPEC (file:PATH, set:NAME)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ids = tokens(a.artifact, a.text, a.tokens)
    r = measure(a.artifact, a.gguf, ids, a.threads)
    r["text"] = a.text
    if a.json:
        print(json.dumps(r, indent=2))
        return
    for k in ("engines", "simulated", "residual"):
        print(f"{k:10s} mean KL {r[k]['mean']:.3e}  p99 {r[k]['p99']:.3e}  max {r[k]['max']:.3e}")
    print(
        f"the first {r['same_prefix']} positions ({r['same_fraction'] * 100:.1f}% of all) agree with the simulation "
        f"to float32 noise (KL < {FP32_NOISE_KL:g})"
    )
    print(f"top-1 agreement transformers vs llama.cpp: {r['top1_engines'] * 100:.2f}% over {r['tokens']} tokens")


if __name__ == "__main__":
    main()
