"""Which parts of a model to keep at 8 bits: INT4 sensitivity per vLLM-fusable unit.

For every decoder layer and each unit vLLM serves as one kernel (q/k/v fused as qkv_proj,
gate/up as gate_up_proj, o_proj, down_proj), fake-quantize that unit alone to INT4 (RTN,
symmetric or asymmetric, group G, compressed-tensors' own quantizer) and measure the mean KL against the FP
model on calibration windows. A greedy pick by KL per extra bit then fills a bits-per-weight
budget with 8-bit units and writes the `overrides:` block for a recipe. Units are never split:
vLLM refuses a fused layer whose shards have different schemes (preflight.check_fused_shards).
"""

from __future__ import annotations

from quantkit.errors import QuantkitError

# unit -> (parent module in a decoder layer, its member linears); Llama, Mistral, Qwen2 names.
UNITS: dict[str, tuple[str, tuple[str, ...]]] = {
    "qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "o": ("self_attn", ("o_proj",)),
    "gate_up": ("mlp", ("gate_proj", "up_proj")),
    "down": ("mlp", ("down_proj",)),
}


UNIT_ORDER = {unit: i for i, unit in enumerate(UNITS)}


def _bits_per_weight(fmt, in_features: int) -> float:
    """Stored bits per weight of one row of `in_features` weights (roofline's storage accounting)."""
    return fmt.bytes_for(1, in_features) * 8 / in_features


def int4_bits(group_size: int, symmetric: bool = True) -> float:
    """INT4 with one 16-bit scale per group, and one 4-bit zero point per group when asymmetric."""
    from quantkit.core.roofline import quantized_layout

    return _bits_per_weight(quantized_layout(4, group_size, symmetric).linear, group_size)


def int8_bits(in_features: int) -> float:
    """INT8 per output channel: one 16-bit scale per row of `in_features` weights."""
    from quantkit.core.roofline import quantized_layout

    return _bits_per_weight(quantized_layout(8, -1).linear, in_features)


def greedy_pick(results: list[dict], n_weights: int, group_size: int, budget: float,
                symmetric: bool = True) -> tuple[list[dict], float]:
    """Units to raise to INT8, highest KL per weight first, while the average stays within `budget`.

    `results`: dicts with "kl", "weights" (the unit's weight count) and "in_features"; one whose
    "below_noise" is true is never picked (its INT4 cost cannot be told from rounding, so INT8
    buys nothing measurable). Returns the picked units and the resulting bits per weight over all
    `n_weights` (ties: lower layer first)."""
    base = int4_bits(group_size, symmetric)
    spare = (budget - base) * n_weights
    picked, used = [], 0.0
    for r in sorted((r for r in results if not r.get("below_noise")), key=lambda r: (-r["kl"] / r["weights"], r["layer"], r["unit"])):
        cost = (int8_bits(r["in_features"]) - base) * r["weights"]
        if used + cost <= spare:
            picked.append(r)
            used += cost
    return picked, base + used / n_weights


def overrides(picked: list[dict], layers_path: str = "model.layers") -> list[dict]:
    """One recipe override per unit type: regexes over whole units (all of q/k/v, both of gate/up)."""
    prefix = layers_path.replace(".", "\\.")
    out = []
    for unit, (parent, members) in UNITS.items():
        chosen = sorted(r["layer"] for r in picked if r["unit"] == unit)
        if chosen:
            layers = "|".join(map(str, chosen))
            mods = members[0] if len(members) == 1 else f"({'|'.join(members)})"
            out.append({"targets": [f"{prefix}\\.({layers})\\.{parent}\\.{mods}$"], "bits": 8, "group_size": -1})
    return out


