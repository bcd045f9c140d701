"""How much each unit's rounding costs: the KL of the model with one vLLM-fusable unit of one
layer rounded to a scheme, against the unquantized model, on token rows.

For every decoder layer and each unit vLLM serves as one kernel (q/k/v fused as qkv_proj,
gate/up as gate_up_proj, o_proj, down_proj), round that unit alone (RTN through compressed-tensors'
own quantizer) to the base scheme and to each option, and measure the mean KL of the next-token
distribution against the FP model. The layers before the unit's own give what they gave in the
reference pass, so each measurement runs the model from the unit's layer on (half the layers on
average) and equals a full forward. quantize/mixed.py then chooses the units to raise within a
bits budget; units are never split (vLLM refuses a fused layer whose shards differ:
preflight.check_fused_shards).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from quantkit.errors import QuantkitError
from quantkit.methods.llmc import weight_args
from quantkit.methods.schemes import UNITS, Scheme

UNIT_ORDER = {unit: i for i, unit in enumerate(UNITS)}
# Bytes of one forward's float32 tokens x vocabulary temporaries (logits, their shifted copy,
# logsumexp's, the product: 16 bytes per token and vocabulary entry): windows go through the model
# in chunks that keep them under this, beside the reference the pass keeps.
CHUNK_BYTES = 512 << 20


def chunk_windows(seq_len: int, vocab: int) -> int:
    """Windows per forward: as many as fit CHUNK_BYTES of temporaries, at least one."""
    return max(1, CHUNK_BYTES // (16 * vocab * seq_len))


def fake_quant(w, scheme: Scheme):
    """RTN of a weight to `scheme`: compressed-tensors' own min-max qparams and fake quantizer,
    per group or (group -1) per output channel, computed in float32."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = weight_args(scheme.bits, scheme.group_size, scheme.symmetric)
    x = w.float()
    if scheme.group_size == -1:
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    else:
        g = x.reshape(x.shape[0], -1, scheme.group_size)
        lo, hi = g.amin(-1), g.amax(-1)
    scale, zp = calculate_qparams(lo, hi, args)
    return fake_quantize(x, scale, zp, args).to(w.dtype)


def decoder_layers(model):
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or len(layers) == 0:
        raise QuantkitError(
            "sensitivity: the model has no model.layers list of decoder layers (Llama, Mistral, Qwen2 style)"
        )
    missing = [f"{p}.{m}" for p, ms in UNITS.values() for m in ms if not _has(layers[0], f"{p}.{m}")]
    if missing:
        raise QuantkitError(
            f"sensitivity: decoder layer 0 has no {', '.join(missing)}; it knows Llama-style layers "
            "(self_attn.q/k/v/o_proj, mlp.gate/up/down_proj)"
        )
    return layers


def _has(layer, name: str) -> bool:
    try:
        layer.get_submodule(name)
    except AttributeError:
        return False
    return True


def check_groups(layers, schemes: list[Scheme], units: list[str]) -> None:
    """Every scheme's group divides the input columns of every candidate unit's linears."""
    for s in schemes:
        for unit in units:
            for m in unit_modules(layers[0], unit):
                if s.group_size > 0 and m.in_features % s.group_size:
                    raise QuantkitError(
                        f"{s.name}: group {s.group_size} does not divide the {m.in_features} input columns "
                        f"of this model's {unit} unit"
                    )


def _logits(model, rows):
    with torch.inference_mode():
        return model(input_ids=rows, use_cache=False).logits


def kl_terms(p, psum, shift, logits):
    """Per-token KL(p || softmax(logits)) less the reference's own Σ p·log p (computed once,
    `Reference`): Σ p·(log p - log q) = Σ p·log p - Σ p·(logits - c) + Σp·(logsumexp(logits) - c)
    for any c per token, with Σp as float32 summed it (not quite 1). Each forward costs a
    logsumexp and a product per token instead of a log-softmax, an exp and a product; c (`shift`,
    the reference's logsumexp) keeps the summed terms small: on the demo's logits each token's KL
    is within 4e-6 of float64's (evals.stats.kl_full in float32: 1.2e-5; without c: 1.4e-5; a
    batched-matmul dot through einsum: 9e-3)."""

    x = logits.to(torch.float32, copy=True).sub_(shift.unsqueeze(-1))  # one float32 copy, never the caller's tensor
    return psum * torch.logsumexp(x, -1) - (p * x).sum(-1)


def unit_modules(layer, unit: str) -> list:
    parent, members = UNITS[unit]
    return [layer.get_submodule(f"{parent}.{m}") for m in members]


