"""The quantization methods, by the recipe's `quantize.method` name: one entry each, carrying
everything the rest of quantkit asks about a method.

The recipe schema validates a step's `quantize:` with the entry's config class; convert runs its
handler and saves in its container; preflight, torchrun, offloading and `--plan` read its
capabilities. Nothing outside this module compares method names: adding a method is a config
class (methods/configs.py), a handler module, and one entry in METHODS.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from quantkit.methods import autoround, bnb, llmc, rotation
from quantkit.methods.configs import (
    AutoRoundConfig,
    AWQConfig,
    BnbInt8Config,
    BnbNF4Config,
    FP4Config,
    FP8Config,
    GPTQConfig,
    MethodConfig,
    RTNConfig,
    W8A8Config,
)


@dataclass(frozen=True)
class Method:
    name: str
    config: type[MethodConfig]  # the recipe's `quantize:` section for this method
    # (model, cfg, samples: list[Tensor] | None, src=, device=, transform=) -> the model, quantized in memory
    quantize: Callable
    container: str  # key of artifacts.containers.CONTAINERS: how the quantized model is saved and reloaded
    calibrates: bool  # needs calibration windows (calibration.source or --calib)
    # Quantizes as transformers loads the checkpoint (bitsandbytes): the handler reloads the
    # source, the reload check loads onto the device, and the artifact keeps its own dtypes.
    loads_quantized: bool = False
    # llm-compressor's sequential pipeline: the model stays in RAM (or on disk, --max-memory) and
    # one decoder layer at a time goes to the calibration device.
    layerwise: bool = False
    rotates: bool = False  # composes with a transform step (the rotation runs in the same pass)
    # The config's group sizes and overrides are checked against the model's linears before
    # loading (group sizes divide the columns, overrides match, vLLM's fused shards agree).
    checks_layers: bool = False
    # Under torchrun the artifact equals one process's (tests/test_distributed.py). Measured on
    # the tiny fixture with gloo on CPUs (llm-compressor 0.14): awq fails (AttributeError:
    # 'NoneType' object has no attribute 'type'); w8a8 finishes, but its smoothed norms and INT8
    # codes differ from one process's (each rank appears to smooth the weights they share). Not
    # tried on GPUs.
    torchrun: bool = False
    # The plan's cost model (costs/formulas.py): forwards over the calibration tokens per decoder layer
    # (0: costed as one elementwise pass over the weights), and whether each layer accumulates
    # GPTQ's Hessians and solves them (their memory and FLOPs).
    passes: int = 0
    hessians: bool = False
    check: Callable | None = None  # (cfg, recipe, key) -> None: the method's own checks before loading
    runtime: Callable | None = None  # () -> dict: what else its result depends on, for quantkit.json's runtime


def _llmc(modifiers: Callable, **kw) -> Callable:
    return partial(llmc.quantize, modifiers=modifiers, **kw)


# llm-compressor's methods calibrate layer by layer and save compressed-tensors.
_LLMC = dict(container="compressed-tensors", layerwise=True, rotates=True, checks_layers=True)

METHODS: dict[str, Method] = {
    "rtn": Method("rtn", RTNConfig, _llmc(llmc.rtn), calibrates=False, torchrun=True, **_LLMC),
    # GPTQ: per layer, a forward to collect the Hessians and one to propagate the quantized output
    "gptq": Method(
        "gptq", GPTQConfig, _llmc(llmc.gptq), calibrates=True, torchrun=True, passes=2, hessians=True, **_LLMC
    ),
    # AWQ and SmoothQuant add a smoothing pass before the rounding's two
    "awq": Method("awq", AWQConfig, _llmc(llmc.awq), calibrates=True, passes=3, hessians=True, **_LLMC),
    "autoround": Method(
        "autoround",
        AutoRoundConfig,
        _llmc(autoround.modifiers, tuning=autoround.tuning_samples),
        calibrates=True,
        check=autoround.check_samples,
        runtime=autoround.runtime,
        **_LLMC,
    ),
    "w8a8": Method("w8a8", W8A8Config, _llmc(llmc.w8a8), calibrates=True, passes=3, hessians=True, **_LLMC),
    # FP8 rounds each weight once from its channel's scale, like rtn; not tried with a rotation or under torchrun
    "fp8": Method("fp8", FP8Config, _llmc(llmc.fp8), calibrates=False, **{**_LLMC, "rotates": False}),
    # FP4 (NVFP4, MXFP4) rounds each weight once from its block's scale, like fp8; not tried with a rotation or
    # under torchrun
    "fp4": Method("fp4", FP4Config, _llmc(llmc.fp4), calibrates=False, **{**_LLMC, "rotates": False}),
    "bnb-nf4": Method(
        "bnb-nf4",
        BnbNF4Config,
        partial(bnb.quantize, config=bnb.nf4_config),
        container="bitsandbytes",
        calibrates=False,
        loads_quantized=True,
    ),
    "bnb-int8": Method(
        "bnb-int8",
        BnbInt8Config,
        partial(bnb.quantize, config=bnb.int8_config),
        container="bitsandbytes",
        calibrates=False,
        loads_quantized=True,
    ),
}


def method_of(cfg: MethodConfig) -> Method:
    """The registry entry of a validated `quantize:` config."""
    return METHODS[cfg.method]


def names(capability: str | None = None) -> list[str]:
    """Method names, in registry order; with `capability`, those whose entry has it set."""
    return [n for n, m in METHODS.items() if capability is None or getattr(m, capability)]


def spoken(items: list[str]) -> str:
    """`a, b or c`, for messages that list methods."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def quantize_step(variant) -> MethodConfig | None:
    """The variant's quantize step's config, or None."""
    return next((s.quantize for s in variant.steps if s.quantize is not None), None)


def transform_step(variant):
    """The variant's rotation (a transform step's config), or None."""
    return next((s.transform for s in variant.steps if s.transform is not None), None)


def preflight(recipe, variant, key: str, cfg: dict) -> None:
    """Method checks that need the model's config or the recipe's other sections, before loading."""

    for i, step in enumerate(variant.steps):
        if step.transform is not None:
            rotation.check(cfg, step.transform, f"{key}[{i}].transform")
        if step.quantize is not None and method_of(step.quantize).check is not None:
            method_of(step.quantize).check(step.quantize, recipe, f"{key}[{i}].quantize")


def runtime_meta(quant: MethodConfig | None = None) -> dict:
    """What else a conversion's result depends on, for quantkit.json: the CPU thread count (reduction
    order) and the seeds. Choices must not depend on the threads (methods/patches.py,
    tests/test_methods_determinism.py)."""

    out = {"torch_num_threads": torch.get_num_threads(), "seed": llmc.SEED}
    if quant is not None and method_of(quant).runtime is not None:
        out.update(method_of(quant).runtime())
    return out
