"""The bench engines, by name: the one list of them. `quantkit bench --engine` and a recipe's
`bench: {engines: [...]}` take these names and no others; adding an engine is its module under
bench/engines/ and one entry here.

An entry is data: the module that holds the engine's `Engine` class (bench/engines/engine.py),
imported only when the engine is asked for (bench/engines/__init__.py `engine_class`), so an
optional engine's library is needed only by those who use it. What an engine can do (compiles,
takes_gguf, devices, levers...) is its class's attributes. The list lives below the recipe, which
checks a recipe's engine names against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineEntry:
    """One bench engine: the importable module holding its `Engine` class."""

    module: str


ENGINES: dict[str, EngineEntry] = {
    # transformers with its dynamic cache, no compilation
    "eager": EngineEntry("quantkit.bench.engines.eager_engine"),
    # transformers with a static KV cache and the decode step under torch.compile (CUDA graphs on CUDA)
    "compiled": EngineEntry("quantkit.bench.engines.compiled_engine"),
    # vLLM's own scheduler and kernels, stepped one token at a time (GPU; when installed)
    "vllm": EngineEntry("quantkit.bench.engines.vllm_engine"),
    # llama.cpp through llama-cpp-python on GGUF files, a checkpoint exported to GGUF first (when installed)
    "llamacpp": EngineEntry("quantkit.bench.engines.llamacpp_engine"),
}
