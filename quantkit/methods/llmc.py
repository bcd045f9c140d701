"""RTN, GPTQ, AWQ, AutoRound, SmoothQuant W8A8 (after a rotation, when the variant has one), FP8 and FP4
(NVFP4, MXFP4) through llm-compressor, saved in the compressed-tensors format."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from quantkit.methods.patches import llmcompressor_awq_float64_loss, llmcompressor_cpu_pin_memory, quiet_llmcompressor
from quantkit.methods.rotation import modifiers as rotation_modifiers
from quantkit.models.offload import calibration_device
from quantkit.progress import bar

SEED = 0  # torch's seed for every calibration pass (llm-compressor's methods, AutoRound's included)


def weight_args(bits: int, group_size: int, symmetric: bool, observer: str = "minmax"):
    from compressed_tensors.quantization import QuantizationArgs

    kw = {} if observer == "minmax" else {"observer": "mse"}
    return QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=symmetric,
        strategy="channel" if group_size == -1 else "group",
        group_size=None if group_size == -1 else group_size,
        **kw,
    )


def weight_groups(cfg) -> dict:
    """The base weight-only scheme for every Linear, plus one group per mixed-precision override.

    compressed-tensors gives a regex target precedence over the class target "Linear"."""
    from compressed_tensors.quantization import QuantizationScheme

    groups = {
        "group_0": QuantizationScheme(
            targets=["Linear"], weights=weight_args(cfg.bits, cfg.group_size, cfg.symmetric, cfg.observer)
        )
    }
    for i, ov in enumerate(cfg.overrides, 1):
        targets = [f"re:{t}" for t in ov.targets]
        groups[f"group_{i}"] = QuantizationScheme(
            targets=targets, weights=weight_args(ov.bits, ov.group_size, ov.symmetric, cfg.observer)
        )
    return groups


def w8a8_groups() -> dict:
    """INT8 weights per channel, INT8 activations per token (dynamic: scales computed at run time)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    acts = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weight_args(8, -1, True), input_activations=acts)}


def fp8_groups(cfg) -> dict:
    """compressed-tensors' FP8_DYNAMIC preset (FP8 E4M3 weights with a static scale per output
    channel, activations FP8 per token with scales computed at run time); weight-only without its
    activations. Saved in the float-quantized format (FP8 weights and their scales), which the
    weight-only scheme would otherwise be labelled with its alias naive-quantized: the same tensors."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    update = (
        {"format": "float-quantized"}
        if cfg.dynamic_activations
        else {"format": "float-quantized", "input_activations": None}
    )
    return {"group_0": scheme.model_copy(update=update)}


def fp4_groups(cfg) -> dict:
    """compressed-tensors' NVFP4A16 or MXFP4A16 preset (quantization/quant_scheme.py): FP4 E2M1
    weights, 16-bit activations. NVFP4: groups of 16 with FP8 E4M3 scales under one FP32 scale per
    tensor (llm-compressor shares it across q/k/v and gate/up, which vLLM fuses); MXFP4: groups of
    32 with E8M0 scales. Saved in the nvfp4-pack-quantized / mxfp4-pack-quantized formats."""
    from compressed_tensors.quantization import preset_name_to_scheme

    return {"group_0": preset_name_to_scheme(cfg.preset, ["Linear"])}


# Each method's llm-compressor modifiers, in the order they run: (cfg) -> list of modifiers. The
# registry (methods/method_registry.py) hands one of these to `quantize`.


def rtn(cfg) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(config_groups=weight_groups(cfg), ignore=list(cfg.ignore))]


def gptq(cfg) -> list:
    from llmcompressor.modifiers.gptq import GPTQModifier

    return [
        GPTQModifier(
            config_groups=weight_groups(cfg),
            ignore=list(cfg.ignore),
            actorder=cfg.actorder,
            dampening_frac=cfg.dampening,
            block_size=cfg.block_size,
        )
    ]


def awq(cfg) -> list:
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier

    groups, ignore = weight_groups(cfg), list(cfg.ignore)
    rounding = (
        GPTQModifier(config_groups=groups, ignore=ignore, actorder=cfg.actorder, dampening_frac=cfg.dampening)
        if cfg.rounding == "gptq"
        else QuantizationModifier(config_groups=groups, ignore=ignore)
    )
    return [AWQModifier(duo_scaling=cfg.duo_scaling), rounding]


def w8a8(cfg) -> list:
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.transform import SmoothQuantModifier

    return [
        SmoothQuantModifier(smoothing_strength=cfg.smoothing_strength),
        GPTQModifier(config_groups=w8a8_groups(), ignore=list(cfg.ignore), dampening_frac=cfg.dampening, actorder=None),
    ]


def fp8(cfg) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(config_groups=fp8_groups(cfg), ignore=list(cfg.ignore))]


def fp4(cfg) -> list:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [QuantizationModifier(config_groups=fp4_groups(cfg), ignore=list(cfg.ignore))]


def kv_cache_args(cfg):
    """compressed-tensors' kv_cache_scheme for a step's `kv_cache: {fp8: tensor | head}`, or None:
    FP8 E4M3, symmetric, one static scale per tensor or per KV head, calibrated on the windows (what
    vLLM's CompressedTensorsKVCacheMethod loads: float, 8 bits, tensor or attn_head, symmetric)."""
    kv = getattr(cfg, "kv_cache", None)
    if kv is None or kv.fp8 is None:
        return None
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy=kv.strategy, dynamic=False)


