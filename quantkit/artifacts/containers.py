"""Artifact containers, by name: how convert saves an in-memory model as its artifact, how a user
reloads it, and how quantkit.json describes it. (Turning a saved artifact into another serving
format is an exporter: quantkit/export/.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from quantkit.device import resolve_device
from quantkit.methods.bnb_cpu_fix import restore_canonical_state
from quantkit.models import fp4_load_fix


def _load_auto(path: Path, dtype: str = "bfloat16", device=None, trust_remote_code: bool = False):
    """As a user loads it: onto `device` (a torch.device; None: the GPU if there is one); a custom
    architecture with the model code save_pretrained copied into the artifact (--trust-remote-code)."""
    from transformers import AutoModelForCausalLM

    fp4_load_fix.install()  # FP4 weights decompress at the model's dtype (compressed-tensors 0.19 fault)
    device = resolve_device(device)
    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), device_map=device, trust_remote_code=trust_remote_code
    ).eval()


def _describe(fmt: str):
    def describe(cfg) -> dict:
        """quantkit.json's `quantization`: the method's config (methods/configs.py) as stored."""
        d = {"format": fmt, "method": cfg.method, "scheme": cfg.scheme, "weight_bits": cfg.weight_bits}
        for key in (
            "group_size",
            "symmetric",
            "observer",
            "actorder",
            "dampening",
            "rounding",
            "smoothing_strength",
            "double_quant",
            "threshold",
            "weight_type",
            "scale_type",
            "activations",
        ):
            if hasattr(cfg, key):
                d[key] = getattr(cfg, key)
        d["ignore"] = list(cfg.ignore)
        if getattr(cfg, "overrides", None):
            d["overrides"] = [o.model_dump(mode="json") for o in cfg.overrides]
        return d

    return describe


def _save_compressed(model, out: Path, shard: str) -> None:
    model.save_pretrained(str(out), save_compressed=True, max_shard_size=shard)


def _save_bnb(model, out: Path, shard: str) -> None:
    restore_canonical_state(model)  # bitsandbytes 0.50 CPU repack fault: see methods/bnb_cpu_fix.py
    model.save_pretrained(str(out), max_shard_size=shard)


def _save_dense(model, out: Path, shard: str) -> None:
    model.save_pretrained(str(out), max_shard_size=shard)


@dataclass(frozen=True)
class Container:
    save: Callable  # (model, out_dir, max_shard_size) -> None
    load: Callable  # (dir, dtype, device, trust_remote_code=False) -> model, loaded exactly as a user would
    loader: str  # what the user's loader is, for messages
    describe: Callable  # (a method's config) -> quantkit.json's `quantization`


CONTAINERS: dict[str, Container] = {
    "compressed-tensors": Container(
        _save_compressed, _load_auto, "transformers + compressed-tensors", _describe("compressed-tensors")
    ),
    "bitsandbytes": Container(_save_bnb, _load_auto, "transformers + bitsandbytes", _describe("bitsandbytes")),
    "dense": Container(_save_dense, _load_auto, "transformers", _describe("dense")),
}
