"""The quantization-method registry: recipe `quantize.method` -> handler.

A handler turns a loaded FP16/BF16 model (plus calibration token windows, when the method
needs them) into a quantized model in memory and names the export format that saves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from quantkit.errors import NotImplementedYet

SEED = 0  # torch's seed for every calibration pass (llm-compressor's methods, AutoRound's included)


@dataclass(frozen=True)
class MethodHandler:
    quantize: Callable  # (model, cfg, calib: list[Tensor] | None, src=, device=, transform=) -> model, quantized in memory
    export_format: str  # key into export.FORMATS
    loads_quantized: bool = False  # True: quantization happens at load time (bitsandbytes)


def _handlers() -> dict[str, MethodHandler]:
    from quantkit.methods import bnb, llmc

    return {
        "rtn": MethodHandler(llmc.quantize, "compressed-tensors"),
        "gptq": MethodHandler(llmc.quantize, "compressed-tensors"),
        "awq": MethodHandler(llmc.quantize, "compressed-tensors"),
        "autoround": MethodHandler(llmc.quantize, "compressed-tensors"),
        "w8a8": MethodHandler(llmc.quantize, "compressed-tensors"),
        "bnb-nf4": MethodHandler(bnb.quantize, "bitsandbytes", loads_quantized=True),
        "bnb-int8": MethodHandler(bnb.quantize, "bitsandbytes", loads_quantized=True),
    }


# Steps whose implementation has not landed: validation says so instead of a silent no-op.
PENDING_STEPS: dict[str, str] = {}
PENDING_METHODS: dict[str, str] = {}


def get_handler(method: str) -> MethodHandler:
    handlers = _handlers()
    if method not in handlers:
        raise NotImplementedYet(f"quantize method {method!r} is not implemented; valid: {', '.join(handlers)}")
    return handlers[method]


def check_implemented(recipe, source: str) -> None:
    """Fail validation, naming the key path, for any step that has not landed yet."""
    groups = [("steps", recipe.steps)] + [(f"variants[{i}].steps", v.steps) for i, v in enumerate(recipe.variants)]
    for prefix, steps in groups:
        for j, step in enumerate(steps):
            if step.kind in PENDING_STEPS:
                raise NotImplementedYet(f"{source}: {prefix}[{j}].{step.kind}: {PENDING_STEPS[step.kind]} is not implemented yet")
            if step.quantize is not None and step.quantize.method in PENDING_METHODS:
                raise NotImplementedYet(
                    f"{source}: {prefix}[{j}].quantize.method: {step.quantize.method} is not implemented yet"
                )


def transform_step(variant):
    """The variant's rotation (a transform step's config), or None."""
    return next((s.transform for s in variant.steps if s.transform is not None), None)


def preflight(recipe, variant, key: str, cfg: dict) -> None:
    """Method checks that need the model's config or the recipe's other sections, before loading."""
    from quantkit.methods import autoround, rotation

    for i, step in enumerate(variant.steps):
        if step.transform is not None:
            rotation.check(cfg, step.transform, f"{key}[{i}].transform")
        if step.quantize is not None and step.quantize.method == "autoround":
            autoround.check_installed(f"{key}[{i}].quantize")
            autoround.check_samples(step.quantize, recipe.calibration.samples, f"{key}[{i}].quantize")


def runtime_meta(quant=None) -> dict:
    """What else a conversion's result depends on, for quantkit.json: the CPU thread count (reduction
    order) and the seeds. Choices must not depend on the threads (methods/patches.py); figures are
    compared within their bootstrap CI at 1 and 2 threads (docs/PERFORMANCE.md)."""
    import torch

    out = {"torch_num_threads": torch.get_num_threads(), "seed": SEED}
    if quant is not None and quant.method == "autoround":
        from quantkit.methods.autoround import AUTOROUND_SEED

        out["autoround_seed"] = AUTOROUND_SEED
    return out
