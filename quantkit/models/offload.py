"""Models larger than RAM: load with compressed-tensors' CPU/disk offloading, which
llm-compressor's sequential pipeline onloads one decoder layer at a time.

A convert whose model (at its calibration precision) would not fit in the memory budget loads
with `device_map="auto_offload"` instead: as many weights as fit stay in RAM, the rest live in
safetensors files under a temp folder beside `--out`, removed afterwards.
"""

from __future__ import annotations

import importlib
import re
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from quantkit.errors import RecipeError
from quantkit.models import fp4_load_fix

# RAM kept free for what is not weights: calibration activations, the Hessians, the save.
RESERVE_FRACTION = 0.25
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


@dataclass(frozen=True)
class OffloadPlan:
    cpu_bytes: int  # weights kept in RAM; the rest goes to disk
    model_bytes: int  # the whole model at the load precision
    dtype: str  # load (and calibration) precision


def parse_size(text: str, option: str = "--max-memory") -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise RecipeError(f"{option} {text!r}: expected a positive size such as 8GB, 512MB or 16GiB")
    return int(float(m.group(1)) * _UNITS[unit])


def available_bytes() -> int:
    return int(psutil.virtual_memory().available)


def plan(
    n_params: int, calib_dtype: str, source_dtype: str, max_memory: int | None, available: int
) -> OffloadPlan | None:
    """None when the model fits in the budget at its calibration precision; else an offload plan.

    An offloaded model loads at the checkpoint's own precision: casting it afterwards would not
    reach the weights on disk, and a float32 copy would double what has to be offloaded."""
    budget = max_memory if max_memory is not None else int(available * (1 - RESERVE_FRACTION))
    need = n_params * _itemsize(calib_dtype)
    if need <= budget:
        return None
    return OffloadPlan(cpu_bytes=budget, model_bytes=n_params * _itemsize(source_dtype), dtype=source_dtype)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def load(path: Path, offload: OffloadPlan, folder: Path, trust_remote_code: bool = False):
    """compressed-tensors' loader (the one llm-compressor documents for big models)."""
    from compressed_tensors.offload import load_offloaded_model
    from transformers import AutoModelForCausalLM

    fp4_load_fix.install()  # FP4 weights decompress at the model's dtype (compressed-tensors 0.19 fault)
    with load_offloaded_model():
        model = AutoModelForCausalLM.from_pretrained(
            str(path),
            dtype=getattr(torch, offload.dtype),
            device_map="auto_offload",
            max_memory={"cpu": offload.cpu_bytes},
            offload_folder=str(folder),
            trust_remote_code=trust_remote_code,
        )
    return model.eval()


def onload_to(model, device):
    """Run `model`'s forwards on `device` one module at a time, its weights staying where they are
    (RAM or disk): compressed-tensors' offloading, as llm-compressor's pipelines use it. The
    reload check then runs on the calibration device, whatever the model's size."""
    from compressed_tensors.offload import set_onload_device

    return set_onload_device(model, plain_cpu(device))


def plain_cpu(device):
    """The device as compressed-tensors can take it: an indexed CPU ("cpu:0") becomes "cpu".

    Upstream fault (compressed-tensors 0.19, offload/cache/base.py, OffloadCache.__init__):
    `assert str(offload_device) == str(self.offload_device)` compares strings, so a CPU cache
    built for "cpu:0" (the same device as "cpu") fails the assertion when llm-compressor's save
    re-dispatches the model (from_accelerate -> dispatch_with_map). Other device types keep
    their index."""

    return torch.device("cpu") if device.type == "cpu" else device


@contextmanager
def calibration_device(device):
    """Make llm-compressor 0.14 calibrate on `device` (a torch.device) for one oneshot call.

    Upstream limitation (llmcompressor/utils/dev.py, get_main_device): the sequential and
    data-free pipelines onload each layer to `get_main_device()`, which takes no argument: MPS if
    present, else the accelerator whose index is the distributed rank, else the CPU. On a GPU
    machine nobody can calibrate on the CPU, nor on cuda:1. The pipelines look the function up in
    their own module namespaces, so it is swapped there (and in utils.dev, for get_high_precision)
    and restored afterwards.
    """

    names = (
        "llmcompressor.utils.dev",
        "llmcompressor.pipelines.sequential.pipeline",
        "llmcompressor.pipelines.data_free.pipeline",
    )
    modules = [importlib.import_module(n) for n in names]
    saved = [m.get_main_device for m in modules]
    target = plain_cpu(device)
    for m in modules:
        m.get_main_device = lambda: target
    try:
        yield device
    finally:
        for m, original in zip(modules, saved):
            m.get_main_device = original


def disk_tensors(model) -> int:
    """How many parameters and buffers live on disk."""
    from compressed_tensors.offload.cache import DiskCache

    n = 0
    for m in model.modules():
        for cache in (m._parameters, m._buffers):
            if isinstance(cache, DiskCache):
                n += len(list(cache))
    return n


@contextmanager
def layer_at_a_time(model):
    """Run forwards with each decoder layer's weights onloaded once for the whole layer.

    Upstream fault (compressed-tensors 0.19, quantization/lifecycle/forward.py,
    quantized_forward): the fake-quantized weight is swapped in with
    `patch_attr(weight, "data", ...)` on the tensor that `self.weight` returned, then
    `Linear.forward` reads `self.weight` again. For weights offloaded to disk (or onloaded to
    another device) every read onloads a fresh copy, so the layer silently runs with its
    unquantized weights: a disk-offloaded demo model differed from its own saved artifact by mean
    KL 0.30. Inside `disable_offloading()` repeated reads return the same onloaded tensor; entering
    it per decoder layer (as llm-compressor's sequential pipeline does) keeps memory at one layer.
    Models that are not offloaded are unaffected.
    """
    from compressed_tensors.offload import disable_offloading

    layers = getattr(getattr(model, "model", None), "layers", None) or []
    stack = ExitStack()
    hooks = []
    for layer in layers:
        hooks.append(layer.register_forward_pre_hook(lambda *_: stack.enter_context(disable_offloading())))
        hooks.append(layer.register_forward_hook(lambda *_: stack.close()))
    try:
        with disable_offloading() if not layers else ExitStack():
            yield
    finally:
        stack.close()
        for h in hooks:
            h.remove()
