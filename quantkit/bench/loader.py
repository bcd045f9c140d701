"""Load a checkpoint for benchmarking: 16-bit models as they are; compressed-tensors artifacts
with their integer weights mapped onto low-bit kernels (transformers would decompress them to
16 bits, which makes a speed comparison meaningless); bitsandbytes through its own layers. FP8
runs as FP8 where the device has FP8 matmuls; elsewhere it is dequantized to the engine's dtype at
load, and the result says so (BenchModel.emulated) rather than passing that off as FP8's speed.

Everything that is not stored as integers (16-bit weights, scales, activations) computes in the
`dtype` the engine is given: the device's probe chooses it (core/precision.py), so a CPU without
bf16 arithmetic runs float32 rather than emulated bf16."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from quantkit.bench import kernels
from quantkit.errors import QuantkitError


@dataclass
class BenchModel:
    model: object
    kind: str  # "dense" | "compressed-tensors" | "bitsandbytes" | "synthetic"
    kernels: dict[str, int] = field(default_factory=dict)  # kernel name -> number of layers
    notes: list[str] = field(default_factory=list)
    # What is timed instead of the stored format, when a layer has no kernel for it on this device
    # (FP8 without FP8 matmuls): said in the notes, the row's `emulated` and its flags.
    emulated: str | None = None

    @property
    def kernel(self) -> str:
        return "; ".join(f"{k} x{n}" for k, n in self.kernels.items()) or "dense"


# An FP8 KV cache scheme's scales beside each attention (compressed-tensors' kv_cache_scheme)
KV_SCALES = re.compile(r".*\.(k|v|q)_(scale|zero_point)$")


def kv_note(dtype: torch.dtype) -> str:
    return (
        "the checkpoint's FP8 K/V scales (kv_cache_scheme) are not applied: this engine keeps its KV cache in "
        f"{_name(dtype)}, and the bytes per token count that cache (vLLM stores it in FP8; llama.cpp takes "
        "--kv-cache types)"
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, on the CPU: packed integers are repacked there (ATen's
    int4 packing runs on the device the layer is built for, see kernels.py)."""

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _group_of(name: str, qcfg: dict) -> dict:
    """The config group whose scheme applies to `name` (exact name, then regex, then class)."""

    groups = list(qcfg["config_groups"].values())
    for g in groups:
        if name in g["targets"]:
            return g
    for g in groups:
        if any(t.startswith("re:") and re.match(t[3:], name) for t in g["targets"]):
            return g
    return next(g for g in groups if "Linear" in g["targets"])


