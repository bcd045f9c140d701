"""The eager engine: transformers' forward with its dynamic cache, no compilation."""

from __future__ import annotations

from quantkit.bench import accounting
from quantkit.bench.engines._torch import TorchEngine


class Engine(TorchEngine):
    name = "eager"
    compiles = False

    def reset(self, capacity: int) -> None:
        from transformers import DynamicCache

        self.cache, self.capacity = DynamicCache(config=self.model.config), capacity

    def rewind(self, depth: int) -> None:
        extra = self.cache_depth() - depth
        if extra > 0:
            self.cache.crop(-extra)  # a negative count: remove that many tokens from the end

    def step_bytes(self, cached: int, capacity: int) -> float:
        # DynamicLayer.update concatenates (accounting.kv_concat): the copy grows with the context
        return self.weight_bytes()["weight_bytes_per_token"] + accounting.kv_concat(self.kv_bytes_per_token(), cached)
