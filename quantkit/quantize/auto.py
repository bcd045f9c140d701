"""Automatic mixed precision: which units of a model to raise above a quantize step's scheme
within a bits budget, measured and chosen on the model itself, written as the step's overrides.

`search` measures every candidate unit's KL at the base scheme (sensitivity.measure), and at each
choice either every unit (`quantkit sensitivity`'s table) or only the units a solution raises (a
recipe's `auto:` in convert, lazy_choice: the same choice, proved optimal, on fewer forwards);
it counts the bits of every decoder-layer linear exactly as the artifact will store them and
solves the budget (mixed.solve). Both commands run it on the same windows, so both choose the
same units from the same measurements.

The budget is over the decoder layers' linear weights, as models/sizes.py measures an artifact:
candidate units at their chosen scheme, the step's other quantized linears at its base scheme,
linears the step ignores at the checkpoint's precision. Measured before a rotation (a transform
step) when there is one: llm-compressor applies the rotation inside the quantize pass, and
measuring after it would mean rotating a copy of the model first; the rotation spreads outliers
within a unit, so it changes how much each unit loses more than which units lose most.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from quantkit.data import calib
from quantkit.data.text import shortfall
from quantkit.device import free_bytes
from quantkit.errors import QuantkitError, RecipeError, VerificationError
from quantkit.methods.method_registry import transform_step
from quantkit.methods.schemes import UNITS, Scheme
from quantkit.models.sizes import checkpoint_sizes
from quantkit.progress import bar, note
from quantkit.quantize.mixed import Unit, solve
from quantkit.quantize.preflight import is_ignored
from quantkit.quantize.sensitivity import (
    NoiseFloor,
    Reference,
    check_groups,
    decoder_layers,
    measure,
    ranked,
    unit_kls,
    working_set_bytes,
)

LAYERS_PATH = "model.layers"  # sensitivity.decoder_layers: model.model.layers


@dataclass(frozen=True)
class Search:
    """What a search chooses among and under which budget."""

    base: Scheme
    choices: tuple[Scheme, ...]
    units: tuple[str, ...]
    budget: float
    source_bits: int  # the artifact's precision of scales and of the linears left unquantized
    ignore: tuple[str, ...] = ("lm_head",)
    derived: dict | None = None  # a TPOT budget: how `budget` came from it (AutoMixed.bits_for)
    asked: float | None = None  # the budget as given, when it was above what the widest choices take (capped)

    @property
    def schemes(self) -> list[Scheme]:
        return [self.base, *self.choices]

    @classmethod
    def of_step(cls, quant, source_bits: int, cfg: dict) -> "Search":
        """A weight-only quantize step's `auto:` (validated when the recipe was read) on a model (its config)."""
        base = Scheme(quant.bits, quant.group_size, quant.symmetric)
        budget, derived = quant.auto.bits_for(cfg)
        return cls(
            base, tuple(quant.auto.schemes(base)[1:]), quant.auto.units, budget, source_bits, quant.ignore, derived
        )

    def capped(self, layers) -> "Search":
        """The budget at most what every unit at its widest choice takes on these layers: a budget
        beyond it buys nothing more (every unit is raised), and a TPOT budget every variant meets
        (1000 ms on a small model) would otherwise size the artifact at thousands of bits a weight."""
        top = ceiling_bits(layers, self)
        if self.budget <= top:
            return self
        return replace(self, budget=top, asked=self.budget)

    def budget_words(self) -> str:
        """The budget as the recipe gave it, for messages."""
        if self.derived is None:
            return f"budget_bits {self.budget:g}"
        d = self.derived
        return (
            f"budget_tpot_ms {d['budget_tpot_ms']:g} on {d['device']} at {d['context']} "
            f"cached tokens ({self.budget:.4f} bits/weight)"
        )


def _name(layer: int, sub: str) -> str:
    return f"{LAYERS_PATH}.{layer}.{sub}"


def candidates(layers, search: Search) -> list[tuple[int, str]]:
    """The (layer, unit) pairs the search may raise: every unit asked for that the step quantizes
    (ignore takes a fused unit whole or not at all: preflight.check_fused_shards)."""
    return [
        (i, u)
        for i in range(len(layers))
        for u in search.units
        if not any(is_ignored(_name(i, f"{UNITS[u][0]}.{m}"), search.ignore) for m in UNITS[u][1])
    ]


