"""What the two transformers engines share: loading, prefill/decode through the model's forward,
logits for the self-check, the weight accounting, and decode attention at the KV heads' width.

Decode attention: transformers' sdpa path expands K and V to the query heads (`repeat_kv`, a
materialised copy) whenever a mask is passed, and a static cache always passes one (its unfilled
slots must be masked). On the demo that moved 7x the KV cache's bytes per step and erased GQA's
saving. For one query token the fix is exact and backend-neutral: the query heads that share a
KV head become rows of one query block against that head (the layout flash-decoding kernels use),
so SDPA reads each K/V head once, mask or not. Prefill goes through transformers' own sdpa.
"""

from __future__ import annotations

import gc
import hashlib
import json

import torch
import torch.nn.functional as F

from quantkit import device as devices
from quantkit.bench import accounting
from quantkit.bench.engines.engine import Engine, EngineSettings
from quantkit.bench.loader import load_for_bench
from quantkit.bench.probe import compute_precision
from quantkit.bench.synthetic import Synthetic, load_synthetic
from quantkit.bench.weight_timing import time_torch_weights
from quantkit.core.atomic import write_json
from quantkit.core.attribution import TWIN_WIDTH
from quantkit.core.hardware import shape_config
from quantkit.core.precision import Precision
from quantkit.core.roofline import kv_bytes
from quantkit.errors import QuantkitError
from quantkit.home import subdir

ATTENTION = "quantkit_gqa_decode"
# config keys that describe the checkpoint's stored form, not the architecture a twin shares
NOT_TWINNED = ("quantization_config", "_name_or_path", "architectures", "torch_dtype", "dtype", "transformers_version")


