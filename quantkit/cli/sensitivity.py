"""`quantkit sensitivity`: which vLLM-fusable units to keep at INT8 within a bits-per-weight budget."""

from __future__ import annotations

import click

from quantkit.cli._common import echo_json, json_option

UNIT_NAMES = ("qkv", "o", "gate_up", "down")


def _units(text: str) -> list[str]:
    from quantkit.errors import QuantkitError

    units = [u.strip() for u in text.split(",") if u.strip()]
    bad = [u for u in units if u not in UNIT_NAMES]
    if not units or bad:
        raise QuantkitError(f"--units {text!r}: give a comma-separated subset of {','.join(UNIT_NAMES)}")
    return list(dict.fromkeys(units))


def _check_model(src, group: int, budget: float, trust_remote_code: bool, symmetric: bool = True, seq_len: int | None = None):
    """On the meta skeleton, before loading: Llama-style layers, the group divides every width, a
    sane budget, windows no longer than the model's context."""
    from quantkit.errors import QuantkitError
    from quantkit.models.checkpoint import read_config
    from quantkit.quantize.preflight import check_context, meta_model
    from quantkit.quantize.sensitivity import check_group, decoder_layers, int4_bits

    cfg = read_config(src)
    if seq_len is not None:
        check_context(cfg, seq_len, "--seq-len")
    layers = decoder_layers(meta_model(cfg, trust_remote_code))
    check_group(layers, group)
    base = int4_bits(group, symmetric)
    if not base <= budget <= 16:
        kind = "" if symmetric else " asymmetric"
        raise QuantkitError(f"--budget {budget}: between {base:g} (every unit INT4 g{group}{kind}) and 16 bits per weight")