def accounting(layers, search: Search) -> tuple[dict, int, int]:
    """Each candidate's stored bits at each scheme, the stored bits of every other decoder-layer
    linear, and the weight count of all of them. Works on the meta skeleton (shapes only)."""

    schemes = search.schemes
    cands = candidates(layers, search)
    member = {(i, f"{UNITS[u][0]}.{m}"): (i, u) for i, u in cands for m in UNITS[u][1]}
    unit_bits = {c: [0] * len(schemes) for c in cands}
    other = total = 0
    for i, layer in enumerate(layers):
        for sub, mod in layer.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            o, n = mod.out_features, mod.in_features
            total += o * n
            key = member.get((i, sub))
            if key is not None:
                for j, s in enumerate(schemes):
                    unit_bits[key][j] += s.stored_bits(o, n, search.source_bits)
            elif is_ignored(_name(i, sub), search.ignore):
                other += o * n * search.source_bits
            else:
                other += search.base.stored_bits(o, n, search.source_bits)
    return {k: tuple(v) for k, v in unit_bits.items()}, other, total


def check(skeleton, search: Search, where: str) -> None:
    """Before loading, on the model's skeleton: Llama-style layers, every choice's group divides its
    units' columns, something to raise, and a budget every weight at the base scheme meets."""
    try:
        layers = decoder_layers(skeleton)
        check_groups(layers, search.schemes[1:], list(search.units))
    except QuantkitError as exc:
        raise RecipeError(f"{where}: {exc}") from None
    if not candidates(layers, search):
        raise RecipeError(
            f"{where}.units: every {', '.join(search.units)} unit of this model is in ignore; nothing to raise"
        )
    floor = floor_bits(layers, search)
    if search.budget < floor - 1e-12:
        raise RecipeError(
            f"{where}.{search.budget_words()}: below {floor:.4f} bits/weight, what this model's decoder "
            f"linears take at the base scheme {search.base.name}; raise it"
        )


def floor_bits(layers, search: Search) -> float:
    """Bits per weight of the decoder linears with every unit at the base scheme: the least budget."""
    unit_bits, other, total = accounting(layers, search)
    return (sum(b[0] for b in unit_bits.values()) + other) / total


def ceiling_bits(layers, search: Search) -> float:
    """Bits per weight of the decoder linears with every candidate unit at its widest choice: the
    most a budget can buy."""
    unit_bits, other, total = accounting(layers, search)
    return (sum(max(b) for b in unit_bits.values()) + other) / total


def raisable(layers, search: Search) -> int:
    """The most units one solution can raise: the cheapest raises first until the spare bits are
    spent. The lazy search measures the choices of about this many units (`--plan` counts them)."""
    unit_bits, other, total = accounting(layers, search)
    spare = search.budget * total - sum(b[0] for b in unit_bits.values()) - other
    n = 0
    for extra in sorted(min(b[j] - b[0] for j in range(1, len(b))) for b in unit_bits.values()):
        if extra > spare:
            break
        spare -= extra
        n += 1
    return n


def choose(results: list[dict], layers, search: Search) -> dict:
    """Solve the budget over the measured units; a unit whose base KL is below the noise gains
    nothing measurable from any choice, so it is never raised. Sets each result's "chosen"."""
    unit_bits, other, total = accounting(layers, search)
    measured = {(r["layer"], r["unit"]) for r in results}
    other += sum(
        b[0] for key, b in unit_bits.items() if key not in measured
    )  # a candidate not measured stays at the base
    names = [s.name for s in search.schemes]
    # a choice not measured (a lazy search) counts as costing nothing: what it can save is at most
    # the base's KL, so a solution that raises no unit at an unmeasured choice is the true optimum
    units = [
        Unit(
            r["layer"],
            r["unit"],
            r["weights"],
            unit_bits[(r["layer"], r["unit"])],
            tuple(r["kl"] for _ in names) if r["below_noise"] else tuple(r["kls"].get(n, 0.0) for n in names),
        )
        for r in results
    ]
    choice = solve(units, search.budget, total, other)
    for r, j in zip(results, choice.picked):
        r["chosen"] = names[j]
    picked = [
        {"layer": r["layer"], "unit": r["unit"], "scheme": r["chosen"]} for r, j in zip(results, choice.picked) if j
    ]
    return {
        "picked": picked,
        "bits_per_weight": choice.bits_per_weight,
        "kl_sum": choice.kl_sum,
        "overrides": overrides(picked, search.schemes[1:]),
    }