class Reference:
    """The unquantized model's log-probabilities on the rows (in chunks: chunk_windows), and each
    decoder layer's output on each chunk, so a forward with a unit of layer i changed can start
    at layer i (`kl(start=i)`): the layers before it return what they returned here."""

    def __init__(self, model, rows, layers):
        self.model, self.layers, self.tokens = model, layers, rows.numel()
        self.chunks = list(rows.split(chunk_windows(rows.shape[1], model.config.vocab_size)))
        self.outputs: list[list] = []  # [chunk][layer]: the layer's output as it returned it
        # per chunk: the reference's probabilities, and per token Σ p, Σ p·log p and its logsumexp
        self.p, self.psum, self.plogp, self.shift = [], [], [], []
        hooks = [layer.register_forward_hook(self._keep) for layer in layers]
        try:
            for chunk in self.chunks:
                self.outputs.append([])
                x = _logits(model, chunk).float()
                self.shift.append(torch.logsumexp(x, -1))
                logp = x - self.shift[-1].unsqueeze(-1)
                del x
                self.p.append(logp.exp())
                self.psum.append(self.p[-1].sum(-1))
                self.plogp.append((self.p[-1] * logp).sum(-1))
                del logp
        finally:
            for h in hooks:
                h.remove()

    def _keep(self, module, args, output) -> None:
        self.outputs[-1].append(output)

    def kl(self, start: int = 0) -> float:
        """Mean KL(reference || model as it is now) over every token, running layers `start` on.
        The tokens' KLs are summed in float64: a float32 sum over threads would depend on their
        count, and with it which units a budget raises (tests/test_methods_determinism.py)."""
        total = 0.0
        for c, chunk in enumerate(self.chunks):
            with _starting_at(self.layers, start, self.outputs[c][start - 1] if start else None):
                per_token = self.plogp[c] + kl_terms(self.p[c], self.psum[c], self.shift[c], _logits(self.model, chunk))
                total += float(per_token.double().sum())
        return total / self.tokens


@contextmanager
def _starting_at(layers, start: int, output):
    """Layers before `start` return `output` (layer start-1's output in the reference pass) without
    computing: the model's own forward then runs from layer `start`, its masks and rotary
    embeddings made as always. A forward already set on a layer (an offloading hook) is put back."""
    saved = [layers[j].__dict__.get("forward") for j in range(start)]
    for j in range(start):
        layers[j].forward = lambda *args, _out=output, **kwargs: _out
    try:
        yield
    finally:
        for j, forward in enumerate(saved):
            if forward is None:
                del layers[j].forward
            else:
                layers[j].forward = forward


def unit_kls(
    model, rows, pairs: list[tuple[int, str]], schemes: list[Scheme], progress=None
) -> tuple[list[dict], dict]:
    """KL of each (layer, unit) in `pairs` rounded alone to each scheme (the base first), against
    the unrounded model, on token rows; and the noise floor of that measurement (noise_floor).
    Each result's "kls" (scheme name -> KL) holds the measured mean KLs ("kls_measured") clamped
    at 0 - KL is never negative; a negative figure is float rounding - and "kl" / "kl_measured"
    the base scheme's; "below_noise" says whether the base's cannot be told from rounding."""
    layers = decoder_layers(model)
    ref = Reference(model, rows, layers)
    results = []
    for i, unit in pairs:
        results.append(measure(ref, i, unit, schemes))
        if progress:
            progress(i, unit, results[-1]["kl"])
    return results, noise_floor(ref, pairs, results)


def measure(ref: "Reference", layer: int, unit: str, schemes: list[Scheme], result: dict | None = None) -> dict:
    """The unit rounded alone to each of `schemes` (the base first when `result` is None; with
    `result`, a unit measured before, the schemes it lacks are added to it)."""
    mods = unit_modules(ref.layers[layer], unit)
    measured = _unit_kls(ref, layer, mods, schemes)
    if result is None:
        base = measured[schemes[0].name]
        result = {
            "layer": layer,
            "unit": unit,
            "weights": sum(m.weight.numel() for m in mods),
            "in_features": mods[0].in_features,
            "kl_measured": base,
            "kl": max(base, 0.0),
            "kls_measured": {},
            "kls": {},
        }
    result["kls_measured"].update(measured)
    result["kls"].update({k: max(v, 0.0) for k, v in measured.items()})
    return result


def _unit_kls(ref: Reference, layer: int, mods: list, schemes: list[Scheme]) -> dict[str, float]:
    """The unit's modules rounded to each scheme in turn, each a forward from its layer on; the
    weights are put back exactly (the original tensors, never a copy)."""
    saved = [m.weight.data for m in mods]
    out = {}
    try:
        for s in schemes:
            for m, w in zip(mods, saved):
                m.weight.data = fake_quant(w, s)
            out[s.name] = ref.kl(start=layer)
    finally:
        for m, w in zip(mods, saved):
            m.weight.data = w
    return out