def twin_config(cfg: dict) -> dict:
    """A config of the same architecture with the hidden and feed-forward widths cut to TWIN_WIDTH
    (the hidden width to the next multiple of the query heads);
    layers, heads, head size, vocabulary and context kept (the head size written out, since
    transformers would otherwise derive it from the hidden width)."""
    heads = cfg["num_attention_heads"]
    out = {k: v for k, v in cfg.items() if k not in NOT_TWINNED}
    out["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // heads
    out["num_key_value_heads"] = cfg.get("num_key_value_heads") or heads
    # transformers requires the hidden width to be a multiple of the query heads, head size or not
    out["hidden_size"] = heads * -(-TWIN_WIDTH // heads)
    out["intermediate_size"] = TWIN_WIDTH
    return out


def cpu_variant(device) -> str | None:
    """The CPU kernels torch runs here: ATen's vectorized kernels dispatch by the CPU's capability
    (AVX512, AVX2, ...; ATEN_CPU_CAPABILITY caps it), as ggml loads a variant. None on a GPU."""
    return f"ATen {torch.backends.cpu.get_cpu_capability()}" if device.type == "cpu" else None


def gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention-function signature; query (b, H, q, d), key/value (b, KV, L, d)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q_len, d = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or kv_heads == heads or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    q = query.reshape(
        b, kv_heads, heads // kv_heads, d
    )  # query head h = g * (H/KV) + r uses KV head g (repeat_kv's order)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, 1, heads, d), None


def use_gqa_attention(model) -> None:
    """Register `gqa_attention` with transformers (its AttentionInterface, the documented way to
    add an attention function; the mask is sdpa's) and switch a model that uses sdpa to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, gqa_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(ATTENTION)


def load_model(source, device, seed: int, dtype: torch.dtype):
    """A checkpoint directory or a Synthetic spec -> BenchModel on `device`, computing in `dtype`."""

    if isinstance(source, Synthetic):
        return load_synthetic(source, shape_config(source.shape), device, seed, dtype)
    if str(source).endswith(".gguf"):
        raise QuantkitError(f"{source}: a GGUF file is read by the llama.cpp engine, not the torch engines")
    return load_for_bench(source, device, dtype)


def precision_of(settings: EngineSettings) -> Precision:
    """The run's precision, or (an engine loaded outside a bench run) the one this device's probe chooses."""
    return settings.precision if settings.precision is not None else compute_precision(settings.device)


class TorchEngine(Engine):
    """Shared by eager and compiled; subclasses own the KV cache (reset) and step_bytes."""

    attributes = True
    computes_in_dtype = True

    def __init__(self, bm, settings: EngineSettings):
        self.bm, self.model, self.device = bm, bm.model, settings.device
        self.precision = precision_of(settings)
        self.cache = None
        self.capacity = 0
        self._weights = None
        use_gqa_attention(self.model)
        cfg = self.model.config.get_text_config(decoder=True)
        self.cfg = cfg
        self.dtype = next(p for p in self.model.parameters() if p.is_floating_point()).dtype
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads

    @classmethod
    def depth_advice(cls, flash_attn: bool | None) -> str:
        return "decode runs sdpa at the KV heads' width (gqa_attention); no setting of this engine changes it"

    @classmethod
    def load(cls, source, settings: EngineSettings):
        if settings.tensor_parallel != 1:
            raise QuantkitError(
                f"--tensor-parallel {settings.tensor_parallel}: the {cls.name} "
                "engine runs on one device (use --engine vllm)"
            )
        if settings.threads and settings.device.type == "cpu":
            torch.set_num_threads(settings.threads)
        dtype = getattr(torch, precision_of(settings).dtype)
        return cls(load_model(source, settings.device, settings.seed, dtype), settings)

    def prepare(self, ids: list[int]):
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def as_token(self, token_id: int):
        return self.prepare([token_id])  # (1, 1): what decode() takes and returns

    def cache_depth(self) -> int:
        return int(self.cache.get_seq_length()) if self.cache is not None else 0

    def _logits(self, ids, start: int):
        positions = torch.arange(start, start + ids.shape[1], device=self.device)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids, past_key_values=self.cache, cache_position=positions, use_cache=True, logits_to_keep=1
            )
        return out.logits[:, -1]

    def prefill(self, prompt):
        return self._logits(prompt, 0).argmax(-1, keepdim=True)

    def decode(self, token, pos: int):
        return self._logits(token, pos).argmax(-1, keepdim=True)

    def decode_logits(self, token, pos: int):
        """The logits of a decode step (the path decode() times); for the self-check."""
        return self._logits(token, pos)

    def logprobs(self, ids: list[int], prompt_len: int, capacity: int):
        self.reset(capacity)
        rows = [self._logits(self.prepare(ids[:prompt_len]), 0)]
        for pos in range(prompt_len, len(ids)):
            rows.append(self.decode_logits(self.prepare([ids[pos]]), pos))
        return torch.log_softmax(torch.cat(rows).float().cpu(), -1)

    def sync(self) -> None:
        devices.synchronize(self.device)

    def weight_bytes(self) -> dict:
        if self._weights is None:  # the model does not change once loaded
            self._weights = accounting.weight_read_bytes(self.model)
        return self._weights

    def kv_bytes_per_token(self) -> float:
        elem = torch.finfo(self.dtype).bits // 8
        return kv_bytes(self.cfg.num_hidden_layers, self.kv_heads, self.head_dim, elem)

    def kv_cache_type(self) -> str:
        """The model's own dtype: the torch engines keep no quantized cache (an artifact's FP8 K/V
        scales are the serving engine's; bench/loader.py says so in the notes)."""
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> dict:
        return {
            "engine": self.name,
            "kind": self.bm.kind,
            "kernel": self.bm.kernel,
            "notes": list(self.bm.notes),
            "emulated": self.bm.emulated,
            "attention": f"sdpa; decode at the KV heads' width ({ATTENTION})",
            **devices.describe(self.device, self.dtype),
            "dtype_reason": self.precision.reason,
            "cpu_variant": cpu_variant(self.device),
            "threads": torch.get_num_threads(),
        }

    def weight_kernels(self) -> tuple:
        return time_torch_weights(self.model, self.dtype, self.device, self.sync)

    def twin_source(self):
        """A random-weight model of this one's layers, heads, head size and vocabulary at twin widths
        (a config.json under QUANTKIT_HOME, read as a Synthetic shape)."""
        cfg = twin_config(self.cfg.to_dict())
        text = json.dumps(cfg, sort_keys=True)
        where = subdir("twins") / hashlib.sha256(text.encode()).hexdigest()[:16]
        path = where / "config.json"
        if not path.is_file():
            write_json(path, cfg)
        return Synthetic(str(path), 16), (
            f"twin: {cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} "
            f"heads of {cfg['head_dim']}, widths {cfg['hidden_size']}/{cfg['intermediate_size']}, random "
            f"{str(self.dtype).removeprefix('torch.')} weights"
        )

    def close(self) -> None:
        self.cache = self.model = self.bm = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