def _unpack(sd: dict, prefix: str, scheme: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    w = scheme["weights"]
    bits = w["num_bits"]
    scale = sd[prefix + "weight_scale"]
    if prefix + "weight_packed" in sd:
        shape = torch.Size(sd[prefix + "weight_shape"].tolist())
        q = unpack_from_int32(sd[prefix + "weight_packed"], bits, shape)
    else:
        q = sd[prefix + "weight"]
    zp = None
    if prefix + "weight_zero_point" in sd:
        zp = unpack_from_int32(
            sd[prefix + "weight_zero_point"], bits, torch.Size((q.shape[0], scale.shape[-1])), packed_dim=0
        )
    return q, scale, zp


def _kernel_module(sd: dict, prefix: str, scheme: dict, device, dtype: torch.dtype):
    w, acts = scheme["weights"], scheme.get("input_activations")
    q, scale, zp = _unpack(sd, prefix, scheme)
    bias = sd.get(prefix + "bias")
    if w["type"] == "float":
        return _fp8_module(q, scale, zp, bias, w, acts, device, dtype)
    if w["type"] != "int":
        return None
    if acts is not None:
        if acts.get("dynamic") and w["num_bits"] == 8 and w["strategy"] == "channel" and zp is None:
            return kernels.Int8DynamicActivationLinear(q, scale, bias, device, dtype)
        return None
    if w["num_bits"] == 4 and w["strategy"] == "group":
        return kernels.Int4WeightOnlyLinear(q, scale, zp, w["group_size"], bias, device, dtype)
    if w["num_bits"] == 8 and w["strategy"] == "channel":
        return kernels.Int8WeightOnlyLinear(q, scale, zp, bias, device, dtype)
    return None


def _fp8_module(q, scale, zp, bias, w: dict, acts: dict | None, device, dtype: torch.dtype):
    """FP8 E4M3 per output channel (compressed-tensors' float-quantized format), activations FP8
    per token at run time or left in 16 bits; other float schemes have no layer here."""
    if w["num_bits"] != 8 or w["strategy"] != "channel" or zp is not None or q.dtype != kernels.FP8:
        return None
    if acts is not None and not (
        acts.get("type") == "float" and acts.get("dynamic") and acts.get("strategy") == "token"
    ):
        return None
    return kernels.Fp8Linear(q, scale, bias, device, dynamic=acts is not None, dtype=dtype)


def _emulation_note(modules: list, device, dtype: torch.dtype) -> str | None:
    """The plain statement of what is timed when FP8 layers could not run as FP8."""
    reasons = sorted({m.emulated for m in modules if getattr(m, "emulated", None)})
    if not reasons:
        return None
    return (
        f"FP8 is not timed as FP8 on {device} ({'; '.join(reasons)}): the FP8 weights "
        f"were dequantized to {_name(dtype)} at load and a {_name(dtype)} "
        "GEMM runs (activations rounded to FP8 per token where the scheme has "
        "them, as transformers does there), so the "
        f"weights read are {_name(dtype)}'s {dtype.itemsize} bytes each, not FP8's 1 byte; the bytes per "
        "token and the roofline count what is timed"
    )


def _set_module(model, name: str, module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _skeleton(path: Path, device, dtype: torch.dtype):
    """The architecture with its parameters on the meta device (no memory) and its computed
    buffers (RoPE's inv_freq) built on `device`; every parameter is then assigned a tensor that
    already lives on `device`, so nothing is ever copied out of meta."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device(device), init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _misplaced(model, device) -> list[str]:
    """Parameters and buffers that are not on `device` (meta ones included)."""
    want = torch.device(device)
    out = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.device.type != want.type or (want.index is not None and t.device.index not in (None, want.index)):
            out.append(f"{name} ({t.device})")
    return out


def load_compressed(path: Path, device, dtype: torch.dtype) -> BenchModel:
    qcfg = json.loads((path / "config.json").read_text())["quantization_config"]
    sd = _weights(path)
    model = _skeleton(path, device, dtype)
    bm = BenchModel(model, "compressed-tensors")
    prefixes = sorted({k[: -len("weight_scale")] for k in sd if k.endswith("weight_scale")})
    modules = []
    for prefix in prefixes:
        name = prefix.rstrip(".")
        module = _kernel_module(sd, prefix, _group_of(name, qcfg), device, dtype)
        if module is None:
            raise QuantkitError(
                f"{path}: no low-bit kernel for {name}'s scheme on {device}; "
                "not reporting a decompressed 16-bit figure as the quantized one"
            )
        _set_module(model, name, module)
        modules.append(module)
        bm.kernels[module.kernel] = bm.kernels.get(module.kernel, 0) + 1
        for suffix in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight", "bias"):
            sd.pop(prefix + suffix, None)
    kv = [k for k in sd if KV_SCALES.match(k)]
    for k in kv:
        sd.pop(k)
    if kv:
        bm.notes.append(kv_note(dtype))
    dense = {k: (v.to(dtype) if v.is_floating_point() else v).to(device) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(dense, strict=False, assign=True)
    model.tie_weights()
    leftover = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if leftover or unexpected:
        raise QuantkitError(
            f"{path}: could not place every tensor (missing {leftover[:3]}, unexpected {unexpected[:3]})"
        )
    bm.emulated = _emulation_note(modules, device, dtype)
    if bm.emulated:
        bm.notes.append(bm.emulated)
    wrong = _misplaced(model, device)
    if wrong:  # a library fault, not the user's: say where
        raise RuntimeError(f"bench loader: tensors not on {device}: {', '.join(wrong[:3])}")
    return bm


def load_for_bench(path: Path, device, dtype: torch.dtype) -> BenchModel:
    """`device`: a torch.device (or anything torch.device() takes: "cpu", "cpu:0", "cuda:1"); `dtype`:
    what the model computes in (the engine's precision)."""
    device = torch.device(device)
    cfg = json.loads((path / "config.json").read_text())
    qm = (cfg.get("quantization_config") or {}).get("quant_method")
    if qm == "compressed-tensors":
        bm = load_compressed(path, device, dtype)
    elif qm == "bitsandbytes":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), device_map=device, dtype=dtype)
        n = sum(1 for m in model.modules() if type(m).__name__ in ("Linear4bit", "Linear8bitLt"))
        bm = BenchModel(
            model,
            "bitsandbytes",
            {f"bitsandbytes {cfg['quantization_config'].get('_load_in_4bit') and 'Linear4bit' or 'Linear8bitLt'}": n},
        )
    elif qm:
        raise QuantkitError(f"{path}: quantization method {qm!r} is not benchmarkable by quantkit")
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), device_map=device, dtype=dtype)
        bm = BenchModel(model, "dense")
    bm.model.eval()
    return bm
