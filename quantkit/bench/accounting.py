"""Bytes a decode step reads, counted from the tensors the benchmarked model actually holds.

Every weight once in its runtime format (packed integers, scales and zeros included), the input
embedding one row, the lm_head as a full matrix (a tied lm_head is the embedding table, read in
full), norms; plus the KV cache at the current context (GQA-aware, from the config).
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
    tied = head is not None and getattr(head, "weight", None) is not None and head.weight.data_ptr() == emb.weight.data_ptr()
    total = 0
    for module, t in _tensors(model):
        if module.__class__.__name__.endswith("RotaryEmbedding"):
            continue  # computed buffers (inv_freq), not weights
        total += t.numel() * t.element_size()
    emb_bytes = emb.weight.numel() * emb.weight.element_size()
    row = emb_bytes // emb.weight.shape[0]
    per_token = total + row if tied else total - emb_bytes + row
    return {"weight_bytes_per_token": int(per_token), "stored_weight_bytes": int(total), "tied_lm_head": bool(tied)}


def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * kv * head_dim * dtype_bytes


def mean_step_bytes(weight_bytes: int, kv_per_token: int, prompt_len: int, gen_len: int) -> float:
    """Average bytes of the timed decode steps (contexts prompt_len+1 .. prompt_len+gen_len-1), new KV written included."""
    if gen_len < 2:
        return float(weight_bytes + kv_per_token * (prompt_len + 1))
    contexts = range(prompt_len + 1, prompt_len + gen_len)
    return weight_bytes + kv_per_token * (sum(contexts) / len(contexts) + 1)