def overrides(picked: list[dict], choices: list[Scheme]) -> list[dict]:
    """One recipe override per (choice, unit type): a regex over whole units (all of q/k/v, both of gate/up)."""
    prefix = LAYERS_PATH.replace(".", "\\.")
    out = []
    for s in choices:
        for unit, (parent, members) in UNITS.items():
            chosen = sorted(p["layer"] for p in picked if p["unit"] == unit and p["scheme"] == s.name)
            if chosen:
                mods = members[0] if len(members) == 1 else f"({'|'.join(members)})"
                out.append(
                    {
                        "targets": [f"{prefix}\\.({'|'.join(map(str, chosen))})\\.{parent}\\.{mods}$"],
                        "bits": s.bits,
                        "group_size": s.group_size,
                        "symmetric": s.symmetric,
                    }
                )
    return out


def search(model, rows, spec: Search, label: str = "sensitivity", lazy: bool = False) -> dict:
    """Measure the candidate units on `rows` and choose within the budget. Every unit at every
    scheme (the explorer's table), or with `lazy` only what the choice needs (lazy_choice)."""
    layers = decoder_layers(model)
    pairs = candidates(layers, spec)
    with bar(label, total=len(layers)) as update:
        step = lambda i, unit, kl: update(i + 1, f"{label}: layer {i + 1}/{len(layers)} {unit}")  # noqa: E731
        if lazy:
            results, floor, chosen, rounds = lazy_choice(model, rows, layers, pairs, spec, step)
        else:
            results, floor = unit_kls(model, rows, pairs, spec.schemes, progress=step)
            chosen, rounds = choose(results, layers, spec), None
    measured = {
        "unit_forwards": sum(len(r["kls_measured"]) for r in results) + floor["units_checked_alone"],
        "units_at_every_scheme": sum(len(r["kls_measured"]) == len(spec.schemes) for r in results),
        **({"solves": rounds} if lazy else {}),
    }
    return {
        "budget_bits": spec.budget,
        **({"budget_asked_bits": spec.asked} if spec.asked is not None else {}),
        **({"budget_from": spec.derived} if spec.derived else {}),
        "metric": "kl",
        "base": spec.base.name,
        "choices": [s.name for s in spec.choices],
        "units": list(spec.units),
        "search": "lazy" if lazy else "every unit at every scheme",
        "measured": measured,
        "noise_floor": floor,
        "ranking": ranked(results),
        **chosen,
    }


def lazy_choice(model, rows, layers, pairs, spec: Search, progress=None):
    """The choice `search` makes with every unit measured at every scheme, measuring less: every
    unit at the base scheme, then solve with each unmeasured choice counted at KL 0 (it can save at
    most the base's KL) and each unit under the noise bound not yet checked counted as measurable;
    measure what that solution raises (its choices, its noise check) and solve again, until a
    solution raises only units whose figures are all measured. Each solve is of a relaxation (no
    unit's saving is smaller than its true one), so that last solution's summed KL is the least
    any choice reaches, as measured. Returns results, noise floor, choice, and the solves taken."""
    ref = Reference(model, rows, layers)
    results = []
    for i, unit in pairs:
        results.append(measure(ref, i, unit, [spec.base]))
        if progress:
            progress(i, unit, results[-1]["kl"])
    noise = NoiseFloor(ref, pairs)
    rounds = 0
    while True:
        floor = noise.settle(results, check=set())
        chosen = choose(results, layers, spec)
        rounds += 1
        base = spec.base.name
        need = [
            r
            for r in results
            if r["chosen"] != base and (r["below_noise"] is None or len(r["kls_measured"]) < len(spec.schemes))
        ]
        if not need:
            return results, floor, chosen, rounds
        for r in need:
            missing = [s for s in spec.schemes if s.name not in r["kls_measured"]]
            if missing:
                measure(ref, r["layer"], r["unit"], missing, result=r)
        noise.settle(results, check={(r["layer"], r["unit"]) for r in need})


# ---------------------------------------------------------------- in a conversion


