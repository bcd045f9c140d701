"""Narrow workaround for a bitsandbytes 0.50 fault on AVX512-BF16 CPUs (4-bit NF4/FP4 export).

Upstream fault: on such a CPU the first forward of each `Linear4bit` repacks its weight and
quant state in place into a CPU-only layout (bitsandbytes/nn/modules.py, Linear4bit.forward,
via functional._convert_weight_packed_for_cpu), storing `absmax` transposed to (K/blocksize, N)
and rounded to bf16. On save, Linear4bit._save_to_state_dict calls
functional._convert_weight_packed_for_cpu_inverse, which restores the weight bytes exactly but
only converts `absmax` back in its double-quant branch: without double quant the checkpoint
holds a transposed bf16 absmax and reloads as garbage (KL ~13 on the demo model); with double
quant it re-quantizes from the bf16 copy (KL ~2e-3). Closest upstream report:
bitsandbytes#2078 / PR #2083 (the same inverse skipped in Params4bit.to()).

Fix: snapshot each layer's canonical quant state before the first forward and put it back
right before save_pretrained (bit-exact). GPUs and CPUs without AVX512-BF16 never repack, and
there both functions are no-ops.
"""

from __future__ import annotations

import copy

_ATTR = "_quantkit_canonical_quant_state"


def _linear4bit(model):
    import bitsandbytes as bnb

    return [(n, m) for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]


def _cpu_packed(module) -> bool:
    return bool(getattr(getattr(module.weight, "quant_state", None), "packing_format_for_cpu", False))


def remember_canonical_state(model) -> int:
    """Call right after from_pretrained(..., quantization_config=...), before any forward."""
    n = 0
    for name, m in _linear4bit(model):
        if _cpu_packed(m):
            raise RuntimeError(f"{name} was already repacked for the CPU; snapshot before the first forward pass")
        setattr(m, _ATTR, copy.deepcopy(m.weight.quant_state))
        n += 1
    return n


def restore_canonical_state(model) -> int:
    """Undo the in-place CPU repack using the snapshot; returns how many layers were restored."""
    import bitsandbytes.functional as F

    restored = 0
    for name, m in _linear4bit(model):
        saved = getattr(m, _ATTR, None)
        if _cpu_packed(m):
            if saved is None:
                raise RuntimeError(f"{name}: repacked for the CPU and no canonical snapshot to restore")
            data, _ = F._convert_weight_packed_for_cpu_inverse(m.weight.data, m.weight.quant_state)
            m.weight.data = data
            restored += 1
        if saved is not None:
            qs = copy.deepcopy(saved)
            m.weight.quant_state = qs
            m.quant_state = qs
    return restored