def analyse(model_ref: str, text: str, budget: float, units: list[str], group: int, windows: int, seq_len: int,
            seed: int, trust_remote_code: bool, device_spec: str = "auto", dtype: str = "float32", symmetric: bool = True) -> dict:
    from quantkit.data import calib
    from quantkit.device import resolve
    from quantkit.models.checkpoint import checkpoint_hash, load_model, load_tokenizer, resolve_model
    from quantkit.progress import bar, note
    from quantkit.quantize.sensitivity import all_unit_weights, decoder_layers, greedy_pick, overrides, ranked, unit_kls
    from quantkit.data.text import shortfall

    device = resolve(device_spec)  # an unavailable device: one line, before anything loads
    src = resolve_model(model_ref)
    _check_model(src, group, budget, trust_remote_code, symmetric, seq_len)
    calib.check_source(text, "--text")
    tok = load_tokenizer(src)
    model = load_model(src, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    digest = checkpoint_hash(src) if text.strip() == "self" else ""
    cs = calib.build(src, tok, text, samples=windows, seq_len=seq_len, seed=seed, region="second-half",
                     chat_template=False, model=model, model_hash=digest)
    short = shortfall(len(cs.samples), windows, seq_len, "second-half", cs.manifest.get("stream_tokens"))
    if short:
        note(f"note: --text {text}: {short}; the ranking rests on those")
    import torch

    rows = torch.cat(cs.samples).to(device)
    layers = decoder_layers(model)
    with bar("sensitivity", total=len(layers)) as update:
        results, floor = unit_kls(model, rows, units, group, symmetric=symmetric,
                                  progress=lambda i, unit, kl: update(i + 1, f"sensitivity: layer {i + 1}/{len(layers)} {unit}"))
    picked, bpw = greedy_pick(results, all_unit_weights(layers), group, budget, symmetric)
    return {"model": str(src), "text": cs.manifest, "device": str(device), "dtype": dtype, "group_size": group, "symmetric": symmetric,
            "budget": budget, "units": units,
            "windows": {"requested": windows, "used": len(cs.samples), "seq_len": seq_len, "note": short},
            "noise_floor": floor, "ranking": ranked(results),
            "picked": [{"layer": r["layer"], "unit": r["unit"]} for r in picked], "bits_per_weight": bpw,
            "overrides": overrides(picked)}


def render(out: dict, top: int) -> str:
    import yaml

    t = out["text"]
    kind = "" if out["symmetric"] else " asymmetric"
    floor = out["noise_floor"]["kl"]
    lines = [f"INT4 RTN g{out['group_size']}{kind} sensitivity of {out['model']}: mean KL against the model itself, "
             f"{t.get('samples')} x {t.get('seq_len')} tokens of {t.get('source')} ({t.get('region', 'second-half')})",
             f"{'rank':>4}  {'layer':>5}  {'unit':<8}  {'KL':>9}  {'weights':>9}"]
    for i, r in enumerate(out["ranking"][:top], 1):
        rank, kl = ("=", f"≤{r['noise_kl']:.1e}") if r["below_noise"] else (str(i), _kl(r["kl"]))
        lines.append(f"{rank:>4}  {r['layer']:>5}  {r['unit']:<8}  {kl:>9}  {r['weights']:>9,}")
    noisy = sum(r["below_noise"] for r in out["ranking"])
    lines.append(f"# noise: a KL above {floor:.1e} is measurable (above what moving every unit's weights one representable "
                 "step does); KL is never negative, so a negative figure (float rounding) counts as 0")
    if noisy:
        lines.append(f"# {noisy} units ('=') cannot be told from rounding (their KL is under what moving their own weights one "
                     "step does): tied, unranked, never picked for INT8")
    if out["windows"]["note"]:
        lines.append(f"# {out['windows']['note']}")
    lines.append(f"# {len(out['picked'])} units at INT8 per channel: {out['bits_per_weight']:.3f} bits/weight (budget {out['budget']:g})")
    if out["overrides"]:
        lines.append("# under steps[0].quantize of an INT4 recipe:")
        lines.append(yaml.safe_dump({"overrides": out["overrides"]}, sort_keys=False, default_flow_style=None, width=1000).rstrip())
    else:
        lines.append("# the budget leaves no room for an INT8 unit: no overrides")
    return "\n".join(lines)


def _kl(x: float) -> str:
    """Four decimals where they show the figure; scientific notation for smaller ones (never '-0.0000')."""
    return f"{x:.4f}" if x >= 1e-3 or x == 0 else f"{x:.2e}"


@click.command("sensitivity")
@click.argument("model")
@click.option("--budget", type=float, required=True, help="Average bits per weight over the decoder linears (all INT4 g64: 4.25; asymmetric: 4.3125).")
@click.option("--text", "text", required=True, help="Calibration text SPEC (file:PATH, set:NAME, mix:NAME, hf:..., self); its second half is read.")
@click.option("--units", "units_text", default=",".join(UNIT_NAMES), show_default=True, help="Candidate units (vLLM's fused kernels).")
@click.option("--group", default=64, show_default=True, type=int, help="INT4 group size the recipe will use.")
@click.option("--asymmetric", is_flag=True, help="The recipe's INT4 is asymmetric (symmetric: false): round with a zero point, "
              "and count its 4 bits per group in the budget.")
@click.option("--windows", default=4, show_default=True, type=click.IntRange(1, 1024), help="Calibration windows.")
@click.option("--seq-len", default=512, show_default=True, type=click.IntRange(8, 1 << 16))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--top", default=20, show_default=True, type=click.IntRange(1), help="Ranking rows printed (--json has all).")
@click.option("--device", "device_spec", default="auto", show_default=True, help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one).")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]),
              help="Precision of the model and of its reference logits (bfloat16 halves the memory of a large model).")
@click.option("--trust-remote-code", is_flag=True)
@json_option
def sensitivity_cmd(model, budget, text, units_text, group, asymmetric, windows, seq_len, seed, top, device_spec, dtype, trust_remote_code,
                    as_json):
    """Rank each layer's q/k/v, o, gate/up and down by the KL their INT4 rounding costs, and print
    the recipe `overrides:` that keep the most sensitive at INT8 within --budget bits per weight."""
    from quantkit.errors import QuantkitError

    if group not in (32, 64, 128):
        raise QuantkitError(f"--group {group}: one of 32, 64, 128")
    out = analyse(model, text, budget, _units(units_text), group, windows, seq_len, seed, trust_remote_code, device_spec, dtype,
                  symmetric=not asymmetric)
    if as_json:
        echo_json(out)
    else:
        click.echo(render(out, top))


COMMANDS = [sensitivity_cmd]
