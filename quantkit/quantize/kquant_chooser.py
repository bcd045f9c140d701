"""`quantkit export CHECKPOINT --format gguf --type T --mixed`: every decoder-layer weight gets the
llama.cpp type, among the candidates (`--mixed-types`), that its estimated cost and the bytes of
T's own file allow. gguf/llama_quantize.py makes the F16 file and the importance matrix and runs
llama-quantize; this module is its chooser (llama_quantize.Chooser).

The cost of a weight W at a type is the KL of the next-token distribution that rounding W alone
adds, estimated with K-FAC (Martens & Grosse 2015, "Optimizing Neural Networks with
Kronecker-factored Approximate Curvature"): the Fisher information restricted to W is taken as
A ⊗ G, A the second moment of W's inputs and G that of the gradients of log p(y) at its outputs,
y drawn from the model's own distribution (the Fisher, not the empirical Fisher of the text's
tokens), so KL ≈ ½ tr(G ΔW A ΔWᵀ) per token. ΔW is llama-quantize's own rounding of W to that type
(one `--pure` file per candidate, with the same importance matrix, read back with the gguf
library). One forward and backward pass per window and draw measures every weight at every type,
where measuring each KL directly would take a forward pass per weight and type. The choice is
quantize/mixed.py's multiple-choice knapsack over the weights' bytes, within the bytes T's own file
gives the same weights; embeddings, the output and the norms keep T's types.

Once llama-quantize has written the chosen types, each weight's codes are chosen again by GPTQ
within the blocks' own scales (quantize/kquant_gptq.py, `refine`): same types, same bytes, less error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from quantkit.data import calib
from quantkit.errors import QuantkitError
from quantkit.gguf.grids import rope_unpermute
from quantkit.gguf.read import open_reader
from quantkit.gguf.type_report import LAYER_LINEAR
from quantkit.models.checkpoint import checkpoint_hash, load_model, load_tokenizer
from quantkit.progress import note
from quantkit.quantize import kquant_gptq
from quantkit.quantize.mixed import Unit, solve
from quantkit.recipe.schema import GGUF_MIXABLE

# ggml types a weight may take: llama-quantize makes each with --pure and the gguf library reads it back
# (one list: recipes' `mixed_types` are checked against it when read).
MIXABLE = GGUF_MIXABLE
DEFAULT_TYPES = ("IQ4_NL", "IQ4_XS", "Q3_K", "Q4_K", "Q5_0", "Q5_K", "Q6_K", "Q8_0")
WINDOWS, SEQ_LEN, DRAWS = (
    4,
    256,
    2,
)  # calibration windows of the measurement (auto mixed precision's defaults), label draws
# Weights that read the same input share its second moment A (GGUF names, llama.cpp's llama/qwen2 layers).
INPUT_OF = {
    "attn_q": "attn_in",
    "attn_k": "attn_in",
    "attn_v": "attn_in",
    "attn_output": "attn_output",
    "ffn_gate": "ffn_in",
    "ffn_up": "ffn_in",
    "ffn_down": "ffn_down",
}
STATS_BYTES = 2 << 30  # float32 A and G held at once; more layers than fit are measured in further passes
MARGIN_BYTES = 4096  # left for the header: the mixed file's metadata differs from T's by a few bytes


def parse_types(text: str) -> tuple[str, ...]:
    """`IQ4_NL,Q5_0,...` -> the ggml types, or one line naming the valid ones."""
    names = tuple(dict.fromkeys(t.strip().upper() for t in text.split(",") if t.strip()))
    bad = [t for t in names if t not in MIXABLE]
    if bad or not names:
        raise QuantkitError(
            f"--mixed-types {text!r}: {bad[0] + ' is ' if bad else ''}not a list of types a weight may take; "
            f"valid: {', '.join(MIXABLE)}"
        )
    return names


def admissible(row: int, types) -> list[str]:
    """The types whose blocks divide a row of `row` values (ggml quantizes each row in whole blocks)."""

    return [t for t in types if row % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]][0] == 0]


def kfac_cost(dw, a, g, tokens: int) -> float:
    """½ tr(G ΔW A ΔWᵀ) / tokens²: the KL per token that ΔW adds, with A = Σ x xᵀ over the tokens'
    inputs and G = Σ γ γᵀ over their output gradients (each already divided by the label draws)."""
    return 0.5 * float(((g @ dw) * (dw @ a)).sum()) / tokens**2


@dataclass(frozen=True)
class MixedChooser:
    """llama_quantize.Chooser: each weight's type among `types` (choose), then its codes by GPTQ (refine;
    `gptq=False` keeps llama-quantize's own rounding)."""

    types: tuple[str, ...]
    gptq: bool = True

    def choose(self, made) -> dict:
        return choose(made, self.types)

    def refine(self, made, path: Path, chosen: dict) -> dict:
        return refine(made, path, chosen) if self.gptq else chosen