def build_recipe(cfg, modifiers: Callable, transform=None) -> list:
    """llm-compressor modifiers for a quantize step, after the rotation of a transform step if any.
    With FP8 K/V scales, the step's rounding modifier (the last) takes the kv_cache_scheme: its
    observers see the keys and values of the same calibration pass (validated again, so the
    modifier knows it needs calibration data)."""

    mods = modifiers(cfg)
    kv = kv_cache_args(cfg)
    if kv is not None:
        last = mods[-1]
        given = {k: getattr(last, k) for k in last.model_fields_set}
        mods[-1] = type(last).model_validate({**given, "kv_cache_scheme": kv})
    return [*rotation_modifiers(transform), *mods]


def rotate(model, transform, device=None):
    """Fuse a transform step's rotations into `model`'s weights now, on their own (no calibration
    data), so that what runs next sees the weights the rounding will round: `auto:`'s sensitivity
    pass, then the quantize step (given no transform). The same modifiers, seed and device as when
    the rotation runs inside the quantize step's pass (`quantize`); returns the same model."""
    from llmcompressor import oneshot

    quiet_llmcompressor()
    llmcompressor_cpu_pin_memory()
    torch.manual_seed(SEED)
    with torch.no_grad(), calibration_device(device or torch.device("cpu")):
        oneshot(
            model=model,
            recipe=rotation_modifiers(transform),
            processor=_NoProcessor(),
            trust_remote_code_model=type(model).__module__.startswith("transformers_modules"),
        )
    return model  # _name_or_path kept: the quantize step's oneshot re-reads the config from it


def _dataset(samples):
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "input_ids": [s[0].tolist() for s in samples],
            "attention_mask": [[1] * s.shape[1] for s in samples],
        }
    )


class _NoProcessor:
    """oneshot insists on a processor whenever a dataset is given (ours is already tokenized), and
    loads one from the model's path when given none (a rotation alone needs none)."""

    def save_pretrained(self, *args, **kwargs) -> None:
        return None


@contextmanager
def layer_progress(model, label: str):
    """A progress bar that follows llm-compressor's layer-by-layer pipeline (a pre-hook per decoder layer)."""

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        yield
        return
    n = len(layers)
    with bar(label, total=n) as update:
        hooks = [
            layer.register_forward_pre_hook(lambda *_, i=i: update(i + 1, f"{label} layer {i + 1}/{n}"))
            for i, layer in enumerate(layers)
        ]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()


def quantize(
    model, cfg, samples, src=None, device=None, transform=None, *, modifiers: Callable, tuning: Callable | None = None
):
    """Quantize `model` in place with llm-compressor's oneshot; returns the same model.

    `modifiers(cfg)`: the method's llm-compressor modifiers (rtn, gptq, ... above); `tuning(cfg,
    samples)`: the calibration windows the method works on, when not all of them (AutoRound's).

    The sequential pipeline calibrates layer by layer on `device` (a torch.device; None: the CPU),
    onloading each layer's weights there while the model stays in RAM or on disk ("independent":
    AWQ/SmoothQuant smooth in their own pass before GPTQ solves on the smoothed model). Afterwards the model's forward
    fake-quantizes, so its logits equal those of the saved artifact when reloaded.
    """
    from llmcompressor import oneshot

    quiet_llmcompressor()
    llmcompressor_cpu_pin_memory()
    llmcompressor_awq_float64_loss()
    if tuning is not None:
        samples = tuning(cfg, samples)

    recipe = build_recipe(cfg, modifiers, transform)
    kwargs = {}
    if samples:
        kwargs = dict(
            dataset=_dataset(samples),
            processor=_NoProcessor(),
            num_calibration_samples=len(samples),
            max_seq_length=max(s.shape[1] for s in samples),
            shuffle_calibration_samples=False,
        )
    torch.manual_seed(SEED)
    with (
        torch.no_grad(),
        layer_progress(model, f"{cfg.method}: calibrating"),
        calibration_device(device or torch.device("cpu")),
    ):
        # oneshot re-reads the model's config from its path; a class from the checkpoint's own code
        # (loaded under --trust-remote-code, so that code has run already) needs the same permission there.
        oneshot(
            model=model,
            recipe=recipe,
            trust_remote_code_model=type(model).__module__.startswith("transformers_modules"),
            **kwargs,
        )
    # resave_config() re-reads config.json from _name_or_path at save time; keep the in-memory config.
    model.config._name_or_path = ""
    return model
