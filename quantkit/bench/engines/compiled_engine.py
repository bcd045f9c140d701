"""The compiled engine: transformers with a static KV cache and the decode step under torch.compile
(CUDA graphs via mode="reduce-overhead" on CUDA), as gpt-fast and transformers' own static-cache
generate() do. The prefill runs eagerly: it is compute-bound, and compiling it per prompt length
buys little.

The cache is sized per measurement (`reset(capacity)`: prompt + generated tokens of the timed
run), because every decode step reads all of it: transformers' StaticLayer hands attention the
whole preallocated buffer and masks the empty slots (accounting.kv_static). A cache sized to a
2k-token sweep would add ~245 MB per step at Llama-3-8B that the measurement never asked for.
"""

from __future__ import annotations

import torch

from quantkit.bench import accounting
from quantkit.bench.engines._torch import TorchEngine
from quantkit.errors import QuantkitError


class Engine(TorchEngine):
    name = "compiled"
    compiles = True

    def __init__(self, bm, settings):
        super().__init__(bm, settings)
        mode = "reduce-overhead" if self.device.type == "cuda" else None  # CUDA graphs
        self._step = torch.compile(self._decode_step, fullgraph=True, dynamic=False, mode=mode)

    def reset(self, capacity: int) -> None:
        from transformers import StaticCache

        if self.cache is not None and capacity == self.capacity:
            self.cache.reset()
            return
        # a new size means new buffers; decode recompiles for them on its next call, so the graphs
        # of the old size go (each depth of --depth is a size: past torch._dynamo.config.recompile_limit
        # sizes, decode would silently run uncompiled)
        if self.cache is not None:
            torch._dynamo.reset()
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        self.cache.early_initialization(1, self.kv_heads, self.head_dim, self.dtype, self.device)
        self.capacity = capacity

    def _decode_step(self, tok, positions):
        out = self.model(input_ids=tok, past_key_values=self.cache, cache_position=positions, use_cache=True)
        logits = out.logits[:, -1]
        return logits, logits.argmax(-1, keepdim=True)

    def _run(self, tok, pos: int):
        with torch.inference_mode():
            logits, nxt = self._step(tok, torch.tensor([pos], device=self.device))
        if self.device.type == "cuda":  # CUDA-graph outputs are overwritten by the next replay
            return logits.clone(), nxt.clone()
        return logits, nxt

    def decode(self, token, pos: int):
        return self._run(token, pos)[1]

    def rewind(self, depth: int) -> None:
        """StaticLayer writes each new token at its own count of cached tokens and attention masks
        the slots past the query's position: setting the count back is the whole rewind (the
        stale slots are overwritten before any step reads them unmasked)."""
        for layer in self.cache.layers:
            if getattr(layer, "cumulative_length_int", 0) > layer.max_cache_len:  # a sliding window that rolled
                raise QuantkitError(
                    f"compiled: a sliding-window layer of {layer.max_cache_len} tokens cannot be rewound "
                    f"to depth {depth} (it has rolled over); use --engine eager"
                )
            layer.cumulative_length.fill_(depth)
            if hasattr(layer, "cumulative_length_int"):
                layer.cumulative_length_int = depth

    def decode_logits(self, token, pos: int):
        return self._run(token, pos)[0]

    def slots(self, capacity: int) -> float:
        """Mean slots per layer a step attends over: the capacity, or the window of a sliding layer."""
        cfg = self.cfg
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
        window = getattr(cfg, "sliding_window", None)
        per_layer = [min(capacity, window) if window and t == "sliding_attention" else capacity for t in types]
        return sum(per_layer) / len(per_layer)

    def close(self) -> None:
        super().close()
        # Dynamo keys its cache on the code object of _decode_step, shared by every engine of this
        # class: without a reset each model benchmarked in this process adds recompilations, and
        # past torch._dynamo.config.recompile_limit (8) decode would silently run uncompiled.
        torch._dynamo.reset()

    def step_bytes(self, cached: int, capacity: int) -> float:
        return self.weight_bytes()["weight_bytes_per_token"] + accounting.kv_static(
            self.kv_bytes_per_token(), self.slots(capacity)
        )