def chooser(types: tuple[str, ...], gptq: bool = True) -> MixedChooser:
    """llama_quantize.Chooser for these candidate types."""
    return MixedChooser(types, gptq)


def choose(made, candidates: tuple[str, ...]) -> dict:
    """Measure every decoder-layer weight at every candidate type its rows admit, and choose within
    the bytes T's own file gives them. Returns {"types": every 2-D tensor's type, ...the record}."""

    t0 = time.perf_counter()
    note(f"export --type {made.qtype} --mixed: llama-quantize's own {made.qtype}, and each of {', '.join(candidates)}")
    ref = made.quantize("reference", made.qtype)
    files = {t: made.quantize(f"pure-{t}", t, pure=True) for t in candidates}
    ref_tensors = {t.name: t for t in open_reader(ref).tensors}
    weights = _weights(made, ref_tensors, candidates)
    if not weights:
        raise QuantkitError(
            f"--mixed-types {','.join(candidates)}: no block of these types divides the rows of this model's "
            "decoder-layer weights; add a 32-value type (Q5_0, Q8_0, IQ4_NL)"
        )
    pure = {t: {x.name: x for x in open_reader(f).tensors} for t, f in files.items()}
    options = {
        n: {t: f[n] for t, f in pure.items() if f[n].tensor_type.name == t} for n in weights
    }  # where the rows admit t
    budget = sum(_padded(ref_tensors[n].n_bytes) for n in weights) - MARGIN_BYTES
    _check_floor(options, budget)  # before the measurement: the bytes alone decide it
    costs, manifest = _measure(made, weights, options, ref_tensors)
    picked = _solve(weights, costs, budget)
    types = {n: t.tensor_type.name for n, t in ref_tensors.items() if len(t.shape) == 2} | picked
    return {
        "types": types,
        "reference_bytes": ref.stat().st_size,
        "budget_bytes": budget,
        "candidates": list(candidates),
        "method": "K-FAC estimate of each weight's KL at each type (quantize/kquant_chooser.py), "
        "multiple-choice knapsack over bytes (quantize/mixed.py)",
        "windows": [manifest],  # every text the choice was fitted on; refine adds GPTQ's
        "draws": DRAWS,
        "cost_reference": sum(costs[n]["reference"] for n in weights),
        "cost_chosen": sum(costs[n]["types"][picked[n]] for n in weights),
        "weights": [
            {
                "tensor": n,
                "type": picked[n],
                "cost": costs[n]["types"][picked[n]],
                "reference_type": ref_tensors[n].tensor_type.name,
                "reference_cost": costs[n]["reference"],
            }
            for n in weights
        ],
        "seconds": time.perf_counter() - t0,
    }