def fake_int4(w, group: int, symmetric: bool = True):
    """RTN INT4 per group: compressed-tensors' own min-max qparams and fake quantizer."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    from quantkit.methods.llmc import weight_args

    args = weight_args(4, group, symmetric)
    g = w.float().reshape(w.shape[0], -1, group)
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
    return fake_quantize(w.float(), scale, zp, args).to(w.dtype)


def decoder_layers(model):
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or len(layers) == 0:
        raise QuantkitError("sensitivity: the model has no model.layers list of decoder layers (Llama, Mistral, Qwen2 style)")
    missing = [f"{p}.{m}" for p, ms in UNITS.values() for m in ms if not _has(layers[0], f"{p}.{m}")]
    if missing:
        raise QuantkitError(f"sensitivity: decoder layer 0 has no {', '.join(missing)}; it knows Llama-style layers "
                            "(self_attn.q/k/v/o_proj, mlp.gate/up/down_proj)")
    return layers


def _has(layer, name: str) -> bool:
    try:
        layer.get_submodule(name)
    except AttributeError:
        return False
    return True


def check_group(layers, group: int) -> None:
    widths = {layer.get_submodule(f"{p}.{m}").in_features for layer in layers[:1] for p, ms in UNITS.values() for m in ms}
    bad = sorted(w for w in widths if w % group)
    if bad:
        raise QuantkitError(f"--group {group} does not divide the {bad[0]} input columns of this model's linears")


def _logp(model, rows):
    import torch

    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=rows, use_cache=False).logits.float(), -1)


def _mean_kl(ref, logp) -> float:
    from quantkit.evals.stats import kl_full

    return float(kl_full(ref, logp).mean())


def _unit_modules(layer, unit: str) -> list:
    parent, members = UNITS[unit]
    return [layer.get_submodule(f"{parent}.{m}") for m in members]


def unit_kls(model, rows, units: list[str], group: int, progress=None, symmetric: bool = True) -> tuple[list[dict], dict]:
    """KL of each (layer, unit) quantized alone, against the unquantized model, on token rows; and
    the noise floor of that measurement (noise_floor). Each result's "kl" is the measured mean KL
    ("kl_measured") clamped at 0 - KL is never negative; a negative figure is float rounding - and
    "below_noise" says whether it cannot be told from rounding."""
    ref = _logp(model, rows)
    layers = decoder_layers(model)
    results = []
    for i, layer in enumerate(layers):
        for unit in units:
            mods = _unit_modules(layer, unit)
            saved = [m.weight.data for m in mods]
            for m in mods:
                m.weight.data = fake_int4(m.weight.data, group, symmetric)
            kl = _mean_kl(ref, _logp(model, rows))
            for m, w in zip(mods, saved):
                m.weight.data = w
            results.append({"layer": i, "unit": unit, "weights": sum(w.numel() for w in saved), "in_features": mods[0].in_features,
                            "kl_measured": kl, "kl": max(kl, 0.0)})
            if progress:
                progress(i, unit, kl)
    return results, noise_floor(model, rows, ref, layers, units, results)


def noise_floor(model, rows, ref, layers, units: list[str], results: list[dict]) -> dict:
    """Which measured KLs can be told from float rounding, on this model, rows and dtype; sets
    each result's "below_noise" (and, where it was needed, its own "noise_kl").

    A measurement's noise is the largest of: the KL of the unmodified model run again
    (nondeterministic kernels), the size of the most negative KL measured (KL >= 0, so a negative
    figure is rounding alone), and what recasting the unit's weights costs with no quantization at
    all - every weight one representable step of its dtype away, in a random direction. That last
    is measured once for every candidate unit at once (a bound on each unit's own); a unit whose KL
    falls under that bound gets its own measured too (one more forward pass each)."""
    repeat = abs(_mean_kl(ref, _logp(model, rows)))
    negative = max([-r["kl_measured"] for r in results] + [0.0])
    every = [m for layer in layers for unit in units for m in _unit_modules(layer, unit)]
    bound = max(repeat, negative, _rounding_kl(model, rows, ref, every))
    checked = 0
    for r in results:
        r["below_noise"] = False
        if r["kl_measured"] <= bound:
            r["noise_kl"] = max(repeat, negative, _rounding_kl(model, rows, ref, _unit_modules(layers[r["layer"]], r["unit"])))
            r["below_noise"] = r["kl_measured"] <= r["noise_kl"]  # an exact 0 with no noise: nothing to tell either
            checked += 1
    return {"kl": bound, "repeat_kl": repeat, "most_negative_kl": -negative if negative else 0.0, "units_checked_alone": checked,
            "method": "a KL above `kl` is measurable; below it, a unit is below the noise when its KL is at most its own "
                      "noise_kl: the largest of the model run twice, the most negative KL measured, and the KL of that "
                      "unit's weights moved one representable step (random direction; for `kl`: every unit's at once)"}


def _rounding_kl(model, rows, ref, mods: list) -> float:
    seeds = _one_step(mods)
    try:
        return abs(_mean_kl(ref, _logp(model, rows)))
    finally:
        _one_step(mods, seeds)  # back: nextafter's step undone exactly, no copy of the weights kept


def _one_step(mods: list, back: list | None = None) -> list:
    """Move each module's weights, in place, one representable value up or down (torch.nextafter);
    with `back` (the seeds this returned), undo it. Returns the per-module seeds."""
    import torch

    seeds = back or list(range(len(mods)))
    for m, seed in zip(mods, seeds):
        w = m.weight.data
        up = torch.randint(0, 2, w.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.bool).to(w.device)
        if back is not None:
            up = ~up
        target = torch.where(up, torch.tensor(float("inf"), dtype=w.dtype, device=w.device),
                             torch.tensor(float("-inf"), dtype=w.dtype, device=w.device))
        w.copy_(torch.nextafter(w, target))
    return seeds


def ranked(results: list[dict]) -> list[dict]:
    """Highest KL first; the units below the noise floor after them, tied, in layer order."""
    return sorted(results, key=lambda r: (r["below_noise"], -r["kl"] if not r["below_noise"] else 0.0, r["layer"], UNIT_ORDER[r["unit"]]))


def all_unit_weights(layers) -> int:
    return sum(layer.get_submodule(f"{p}.{m}").weight.numel() for layer in layers for p, ms in UNITS.values() for m in ms)
