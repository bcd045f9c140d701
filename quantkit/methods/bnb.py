"""bitsandbytes NF4 / LLM.int8(): quantization happens as transformers loads the checkpoint."""

from __future__ import annotations

from typing import Callable

import torch

from quantkit.methods.bnb_cpu_fix import remember_canonical_state


def nf4_config(cfg):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=cfg.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, cfg.compute_dtype),
        llm_int8_skip_modules=list(cfg.ignore),
    )


def int8_config(cfg):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_8bit=True, llm_int8_threshold=cfg.threshold, llm_int8_skip_modules=list(cfg.ignore)
    )


def quantize(
    model, cfg, samples, src=None, device=None, transform=None, *, config: Callable
):  # transform: never set (recipe refuses it)
    """Reload `src` through bitsandbytes (the in-memory FP model is not needed; it is dropped);
    `config(cfg)`: transformers' BitsAndBytesConfig of the method (nf4_config, int8_config)."""
    from transformers import AutoModelForCausalLM

    remote = type(model).__module__.startswith(
        "transformers_modules"
    )  # loaded under --trust-remote-code: its code has run
    del model
    device = device or torch.device("cpu")  # bitsandbytes quantizes as it loads, onto this device
    qmodel = AutoModelForCausalLM.from_pretrained(
        str(src), quantization_config=config(cfg), dtype=torch.bfloat16, device_map=device, trust_remote_code=remote
    )
    remember_canonical_state(qmodel)  # before any forward: see bnb_cpu_fix
    return qmodel.eval()
