"""Bench engines by name: one module each, one `Engine` class per module (interface: engine.py).

- eager: transformers with its dynamic cache, no compilation.
- compiled: transformers with a static KV cache and the decode step under torch.compile (CUDA
  graphs via mode="reduce-overhead" on CUDA).
- vllm: vLLM's own scheduler and kernels, stepped one token at a time (GPU; when installed).
- llamacpp: llama.cpp through llama-cpp-python, on GGUF files (a checkpoint is exported to GGUF
  first); CPU, or a GPU when llama.cpp was built with one (when installed).

Modules are imported when their engine is asked for, so an optional engine's library is only
needed by those who use it. What an engine can do is a class attribute of its `Engine`
(engine.py: compiles, takes_gguf, devices, tensor_parallel, sizes_own_memory...): callers ask
`engine_class(name).takes_gguf`, never compare names.
"""

from __future__ import annotations

import importlib

from quantkit.errors import QuantkitError

ENGINES: dict[str, str] = {
    "eager": "quantkit.bench.engines.eager_engine",
    "compiled": "quantkit.bench.engines.compiled_engine",
    "vllm": "quantkit.bench.engines.vllm_engine",
    "llamacpp": "quantkit.bench.engines.llamacpp_engine",
}


def check_engine(name: str) -> None:
    if name not in ENGINES:
        raise QuantkitError(f"unknown engine {name!r}; valid: {', '.join(ENGINES)}")


def engine_class(name: str):
    """The Engine class registered as `name` (its module imported now)."""
    check_engine(name)
    return importlib.import_module(ENGINES[name]).Engine
