"""Synthetic checkpoints: random weights in a real architecture's shapes (as vLLM's dummy load
format does), so an 8B-shaped model can be timed without its weights. Linear layers can be
quantized with random-integer RTN-style weights for speed-only work; the numbers they compute
are meaningless, the bytes they read are not."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.bench import kernels
from quantkit.bench.loader import BenchModel


@dataclass(frozen=True)
class Synthetic:
    shape: str  # a named shape or config.json path
    bits: int = 16
    group_size: int = 128

    @property
    def label(self) -> str:
        return f"synthetic:{self.shape}:{'dense' if self.bits == 16 else f'int{self.bits}'}"


def load_synthetic(spec: Synthetic, cfg: dict, device, seed: int, dtype: torch.dtype) -> BenchModel:
    """Parameters start on meta and are each replaced by a tensor made on `device` in `dtype` (the
    engine's precision; the 16-bit spec's weights then hold that dtype's bytes); computed buffers
    are built there directly."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    device = torch.device(device)
    model_type = cfg.get("model_type", "llama")
    config = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device(device), init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    bm = BenchModel(model, "synthetic", notes=[f"random weights ({spec.label}); speed only"])
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and spec.bits in (4, 8) and not name.endswith("lm_head"):
            n, k = module.out_features, module.in_features
            lo, hi = (-8, 8) if spec.bits == 4 else (-128, 128)
            q = torch.randint(lo, hi, (n, k), dtype=torch.int8, device=device, generator=gen)
            if spec.bits == 4:
                scale = torch.full((n, k // spec.group_size), 0.002, device=device)
                new = kernels.Int4WeightOnlyLinear(q, scale, None, spec.group_size, None, device, dtype)
            else:
                scale = torch.full((n, 1), 2e-4, device=device)
                new = kernels.Int8WeightOnlyLinear(q, scale, None, None, device, dtype)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, new)
            bm.kernels[new.kernel] = bm.kernels.get(new.kernel, 0) + 1
    for name, p in list(model.named_parameters()):
        if p.device.type == "meta":
            data = torch.empty(p.shape, dtype=dtype, device=device)
            data.normal_(0.0, 0.02, generator=gen) if p.dim() > 1 else data.fill_(1.0)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, torch.nn.Parameter(data, requires_grad=False))
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return bm