def _weights(made, ref_tensors: dict, candidates) -> dict[str, dict]:
    """The decoder-layer linear weights with at least one admissible candidate: source name, RoPE
    permutation and row length, from the F16 export's record."""

    out = {}
    for t in made.f16.tensors:
        name = t["name"]
        if LAYER_LINEAR.fullmatch(name) and name in ref_tensors:
            row = int(ref_tensors[name].shape[0])
            if admissible(row, candidates):
                out[name] = {"source": t["source"], "permute": t.get("rope_permuted_heads"), "row": row}
    return out


def _padded(n: int, align: int = 32) -> int:
    """A tensor's bytes in the file: each tensor's data starts at a multiple of general.alignment (32)."""
    return -(-int(n) // align) * align


def _check_floor(options: dict, budget: int) -> None:
    floor = sum(min(_padded(x.n_bytes) for x in opts.values()) for opts in options.values())
    if floor > budget:
        raise QuantkitError(
            f"--mixed-types: with every weight at its smallest candidate the layers take {floor} bytes, more "
            f"than the {budget} that --type's own file gives them; add a smaller type (IQ4_NL, IQ4_XS, Q4_K)"
        )


def _solve(weights: dict, costs: dict, budget: int) -> dict[str, str]:
    """The knapsack over bytes: each weight's options sorted by bytes (the cheapest is the base)."""

    names = list(weights)
    options = [sorted(costs[n]["types"], key=lambda t: costs[n]["bytes"][t]) for n in names]
    units = [
        Unit(i, n, 1, tuple(8 * costs[n]["bytes"][t] for t in opts), tuple(costs[n]["types"][t] for t in opts))
        for i, (n, opts) in enumerate(zip(names, options))
    ]
    choice = solve(units, 8 * budget / len(units), len(units))
    return {n: opts[j] for n, opts, j in zip(names, options, choice.picked)}


# ---------------------------------------------------------------- the measurement


def _measure(made, weights: dict, options: dict, ref_tensors: dict) -> tuple[dict, dict]:
    """{name: {"types": {type: cost}, "bytes": {type: bytes}, "reference": cost}} and the windows' manifest."""

    model = load_model(made.artifact, dtype="float32", device="cpu")
    rows, manifest = _windows(made, model)
    modules = {n: model.get_submodule(w["source"].removesuffix(".weight")) for n, w in weights.items()}
    costs = {}
    for group in _layer_groups(modules):
        note(f"export --mixed: Fisher statistics of {len(group)} weights over {rows.shape[0]} windows x {DRAWS} draws")
        a, g = fisher(model, rows, {n: modules[n] for n in group})
        for n in group:
            w0 = modules[n].weight.detach().to(torch.float32)

            def cost(t, n=n, w0=w0):
                return kfac_cost(_dequantized(t, weights[n]) - w0, a[_input(n)], g[n], rows.numel())

            costs[n] = {
                "types": {t: cost(x) for t, x in options[n].items()},
                "bytes": {t: _padded(x.n_bytes) for t, x in options[n].items()},
                "reference": cost(ref_tensors[n]),
            }
        a = g = None  # frees this group's statistics before the next fisher() (cost reads them by closure)
    return costs, manifest


def _windows(made, model, samples: int = WINDOWS, seq_len: int = SEQ_LEN):
    """`samples` windows of `seq_len` tokens from the export's calibration source, its seed and region."""

    o = made.options
    cs = calib.build(
        made.artifact,
        load_tokenizer(made.artifact),
        o.calib,
        samples=samples,
        seq_len=seq_len,
        seed=o.seed,
        region=o.region,
        chat_template=False,
        model=model,
        model_hash=checkpoint_hash(made.artifact),
    )
    m = cs.manifest
    return torch.cat(cs.samples), {  # sha256 and window_starts: what eval's overlap check compares
        "source": m.get("source"),
        "sha256": m.get("sha256"),
        "samples": m.get("samples"),
        "seq_len": m.get("seq_len"),
        "seed": m.get("seed"),
        "region": m.get("region"),
        "tokens": m.get("tokens"),
        "window_starts": m.get("window_starts"),
        **({"parts": m["parts"]} if m.get("parts") else {}),
    }


def _input(name: str) -> str:
    layer, kind = name.split(".")[1:3]
    return f"blk.{layer}.{INPUT_OF[kind]}"


def _layer_groups(modules: dict) -> list[list[str]]:
    """Weights in layer order, cut where the float32 statistics (A per input, G per weight) would pass STATS_BYTES."""
    groups, size, seen = [[]], 0, set()
    for n, m in modules.items():
        need = 4 * m.out_features**2 + (0 if _input(n) in seen else 4 * m.in_features**2)
        if groups[-1] and size + need > STATS_BYTES and n.split(".")[1] != groups[-1][-1].split(".")[1]:
            groups.append([])
            size, seen = 0, set()
        groups[-1].append(n)
        seen.add(_input(n))
        size += need
    return groups


def fisher(model, rows, modules: dict) -> tuple[dict, dict]:
    """K-FAC's factors over the windows `rows`: A[input] = Σ x xᵀ of each weight's inputs, G[weight] =
    Σ γ γᵀ of the gradients of Σ log p(y) at its outputs, y drawn from the model (seeded), averaged
    over DRAWS draws per window. The model's parameters are left without gradients."""

    a = {_input(n): torch.zeros(m.in_features, m.in_features) for n, m in modules.items()}
    g = {n: torch.zeros(m.out_features, m.out_features) for n, m in modules.items()}
    owners = {_input(n): n for n in reversed(list(modules))}  # the first weight reading an input adds its A
    first = {"draw": True}  # the inputs are the same in every draw: A from the first

    def hook(name):
        def forward(module, args, output):
            if first["draw"] and owners[_input(name)] == name:
                _accumulate(a[_input(name)], args[0])
            output.register_hook(lambda grad: _accumulate(g[name], grad))

        return forward

    for p in model.parameters():
        p.requires_grad_(False)
    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items()]
    gen = torch.Generator().manual_seed(0)
    try:
        with torch.enable_grad():
            for window in rows.split(1):
                for d in range(DRAWS):
                    first["draw"] = d == 0
                    _draw(model, window, gen).backward()
    finally:
        for h in handles:
            h.remove()
    for v in g.values():
        v.div_(DRAWS)
    return a, g


