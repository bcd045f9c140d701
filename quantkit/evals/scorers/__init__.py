"""Eval scorers by `--engine` name: one module each, one `Scorer` subclass per module (interface:
scorer.py).

- transformers: the checkpoint as transformers loads it, on the CPU or a GPU; it also makes every
  baseline pass.
- llamacpp: llama.cpp through llama-cpp-python, on a GGUF file (a checkpoint is exported exactly
  to GGUF first).
- vllm: vLLM, in its own environment and process (`quantkit engines install vllm`), on the CPU or
  a GPU; the whole vocabulary's prompt log-probabilities, reduced to the statistics in its worker.

The modules import their libraries (torch, llama_cpp) only when a model is opened, so listing the
scorers and reading their capabilities costs nothing.
"""

from __future__ import annotations

from quantkit.errors import DataError
from quantkit.evals.scorers.llamacpp_scorer import LlamaCppScorer
from quantkit.evals.scorers.scorer import Scorer
from quantkit.evals.scorers.transformers_scorer import TransformersScorer
from quantkit.evals.scorers.vllm_scorer import VllmScorer

SCORERS: dict[str, type[Scorer]] = {
    "transformers": TransformersScorer,
    "llamacpp": LlamaCppScorer,
    "vllm": VllmScorer,
}

# What makes every baseline pass, whichever scorer scores the model under test: one cached pass
# serves them all (its cache key names no scorer).
BASELINE: type[Scorer] = TransformersScorer


def scorer_named(name: str, option: str = "--engine") -> type[Scorer]:
    """The scorer registered as `name`; an unknown name is one line listing the valid ones."""
    if name not in SCORERS:
        raise DataError(f"{option} {name}: unknown eval engine; valid: {', '.join(SCORERS)}")
    return SCORERS[name]
