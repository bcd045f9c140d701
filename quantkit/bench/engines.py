"""Bench engines, by name: each prepares a loaded model and exposes reset/prefill/decode.

- eager: transformers with its dynamic cache, no compilation.
- compiled: transformers with a static KV cache and the decode step under torch.compile
  (CUDA graphs via mode="reduce-overhead" on CUDA). The prefill runs eagerly, as transformers'
  own generate() does with a static cache: it is compute-bound and compiling it per prompt
  length buys little.
- vllm: see vllm_engine.py (GPU; when vLLM is installed).
"""

from __future__ import annotations

from ..errors import QuantkitError


class EagerEngine:
    name = "eager"

    def __init__(self, model, device: str, max_len: int):
        self.model, self.device = model, device
        self.cache = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    def _step(self, ids, positions):
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self.cache, cache_position=positions, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1].argmax(-1, keepdim=True)

    def prefill(self, prompt):
        import torch

        return self._step(prompt, torch.arange(prompt.shape[1], device=prompt.device))

    def decode(self, tok, pos: int):
        import torch

        return self._step(tok, torch.tensor([pos], device=tok.device))


class CompiledEngine(EagerEngine):
    name = "compiled"

    def __init__(self, model, device: str, max_len: int):
        import torch
        from transformers import StaticCache

        super().__init__(model, device, max_len)
        cfg = model.config
        self.cache = StaticCache(config=cfg, max_cache_len=max_len)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        self.cache.early_initialization(1, cfg.num_key_value_heads, head_dim, dtype, torch.device(device))
        mode = "reduce-overhead" if device == "cuda" else None
        self._decode = torch.compile(self._decode_step, fullgraph=True, dynamic=False, mode=mode)

    def reset(self) -> None:
        self.cache.reset()

    def _decode_step(self, tok, positions):
        out = self.model(input_ids=tok, past_key_values=self.cache, cache_position=positions, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def decode(self, tok, pos: int):
        import torch

        with torch.inference_mode():
            nxt = self._decode(tok, torch.tensor([pos], device=tok.device))
            return nxt.clone() if self.device == "cuda" else nxt


ENGINES = {"eager": EagerEngine, "compiled": CompiledEngine}


def get_engine(name: str):
    if name == "vllm":
        from .vllm_engine import VllmEngine

        return VllmEngine
    if name not in ENGINES:
        raise QuantkitError(f"unknown engine {name!r}; valid: {', '.join([*ENGINES, 'vllm'])}")
    return ENGINES[name]
