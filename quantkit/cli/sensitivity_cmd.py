"""`quantkit sensitivity`: which vLLM-fusable units to raise above INT4 within a bits-per-weight
budget, chosen as a recipe's `auto:` chooses them (quantize/auto.py)."""

from __future__ import annotations

import click

from quantkit.cli._common import MODEL, echo_json, json_option
from quantkit.data.sources import syntaxes
from quantkit.methods.schemes import UNITS


def _units(text: str) -> list[str]:
    from quantkit.errors import QuantkitError

    units = [u.strip() for u in text.split(",") if u.strip()]
    bad = [u for u in units if u not in UNITS]
    if not units or bad:
        raise QuantkitError(f"--units {text!r}: give a comma-separated subset of {','.join(UNITS)}")
    return list(dict.fromkeys(units))


def _search(cfg: dict, group: int, symmetric: bool, choices: str, units: list[str], budget: float):
    from quantkit.errors import QuantkitError
    from quantkit.methods.schemes import Scheme, raising
    from quantkit.quantize.auto import Search
    from quantkit.quantize.job import source_dtype

    base = Scheme(4, group, symmetric)
    try:
        options = raising(base, [c.strip() for c in choices.split(",") if c.strip()] or [""])
    except QuantkitError as exc:
        raise QuantkitError(f"--choices {choices!r}: {exc}") from None
    return Search(base, tuple(options), tuple(units), budget, 8 * source_dtype(cfg).itemsize)


def _check_model(src, spec, trust_remote_code: bool, seq_len: int | None = None):
    """On the meta skeleton, before loading: Llama-style layers, every group divides its units'
    widths, a budget the base scheme meets, windows no longer than the model's context."""
    from quantkit.errors import QuantkitError
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.auto import floor_bits
    from quantkit.quantize.preflight import check_context, meta_model
    from quantkit.quantize.sensitivity import check_groups, decoder_layers

    cfg = read_config(src)
    if seq_len is not None:
        check_context(cfg, seq_len, "--seq-len")
    layers = decoder_layers(meta_model(cfg, trust_remote_code))
    try:
        check_groups(layers, spec.schemes, list(spec.units))
    except QuantkitError as exc:
        raise QuantkitError(f"--group/--choices: {exc}") from None
    floor = floor_bits(layers, spec)
    if not floor - 1e-12 <= spec.budget <= 16:
        raise QuantkitError(
            f"--budget {spec.budget}: between {floor:.6g} (every unit {spec.base.name}) and 16 bits per weight"
        )


