"""`quantkit convert`: a recipe's variant -> a verified artifact directory."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, echo_json, json_option, set_option
from quantkit.cli.recipe_cmd import include_option
from quantkit.data.sources import syntaxes
from quantkit.methods.method_registry import names


@click.command("convert")
@click.argument("recipe_file", metavar="RECIPE")
@click.option(
    "--model",
    "model_ref",
    default=None,
    type=MODEL,
    help="Source checkpoint: a directory, a hub id, or 'demo' (default: the recipe's model).",
)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Artifact directory to create.")
@click.option(
    "--calib",
    default=None,
    help=f"Calibration text: {' | '.join(syntaxes())} (overrides the recipe).",
)
@click.option("--variant", default=None, help="Which variant of a suite recipe to convert.")
@click.option(
    "--force", is_flag=True, help="Replace an existing --out (only an artifact quantkit wrote, never an input)."
)
@click.option("--allow-pickle", is_flag=True, help="Accept .bin (pickle) checkpoints, which can run code on load.")
@click.option("--trust-remote-code", is_flag=True, help="Allow model code from the checkpoint (off by default).")
@click.option(
    "--max-memory",
    default=None,
    metavar="SIZE",
    help="RAM for the model's weights, e.g. 16GB (default: 75% of what is available). A larger model is offloaded "
    f"to disk beside --out and calibrated one layer at a time ({', '.join(names('layerwise'))}).",
)
@click.option(
    "--device",
    default=None,
    help="Calibration device: auto | cpu | cuda | cuda:N (default: the recipe's calibration.device, auto).",
)
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Print what the conversion will cost (memory, disk, time, offloading) from config.json and the safetensors "
    "headers, then exit without loading weights (exit 2 when it cannot fit).",
)
@set_option
@include_option
@json_option
def convert_cmd(
    recipe_file,
    model_ref,
    out,
    calib,
    variant,
    force,
    allow_pickle,
    trust_remote_code,
    max_memory,
    device,
    plan_only,
    overrides,
    include_dirs,
    as_json,
):
    """Convert a checkpoint with RECIPE into a verified, serving-ready artifact."""
    from quantkit.artifacts.staging import recipe_inputs
    from quantkit.core.atomic import sigterm_as_interrupt
    from quantkit.costs.commands import memory_warning
    from quantkit.models.offload import parse_size
    from quantkit.quantize.convert import convert
    from quantkit.quantize.job import ConvertOptions
    from quantkit.recipe.files import load_recipe

    recipe = load_recipe(recipe_file, overrides, include_dirs)
    opts = ConvertOptions(
        calib=calib,
        force=force,
        allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code,
        max_memory=parse_size(max_memory) if max_memory is not None else None,
        inputs=tuple(recipe_inputs(recipe_file)),
        device=device,
        memory_check=memory_warning,
    )
    if plan_only:
        from quantkit.cli._costs import show
        from quantkit.costs.commands import plan_convert

        return show(plan_convert(recipe, model_ref, Path(out), opts, variant), as_json)
    from quantkit.core.distributed import session

    with (
        sigterm_as_interrupt(),
        session(device or recipe.calibration.device) as runtime,
    ):  # `kill` cleans up like Ctrl-C
        # under torchrun every rank on its own device; rank 0 alone writes and prints
        opts.runtime, opts.device = runtime, runtime.device_spec(opts.device)
        meta = convert(recipe, model_ref, Path(out), opts, variant)
    if meta is None:  # a rank other than 0 of a torchrun conversion
        return
    if as_json:
        echo_json({"artifact": str(Path(out).resolve()), **meta})
        return
    v = meta["verification"]
    q = meta.get("quantization") or {}
    click.echo(f"wrote {out}")
    if q:
        click.echo(f"  {q.get('method')} {q.get('scheme')} -> {q.get('format')}")
    if meta.get("gqa"):
        g = meta["gqa"]
        click.echo(
            f"  gqa: {g['kv_heads_before']} -> {g['kv_heads_after']} KV heads, KV bytes/token "
            f"{g['kv_bytes_per_token_before']} -> {g['kv_bytes_per_token_after']}"
        )
    click.echo(
        f"  verified with {v['loader']}: mean KL {v['mean_kl']:.2e} (<= "
        f"{v['threshold_mean_kl']:g}), top-1 {v['top1_agreement'] * 100:.1f}%"
    )
    if meta.get("offload"):
        o = meta["offload"]
        click.echo(f"  offloaded: {o['disk_tensors']} tensors on disk, {o['cpu_bytes'] / 1e9:.2f} GB in RAM")
    click.echo(f"  {meta['wall_seconds']:.1f} s, peak RSS {meta['peak_rss_mb']:.0f} MB")


COMMANDS = [convert_cmd]