def choose_overrides(job, model, sens) -> tuple[object, dict]:
    """Before the quantize step: measure and choose on the loaded model, on the windows `windows`
    built (`sens`), and return the step's config with the chosen overrides (auto cleared) and the
    record for quantkit.json."""

    t0 = time.perf_counter()
    quant = job.quant
    spec = Search.of_step(quant, job.source_bits, model.config.to_dict()).capped(decoder_layers(model))
    cs, short, built_s = sens
    device = pass_device(job, model, cs)
    with placed(model, device):
        out = search(model, torch.cat(cs.samples).to(device), spec, label="auto mixed precision", lazy=True)
    record = {
        **out,
        "windows": {
            "requested": quant.auto.windows,
            "used": len(cs.samples),
            "seq_len": quant.auto.seq_len,
            "note": short,
            "text": cs.manifest,
        },
        "measured_on": measured_on(job),
        "device": str(device),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "wall_seconds": built_s + time.perf_counter() - t0,
    }
    resolved = type(quant).model_validate({**quant.model_dump(), "auto": None, "overrides": out["overrides"]})
    capped = f", {spec.budget_words()} capped at what the widest choices take" if spec.asked is not None else ""
    note(
        f"auto mixed precision: {len(out['picked'])} of {len(out['ranking'])} units raised, "
        f"{out['bits_per_weight']:.4f} bits/weight (budget {spec.budget:g}{capped}), {record['wall_seconds']:.0f} s"
    )
    return resolved, record


def windows(job, tok, model, src_hash: str):
    """The sensitivity windows: the calibration source's own seeded windows in the calibration
    region, `auto.windows` of `auto.seq_len` tokens (the recipe's calibration.samples are GPTQ's).
    Built from the model as loaded, before any rotation: text it generates (a mix's chat part) is
    cached under its checkpoint's hash. Returns the set, the shortfall note, and the seconds taken."""

    t0 = time.perf_counter()
    auto, c = job.quant.auto, job.recipe.calibration
    cs = calib.build(
        job.src,
        tok,
        job.calib_spec,
        samples=auto.windows,
        seq_len=auto.seq_len,
        seed=c.seed,
        region=c.region,
        chat_template=c.chat_template,
        model=model,
        model_hash=src_hash,
    )
    short = shortfall(len(cs.samples), auto.windows, auto.seq_len, c.region, cs.manifest.get("stream_tokens"))
    if short:
        note(f"note: {job.key}: auto mixed precision: {short}; the choice rests on those")
    return cs, short, time.perf_counter() - t0


def measured_on(job) -> str:
    if transform_step(job.variant) is not None:
        return "the model after its rotation (the transform step fused into the weights first), before the rounding"
    return "the model as the quantize step receives it"


def pass_device(job, model, cs):
    """Where the pass runs: the calibration device when the model and the pass's working set fit
    there (llm-compressor's methods keep the model in RAM and calibrate a layer at a time on the
    device), else where the model is."""

    here = next(model.parameters()).device
    if job.device.type == "cpu" or here == job.device:
        return here
    p = next(model.parameters())
    cfg = model.config
    need = sum(t.numel() for t in model.parameters()) * p.element_size() + working_set_bytes(
        len(cs.samples) * job.quant.auto.seq_len,
        job.quant.auto.seq_len,
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        p.element_size(),
    )
    if need <= 0.9 * free_bytes(job.device):
        return job.device
    note(
        f"note: auto mixed precision: the model and its {need / 1e9:.1f} GB pass do not fit on "
        f"{job.device}; measuring where it is ({here})"
    )
    return here


@contextmanager
def placed(model, device):
    """The model on `device` for the pass, and back where it was afterwards."""
    home = next(model.parameters()).device
    if device != home:
        model.to(device)
    try:
        yield model
    finally:
        if device != home:
            model.to(home)


def check_measured(record: dict, artifact: Path) -> None:
    """The saved artifact's bits per weight (models/sizes.py, from its headers) against the budget
    and the solver's prediction; over the budget, the artifact is not written."""

    measured = checkpoint_sizes(artifact).bits_per_weight
    record["measured_bits_per_weight"] = measured
    if measured > record["budget_bits"] + 1e-9:
        raise VerificationError(
            f"auto mixed precision: the artifact takes {measured:.6f} bits/weight, over the budget of "
            f"{record['budget_bits']:g}; nothing was written"
        )
    if abs(measured - record["bits_per_weight"]) > 1e-6:
        note(
            f"note: auto mixed precision: the artifact takes {measured:.6f} bits/weight, the search counted "
            f"{record['bits_per_weight']:.6f}"
        )