def _spinquant(text: str | None, cfg: dict):
    """--spinquant R1,R2: the transform step a recipe would have (random Hadamard, as the shipped
    recipes), checked on the model's config like a recipe's; None without the option."""
    if not text:
        return None
    from pydantic import ValidationError

    from quantkit.errors import QuantkitError
    from quantkit.methods import rotation
    from quantkit.recipe.schema import TransformStepConfig

    try:
        step = TransformStepConfig(
            method="spinquant",
            rotations=tuple(r.strip() for r in text.split(",") if r.strip()),
            transform_type="random-hadamard",
        )
    except ValidationError as exc:
        raise QuantkitError(f"--spinquant {text}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    rotation.check(cfg, step, "--spinquant")
    return step


def analyse(
    model_ref: str,
    text: str,
    budget: float,
    units: list[str],
    group: int,
    windows: int,
    seq_len: int,
    seed: int,
    trust_remote_code: bool,
    device_spec: str = "auto",
    dtype: str = "float32",
    symmetric: bool = True,
    choices: str = "int8",
    spinquant: str | None = None,
) -> dict:
    import torch

    from quantkit.data import calib
    from quantkit.data.text import shortfall
    from quantkit.device import resolve_device
    from quantkit.models.checkpoint import checkpoint_hash, load_model, load_tokenizer, read_config
    from quantkit.models.resolve import resolve_path
    from quantkit.progress import note
    from quantkit.quantize.auto import search

    device = resolve_device(device_spec)  # an unavailable device: one line, before anything loads
    src = resolve_path(model_ref)
    spec = _search(read_config(src), group, symmetric, choices, units, budget)
    _check_model(src, spec, trust_remote_code, seq_len)
    transform = _spinquant(spinquant, read_config(src))
    calib.check_source(text, "--text")
    tok = load_tokenizer(src)
    model = load_model(src, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    # generated text (`self`, a mix's chat part) is cached under the checkpoint's hash: built before any rotation
    cs = calib.build(
        src,
        tok,
        text,
        samples=windows,
        seq_len=seq_len,
        seed=seed,
        region="second-half",
        chat_template=False,
        model=model,
        model_hash=checkpoint_hash(src),
    )
    if transform is not None:  # as convert does before auto: the pass measures the rotated weights
        from quantkit.methods.llmc import rotate

        model = rotate(model, transform, device)
    short = shortfall(len(cs.samples), windows, seq_len, "second-half", cs.manifest.get("stream_tokens"))
    if short:
        note(f"note: --text {text}: {short}; the ranking rests on those")
    out = search(model, torch.cat(cs.samples).to(device), spec)
    return {
        "model": str(src),
        "text": cs.manifest,
        "device": str(device),
        "dtype": dtype,
        "group_size": group,
        "symmetric": symmetric,
        "rotations": list(transform.rotations) if transform is not None else [],
        "windows": {"requested": windows, "used": len(cs.samples), "seq_len": seq_len, "note": short},
        **out,
        "chosen_on": chosen_on(cs.manifest),  # beside the overrides in a recipe (ChosenOn)
    }


def chosen_on(text: dict) -> dict:
    """The windows' record a recipe's `chosen_on:` takes (methods/configs.py ChosenOn)."""
    keys = ("source", "sha256", "seq_len", "seed", "region", "window_starts")
    parts = [chosen_on(p) for p in text.get("parts") or [] if isinstance(p, dict)]
    return {k: text[k] for k in keys if text.get(k) is not None} | ({"parts": parts} if parts else {})


def render(out: dict, top: int) -> str:
    import yaml

    t = out["text"]
    floor = out["noise_floor"]["kl"]
    names = [out["base"], *out["choices"]]
    lines = [
        f"RTN sensitivity of {out['model']} ({out['base']} and each choice, one "
        "unit at a time): mean KL against the model "
        f"itself, {t.get('samples')} x {t.get('seq_len')} tokens of "
        f"{t.get('source')} ({t.get('region', 'second-half')})",
        f"{'rank':>4}  {'layer':>5}  {'unit':<8}  "
        + "  ".join(f"{n:>14}" for n in names)
        + f"  {'weights':>9}  chosen",
    ]
    for i, r in enumerate(out["ranking"][:top], 1):
        rank = "=" if r["below_noise"] else str(i)
        kls = [f"≤{r['noise_kl']:.1e}" if r["below_noise"] and n == out["base"] else _kl(r["kls"][n]) for n in names]
        lines.append(
            f"{rank:>4}  {r['layer']:>5}  {r['unit']:<8}  "
            + "  ".join(f"{k:>14}" for k in kls)
            + f"  {r['weights']:>9,}  {r['chosen']}"
        )
    noisy = sum(r["below_noise"] for r in out["ranking"])
    lines.append(
        f"# noise: a KL above {floor:.1e} is measurable (above what moving every unit's weights one representable "
        "step does); KL is never negative, so a negative figure (float rounding) counts as 0"
    )
    if noisy:
        lines.append(
            f"# {noisy} units ('=') cannot be told from rounding (their KL is under what moving their own weights one "
            "step does): tied, unranked, never raised"
        )
    if out["windows"]["note"]:
        lines.append(f"# {out['windows']['note']}")
    lines.append(
        f"# {len(out['picked'])} units raised: {out['bits_per_weight']:.4f} "
        f"bits/weight (budget {out['budget_bits']:g}); "
        "a recipe's `auto:` with this budget, these units and choices picks the same on the same windows"
    )
    if out["overrides"]:
        lines.append("# under steps[0].quantize of an INT4 recipe, for this model alone (chosen_on: the windows")
        lines.append("# they were chosen on, which eval then refuses to score the artifact on):")
        lines.append(
            yaml.safe_dump(
                {"overrides": out["overrides"], "chosen_on": chosen_on(out["text"])},
                sort_keys=False,
                default_flow_style=None,
                width=1000,
            ).rstrip()
        )
    else:
        lines.append("# the budget leaves no room to raise a unit: no overrides")
    return "\n".join(lines)


def _kl(x: float) -> str:
    """Four decimals where they show the figure; scientific notation for smaller ones (never '-0.0000')."""
    return f"{x:.4f}" if x >= 1e-3 or x == 0 else f"{x:.2e}"


@click.command("sensitivity")
@click.argument("model", type=MODEL)
@click.option(
    "--budget",
    type=float,
    required=True,
    help="Average bits per weight over the decoder linears (all INT4 g64: 4.25; asymmetric: 4.3125).",
)
@click.option(
    "--choices",
    default="int8",
    show_default=True,
    help="Schemes a unit may be raised to, comma-separated: int8 (per channel), "
    "int4-g32, int4-g32-asym, int8-g128, ...",
)
@click.option(
    "--text",
    "text",
    required=True,
    help=f"Calibration text SPEC ({', '.join(syntaxes())}); its second half is read.",
)
@click.option(
    "--units", "units_text", default=",".join(UNITS), show_default=True, help="Candidate units (vLLM's fused kernels)."
)
@click.option("--group", default=64, show_default=True, type=int, help="INT4 group size the recipe will use.")
@click.option(
    "--asymmetric",
    is_flag=True,
    help="The recipe's INT4 is asymmetric (symmetric: false): round with a zero point, "
    "and count its 4 bits per group in the budget.",
)
@click.option(
    "--windows",
    default=4,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Calibration windows (auto:'s default).",
)
@click.option(
    "--seq-len",
    default=256,
    show_default=True,
    type=click.IntRange(8, 1 << 16),
    help="Tokens per window (auto:'s default).",
)
@click.option(
    "--spinquant",
    metavar="R1,R2",
    default=None,
    help="Fuse SpinQuant's offline rotations (random Hadamard) into the weights first, as a recipe's transform step "
    "does before auto: measures.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--top", default=20, show_default=True, type=click.IntRange(1), help="Ranking rows printed (--json has all)."
)
@click.option(
    "--device",
    "device_spec",
    default="auto",
    show_default=True,
    help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one).",
)
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="Precision of the model and of its reference logits (bfloat16 halves the memory of a large model).",
)
@click.option("--trust-remote-code", is_flag=True)
@json_option
def sensitivity_cmd(
    model,
    budget,
    choices,
    text,
    units_text,
    group,
    asymmetric,
    windows,
    seq_len,
    spinquant,
    seed,
    top,
    device_spec,
    dtype,
    trust_remote_code,
    as_json,
):
    """Rank each layer's q/k/v, o, gate/up and down by the KL their INT4 rounding costs, measure
    each choice's too, and print the units a recipe's `auto:` would raise within --budget bits per
    weight (and the `overrides:` that pin that choice for this model)."""
    from quantkit.errors import QuantkitError

    if group not in (32, 64, 128):
        raise QuantkitError(f"--group {group}: one of 32, 64, 128")
    out = analyse(
        model,
        text,
        budget,
        _units(units_text),
        group,
        windows,
        seq_len,
        seed,
        trust_remote_code,
        device_spec,
        dtype,
        symmetric=not asymmetric,
        choices=choices,
        spinquant=spinquant,
    )
    if as_json:
        echo_json(out)
    else:
        click.echo(render(out, top))


COMMANDS = [sensitivity_cmd]
