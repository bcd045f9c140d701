"""Bytes a decode step moves, counted from what the benchmarked model really holds and reads.

Weights: every tensor once in its runtime format (packed integers, scales and zeros included),
the input embedding one row, the lm_head as a full matrix (a tied lm_head is the embedding
table, read in full), norms.

KV cache: what each engine's cache really touches per step, in units of `kv` = bytes one token
occupies (`roofline.kv_bytes`, GQA-aware). `cached` is the number of tokens already in the cache
when the step starts (the prompt, then one more per step):
- live (the ideal, vLLM's paged cache): attend over cached + 1 tokens, write 1.
- static (transformers' StaticCache, the compiled engine): `StaticLayer.update` returns the whole
  preallocated buffer and attention runs over every slot under a mask, so each step reads the
  cache's full capacity whatever the context, and `index_copy_` writes 1.
- concat (transformers' DynamicCache, the eager engine): `DynamicLayer.update` is
  `torch.cat([keys, new])`, which reads the cached + 1 tokens and writes a new cached + 1 copy,
  then attention reads that copy: 3 (cached + 1).
- padded (llama.cpp's cache, kv_llamacpp): attention reads the first n_kv cells, the used ones
  padded up to a multiple of 256 (at least 256, at most the cache's size), and writes 1.
(transformers 5.17, cache_utils.py; llama.cpp as vendored by llama-cpp-python 0.3.36,
llama-kv-cache.cpp get_n_kv.) Attention runs at the KV heads' width in every torch engine (see
engines/_torch.py, `gqa_attention`), so GQA's saving is real in what is read.
"""

from __future__ import annotations

import torch


def _tensors(model):
    seen: set[int] = set()
    for module in model.modules():
        for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            if t is None or t.device.type == "meta":
                continue
            key = t.untyped_storage().data_ptr() if t.numel() else id(t)
            if key in seen:
                continue
            seen.add(key)
            yield module, t
        qs = getattr(getattr(module, "weight", None), "quant_state", None)  # bitsandbytes 4-bit scales
        if qs is not None:
            for extra in (getattr(qs, "absmax", None), getattr(getattr(qs, "state2", None), "absmax", None)):
                if isinstance(extra, torch.Tensor) and id(extra) not in seen:
                    seen.add(id(extra))
                    yield module, extra


def weight_read_bytes(model) -> dict:
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = (
        head is not None
        and getattr(head, "weight", None) is not None
        and head.weight.data_ptr() == emb.weight.data_ptr()
    )
    total = 0
    for module, t in _tensors(model):
        if module.__class__.__name__.endswith("RotaryEmbedding"):
            continue  # computed buffers (inv_freq), not weights
        total += t.numel() * t.element_size()
    emb_bytes = emb.weight.numel() * emb.weight.element_size()
    row = emb_bytes // emb.weight.shape[0]
    per_token = total + row if tied else total - emb_bytes + row
    return {"weight_bytes_per_token": int(per_token), "stored_weight_bytes": int(total), "tied_lm_head": bool(tied)}


def kv_live(kv: float, cached: int) -> float:
    """Attend over the cached tokens and the new one, write the new one."""
    return kv * (cached + 2)


def kv_static(kv: float, capacity: int) -> float:
    """Attend over every slot of a preallocated cache of `capacity` tokens, write one."""
    return kv * (capacity + 1)


def kv_concat(kv: float, cached: int) -> float:
    """torch.cat of the cache and the new token (read cached + 1, write cached + 1), then attend."""
    return kv * 3 * (cached + 1)


LLAMACPP_KV_PAD = 256  # llama.cpp pads n_kv to this for graph reuse (llama-kv-cache.cpp get_n_kv, PR #16812)


def llamacpp_cells(cached: int, kv_size: int, pad: int = LLAMACPP_KV_PAD) -> int:
    """Cells llama.cpp's attention reads in a decode step that starts with `cached` tokens: the new
    token's cell is filled first, then n_kv = min(kv_size, max(pad, used rounded up to pad)).
    (kv_size itself is n_ctx rounded up to 256 by llama_context.) Checked against the kq tensor's
    shape in llama.cpp's own graph by tests/test_bench_llamacpp.py."""
    used = cached + 1
    return min(kv_size, max(pad, -(-used // pad) * pad))


def kv_llamacpp(kv: float, cached: int, kv_size: int) -> float:
    """Read K and V of every cell attention spans (empty ones masked, but read), write the new token."""
    return kv * (llamacpp_cells(cached, kv_size) + 1)


def timed_contexts(prompt_len: int, gen_len: int) -> range:
    """Tokens in the cache at the start of each timed decode step: the prefill leaves prompt_len,
    and gen_len - 1 steps follow (the first token comes from the prefill)."""
    return range(prompt_len, prompt_len + gen_len - 1)


def mean_step_bytes(step_bytes, prompt_len: int, gen_len: int) -> float:
    """Average of `step_bytes(cached)` over the timed decode steps."""
    contexts = timed_contexts(prompt_len, gen_len)
    return sum(step_bytes(c) for c in contexts) / len(contexts)
