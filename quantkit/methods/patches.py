"""Narrow workarounds for library faults on CPU-only machines; each names the upstream fault."""

from __future__ import annotations

import functools


def llmcompressor_cpu_pin_memory() -> None:
    """llm-compressor 0.14: AWQ crashes on a CPU-only machine.

    Upstream fault: AWQModifier._apply_smoothing (llmcompressor/modifiers/transform/awq/base.py)
    calls IntermediatesCache.pin_memory -> _pin_intermediate (llmcompressor/pipelines/cache.py),
    which calls Tensor.pin_memory(); without an accelerator torch raises "Cannot access
    accelerator device when none is available". Pinning only speeds up host-to-device copies,
    so without an accelerator skipping it changes nothing else. Idempotent.
    """
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory
    if getattr(original, "_quantkit_cpu_patch", False):
        return

    @functools.wraps(original)
    def pin_memory(self, *args, **kwargs):
        if not torch.accelerator.is_available():
            return None
        return original(self, *args, **kwargs)

    pin_memory._quantkit_cpu_patch = True
    IntermediatesCache.pin_memory = pin_memory


def quiet_llmcompressor() -> None:
    """llm-compressor's import replaces every loguru sink with a stdout one at INFO; keep stdout
    for --json. (Setting LLM_COMPRESSOR_LOG_DISABLED would crash GPTQ: its METRIC level would
    never be registered.)"""
    import os

    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    os.environ.setdefault("COMPRESSED_TENSORS_LOG_DISABLED", "true")
    from llmcompressor.logger import LoggerConfig, configure_logger

    configure_logger(LoggerConfig(console_log_level=None))