def _accumulate(acc, x) -> None:
    """acc += Σ over the tokens of x xᵀ; returns nothing, so as a gradient hook it leaves the gradient as it is."""
    x = x.detach().reshape(-1, x.shape[-1]).float()
    acc.add_(x.T @ x)


def _draw(model, window, gen):
    """Σ log p(y) over the window's positions, y drawn from the model's own next-token distribution."""

    emb = (
        model.get_input_embeddings()(window).detach().requires_grad_(True)
    )  # so every layer's output carries a gradient
    logits = model(inputs_embeds=emb, use_cache=False).logits.float()
    logp = torch.log_softmax(logits, -1).reshape(-1, logits.shape[-1])
    y = torch.multinomial(logp.detach().exp(), 1, generator=gen)
    return logp.gather(-1, y).sum()


def _dequantized(tensor, weight: dict):
    """A GGUF tensor as float32 in the checkpoint's layout (q/k rows back in transformers' order)."""

    w = torch.from_numpy(np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
    w = w.reshape(int(tensor.shape[1]), int(tensor.shape[0]))
    return rope_unpermute(w, weight["permute"]) if weight["permute"] else w


def describe(m: dict) -> str:
    """One line for the CLI of a choice's record (an export record's `mixed`): the candidates, the
    budget, the estimated KL of T's types and of the choice."""
    line = (
        f"types per tensor among {', '.join(m['candidates'])} within {m['budget_bytes'] / 1e6:.2f} MB of layers "
        f"(--type's own file {m['reference_bytes'] / 1e6:.2f} MB); estimated KL {m['cost_chosen']:.4f} "
        f"(--type's own types {m['cost_reference']:.4f}, K-FAC over {m['windows'][0]['samples']} windows)"
    )
    g = m.get("gptq")
    if g:
        line += (
            f"; codes by GPTQ over {g['windows']} windows: ‖ΔW X‖² × {g['proxy_after'] / g['proxy_before']:.2f} "
            "of llama-quantize's rounding"
        )
    return line


# ---------------------------------------------------------------- the codes (GPTQ)


def refine(made, path: Path, chosen: dict) -> dict:
    """GPTQ's codes for every decoder-layer weight of the file llama-quantize made with the chosen
    types (quantize/kquant_gptq.py), H over the calibration windows the importance matrix is made from."""
    t0 = time.perf_counter()
    o = made.options
    weights = {t["name"]: t for t in made.f16.tensors if LAYER_LINEAR.fullmatch(t["name"])}
    # bfloat16 forwards (H sums float32 products of the inputs; GPTQ damps it by 1% anyway): several times
    # faster than float32 on CPUs with bf16 dot products, as convert calibrates 4-bit recipes
    model = load_model(made.artifact, dtype="bfloat16", device="cpu")
    rows, manifest = _windows(made, model, o.samples, o.seq_len)
    modules = {n: model.get_submodule(w["source"].removesuffix(".weight")) for n, w in weights.items()}
    f16 = {t.name: t for t in open_reader(made.work / "f16.gguf").tensors if t.name in weights}
    per: dict = {}
    for group in _layer_groups(modules):
        note(f"export --mixed: inputs' second moments of {len(group)} weights over {rows.shape[0]} windows")
        h = second_moments(model, rows, {n: modules[n] for n in group})
        values = {n: _values(f16[n]) for n in group}
        per |= kquant_gptq.refine(path, {n: weights[n] for n in group}, values, h, _input)
        h = values = None
    tokens = rows.numel()
    summary = {
        "method": "GPTQ (Frantar et al. 2022) on each weight's own blocks, llama-quantize's scales kept "
        "(quantize/kquant_gptq.py)",
        "windows": manifest["samples"],
        "damp": kquant_gptq.DAMP,
        "act_order": "static",
        "proxy_before": sum(v["proxy_before"] for v in per.values()) / tokens,
        "proxy_after": sum(v["proxy_after"] for v in per.values()) / tokens,
        "seconds": time.perf_counter() - t0,
    }
    for w in chosen["weights"]:
        if w["tensor"] in per:
            w["proxy_ratio"] = per[w["tensor"]]["proxy_after"] / max(per[w["tensor"]]["proxy_before"], 1e-30)
    # every text a choice was fitted on, for eval's overlap guard (evals/checks.py reads a list of them)
    return chosen | {"gptq": summary, "windows": [*chosen["windows"], manifest]}


def _values(tensor) -> torch.Tensor:
    """A 16-bit GGUF tensor's values in the file's own row order, (rows, row length)."""
    w = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    return torch.from_numpy(w.reshape(int(tensor.shape[1]), int(tensor.shape[0])))


def second_moments(model, rows, modules: dict) -> dict:
    """H[input] = Σ x xᵀ of each weight's inputs over the windows `rows` (a forward pass each, no gradient)."""
    h = {_input(n): torch.zeros(m.in_features, m.in_features) for n, m in modules.items()}
    owners = {_input(n): n for n in reversed(list(modules))}

    def hook(name):
        def forward(module, args, output):
            if owners[_input(name)] == name:
                _accumulate(h[_input(name)], args[0])

        return forward

    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items() if owners[_input(n)] == n]
    try:
        with torch.no_grad():
            for window in rows.split(1):
                model.model(input_ids=window, use_cache=False)  # the decoder alone: no logits are needed
    finally:
        for handle in handles:
            handle.remove()
    return h