NOISE_METHOD = (
    "a KL above `kl` is measurable; below it, a unit is below the noise when its KL is at most its own "
    "noise_kl: the largest of the model run twice, the most negative KL measured, and the KL of that "
    "unit's weights moved one representable step (random direction; for `kl`: every unit's at once)"
)


def noise_floor(ref: Reference, pairs: list[tuple[int, str]], results: list[dict]) -> dict:
    """Which measured base KLs can be told from float rounding (NoiseFloor), every unit under the bound checked."""
    return NoiseFloor(ref, pairs).settle(results)


class NoiseFloor:
    """Which measured base KLs can be told from float rounding, on this model, rows and dtype.

    A measurement's noise is the largest of: the KL of the unmodified model run again
    (nondeterministic kernels), the size of the most negative KL measured (KL >= 0, so a negative
    figure is rounding alone), and what recasting the unit's weights costs with no quantization at
    all - every weight one representable step of its dtype away, in a random direction. That last
    is measured once for every candidate unit at once (a bound on each unit's own); a unit whose KL
    falls under that bound gets its own measured too (one more forward pass each), when `settle`
    is asked to check it."""

    def __init__(self, ref: Reference, pairs: list[tuple[int, str]]):
        self.ref = ref
        self.repeat = abs(ref.kl())
        every = [m for i, unit in pairs for m in unit_modules(ref.layers[i], unit)]
        self.every = _rounding_kl(ref, every, 0)
        self.own: dict[tuple[int, str], float] = {}  # (layer, unit) -> its own weights' one-step KL

    def settle(self, results: list[dict], check=None) -> dict:
        """Set each result's "below_noise" (and "noise_kl" where its own was measured). A unit under
        the bound is checked alone when `check` is None or holds its (layer, unit); one not
        checked gets below_noise None (not known; a search treats it as measurable)."""
        negative = max([-v for r in results for v in r["kls_measured"].values()] + [0.0])
        bound = max(self.repeat, negative, self.every)
        for r in results:
            key = (r["layer"], r["unit"])
            r.pop("noise_kl", None)
            if r["kl_measured"] > bound:
                r["below_noise"] = False
                continue
            if key not in self.own and (check is None or key in check):
                self.own[key] = _rounding_kl(self.ref, unit_modules(self.ref.layers[r["layer"]], r["unit"]), r["layer"])
            if key in self.own:
                r["noise_kl"] = max(self.repeat, negative, self.own[key])
                r["below_noise"] = r["kl_measured"] <= r["noise_kl"]  # an exact 0 with no noise: nothing to tell either
            else:
                r["below_noise"] = None
        return {
            "kl": bound,
            "repeat_kl": self.repeat,
            "most_negative_kl": -negative if negative else 0.0,
            "units_checked_alone": len(self.own),
            "units_under_bound_unchecked": sum(r["below_noise"] is None for r in results),
            "method": NOISE_METHOD,
        }


def _rounding_kl(ref: Reference, mods: list, start: int) -> float:
    seeds = _one_step(mods)
    try:
        return abs(ref.kl(start))
    finally:
        _one_step(mods, seeds)  # back: nextafter's step undone exactly, no copy of the weights kept


def _one_step(mods: list, back: list | None = None) -> list:
    """Move each module's weights, in place, one representable value up or down (torch.nextafter);
    with `back` (the seeds this returned), undo it. Returns the per-module seeds."""

    seeds = back or list(range(len(mods)))
    for m, seed in zip(mods, seeds):
        w = m.weight.data
        up = torch.randint(0, 2, w.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.bool).to(w.device)
        if back is not None:
            up = ~up
        target = torch.where(
            up,
            torch.tensor(float("inf"), dtype=w.dtype, device=w.device),
            torch.tensor(float("-inf"), dtype=w.dtype, device=w.device),
        )
        w.copy_(torch.nextafter(w, target))
    return seeds


def working_set_bytes(tokens: int, seq_len: int, vocab: int, hidden: int, layers: int, itemsize: int) -> int:
    """What the pass holds beside the model: the reference's float32 probabilities of every token
    and each layer's output on every token (Reference), and one chunk's logits with their float32
    copy and logsumexp temporary (kl_terms); the reference's own pass adds a log-softmax."""
    chunk = min(tokens, chunk_windows(seq_len, vocab) * seq_len)
    return 4 * tokens * vocab + itemsize * layers * tokens * hidden + chunk * vocab * (itemsize + 16)


def ranked(results: list[dict]) -> list[dict]:
    """Highest KL first; the units below the noise floor after them, tied, in layer order."""
    return sorted(
        results,
        key=lambda r: (
            r["below_noise"] is True,
            0.0 if r["below_noise"] else -r["kl"],
            r["layer"],
            UNIT_ORDER[r["unit"]],
        ),
    )
