"""Checks that run before any work: the architecture loads, group sizes divide every layer."""

from __future__ import annotations

import re

from .errors import ModelError, RecipeError


def meta_model(config_dict: dict, trust_remote_code: bool = False):
    """The model skeleton on the meta device (no memory), to read layer shapes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = dict(config_dict)
    model_type = cfg_dict.pop("model_type", None)
    try:
        config = AutoConfig.for_model(model_type, **cfg_dict)
    except (ValueError, KeyError):
        raise ModelError(f"unsupported architecture {model_type!r}: transformers does not know this model type") from None
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError:
        raise ModelError(f"unsupported architecture {model_type!r}: not a causal language model in transformers") from None


def is_ignored(name: str, ignore: tuple[str, ...]) -> bool:
    """llm-compressor's convention: 're:REGEX' patterns or exact module names (or name suffixes)."""
    for pattern in ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern):
            return True
    return False


def quantizable_linears(model, ignore: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    import torch

    return {
        name: (mod.out_features, mod.in_features)
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and not is_ignored(name, ignore)
    }


def _override_for(name: str, overrides) -> object | None:
    for ov in overrides:
        if any(re.match(t, name) for t in ov.targets):
            return ov
    return None


def check_group_sizes(linears: dict[str, tuple[int, int]], cfg, key: str) -> None:
    """Every quantized layer's input columns must be a multiple of its group size."""
    bad: dict[int, list[tuple[str, int]]] = {}
    for name, (_, cols) in linears.items():
        ov = _override_for(name, getattr(cfg, "overrides", ()))
        gs = ov.group_size if ov is not None else getattr(cfg, "group_size", -1)
        if gs > 0 and cols % gs:
            bad.setdefault(gs, []).append((name, cols))
    if not bad:
        return
    gs, layers = next(iter(bad.items()))
    name, cols = layers[0]
    widths = sorted({c for _, c in linears.values()})
    work = [g for g in (32, 64, 128) if all(w % g == 0 for w in widths)]
    more = f" (and {len(layers) - 1} more layers)" if len(layers) > 1 else ""
    raise RecipeError(
        f"{key}: group_size {gs} does not divide the {cols} input columns of {name}{more}; "
        f"sizes that work for every layer: {', '.join(map(str, work + [-1]))} (-1 = per channel), or add those layers to ignore"
    )
