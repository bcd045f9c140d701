"""The llama.cpp scorer: a GGUF's PPL, KL and top-1 through llama.cpp (llama-cpp-python), against
the original model's cached top-k baseline pass.

What llama.cpp users get from `llama-perplexity --kl-divergence-base` + `--kl-divergence`, without
its base-logits file (vocab x tokens float32: GBs for a few thousand tokens): quantkit's cache
keeps the baseline's top-256 per position (evals/perplexity.py). The windows are tokenized by the
baseline's tokenizer and fed to llama.cpp as ids, so both models see exactly the same tokens;
llama.cpp scores each window from an empty cache with every position's logits kept, as
llama-perplexity does (bench/engines/llamacpp_engine.py `window_logprobs`). A checkpoint directory is
exported exactly to GGUF first (bench/gguf_file.py). `--kv-cache q8_0` scores with llama.cpp's
own quantized cache (llama-cpp-python's type_k/type_v), flash attention on where the V cache is
quantized, as llama.cpp runs it: every position's K and V are written to the cache in that type
and read back by the attention of every later position in the window.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.bench.engines.engine import EngineSettings
from quantkit.bench.engines.llamacpp_engine import Engine
from quantkit.core.kv_cache import parse_llama_cache
from quantkit.evals.scorers.scorer import Scorer, ScorerSettings
from quantkit.gguf.read import open_reader

# bench's llamacpp engine (and torch with it) is imported when a model is checked or opened, so
# reading this scorer's capabilities imports no library

DESCRIBED = (
    "engine",
    "kernel",
    "cpu_variant",
    "dtype",
    "threads",
    "gguf",
    "gguf_export",
    "n_ctx",
    "n_batch",
    "kv_cache_type",
    "flash_attn",
)


class LlamaCppScorer(Scorer):
    name = "llamacpp"
    takes_checkpoint = True
    takes_gguf = True
    exports_on_the_fly = True
    exact_kl = True
    devices = ("cpu", "cuda")  # cuda: a llama.cpp built with GPU offload (check)
    kv_caches = "any"  # llama.cpp's cache types (core/kv_cache.py LLAMACPP_TYPES)
    flash_attn_lever = True

    def __init__(self, engine):
        self.engine = engine

    @classmethod
    def check(cls, source: Path, device) -> None:
        """llama-cpp-python importable (and GPU-capable if asked); a GGUF file whole (magic, header,
        every tensor inside the file)."""

        Engine.check(device)
        if not source.is_dir():
            open_reader(source)  # ModelError (exit 2): no such file / not a GGUF / truncated

    @classmethod
    def auto_device(cls, device):
        return Engine.auto_device(device)  # a CPU-only build: the CPU, even beside a GPU

    @classmethod
    def open(cls, source: Path, settings: ScorerSettings) -> "LlamaCppScorer":
        """The llamacpp bench engine over the GGUF (or the artifact's exact export), its context one window."""

        cache = parse_llama_cache(settings.kv_cache) if settings.kv_cache else None
        es = EngineSettings(
            device=settings.device, max_tokens=settings.seq_len, kv_cache=cache, flash_attn=settings.flash_attn
        )
        return cls(Engine.load(source, es))

    def logps(self, windows: list):
        for ids in windows:
            yield self.engine.window_logprobs([int(t) for t in ids])[:-1]

    def describe(self) -> dict:
        d = self.engine.describe()
        return {k: json.loads(json.dumps(d.get(k), default=str)) for k in DESCRIBED if k in d}

    def close(self) -> None:
        self.engine.close()
