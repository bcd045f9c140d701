"""The bench engines, by name: the one list of them. `quantkit bench --engine` and a recipe's
`bench: {engines: [...]}` take these names and no others; adding an engine is its module under
bench/engines/ and one entry here.

An entry is data: the module that holds the engine's `Engine` class (bench/engines/engine.py),
imported only when the engine is asked for (bench/engines/__init__.py `engine_class`), so an
optional engine's library is needed only by those who use it, and what the engine runs in a few
words. What an engine can do (compiles, takes_gguf, devices, levers...) is its class's attributes.
The list lives below the recipe, which checks a recipe's engine names against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineEntry:
    """One bench engine: where its `Engine` class is, and what it runs."""

    module: str  # the importable module holding the engine's `Engine` class
    summary: str  # what it runs, in a few words (quantkit bench --help, the docs)


ENGINES: dict[str, EngineEntry] = {
    "eager": EngineEntry("quantkit.bench.engines.eager_engine", "transformers with its dynamic cache, no compilation"),
    "compiled": EngineEntry(
        "quantkit.bench.engines.compiled_engine",
        "transformers with a static KV cache and the decode step under torch.compile (CUDA graphs on CUDA)",
    ),
    "vllm": EngineEntry(
        "quantkit.bench.engines.vllm_engine",
        "vLLM's own scheduler and kernels, stepped one token at a time (GPU; when installed)",
    ),
    "llamacpp": EngineEntry(
        "quantkit.bench.engines.llamacpp_engine",
        "llama.cpp through llama-cpp-python on GGUF files, a checkpoint exported to GGUF first (when installed)",
    ),
}
