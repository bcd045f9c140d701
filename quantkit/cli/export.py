"""`quantkit export ARTIFACT --format gguf`: an artifact in another serving format."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import echo_json, json_option


def _gguf(artifact: Path, out: Path | None, **opts) -> dict:
    from quantkit.gguf.exporter import GgufOptions, export_gguf

    return export_gguf(artifact, out, GgufOptions(**opts))


# Export formats by name (one entry per format; `quantkit run`'s `export: {formats: [...]}` uses the same names).
FORMATS = {"gguf": _gguf}


@click.command("export")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), required=True, help="Format to write.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write, with its record NAME.quantkit.json beside it (default: ARTIFACT.gguf beside the "
                   "artifact directory); never inside the artifact or the checkpoint it was converted from.")
@click.option("--embeddings", type=click.Choice(["keep", "q8_0"]), default="keep", show_default=True,
              help="token_embd/output: keep their 16 bits, or Q8_0 (lossy; its KL is measured).")
@click.option("--allow-lossy", is_flag=True,
              help="Map grids GGUF cannot hold exactly (group sizes not a multiple of 32, permuted act-order groups, "
                   "scales that are not fp16 values) with ggml's rounding, and report the KL instead of refusing.")
@click.option("--kl-text", default=None, metavar="SPEC",
              help="Text for a lossy export's KL (file:PATH, set:NAME, hf:...; default: seeded random token ids).")
@click.option("--force", is_flag=True, help="Replace an existing --out and its record, only when quantkit export wrote them.")
@json_option
def export_cmd(artifact, fmt, out, embeddings, allow_lossy, kl_text, force, as_json):
    """Export a quantkit ARTIFACT (compressed-tensors INT4/INT8 or 16-bit) for llama.cpp, exactly where grids match.

    An artifact quantkit converted must still match its sha256 manifest, as for publish."""
    record = FORMATS[fmt](artifact, out, embeddings=embeddings, allow_lossy=allow_lossy, force=force, kl_text=kl_text)
    if as_json:
        echo_json(record)
        return
    click.echo(f"wrote {record['gguf']} ({record['bytes'] / 1e6:.1f} MB, {record['architecture']})")
    for m in record["mapping"]:
        click.echo(f"  {m['tensors']:4d} x {m['mapping']}{'' if m['exact'] else '  [not exact]'}")
    v = record["verification"]
    if record["lossless"]:
        click.echo(f"  lossless: {v['exact_tensors']} tensors dequantized by gguf equal the artifact's weights "
                   f"(max abs diff {v['max_abs_diff_exact']:g})")
    else:
        kl = record["kl_vs_artifact"]
        click.echo(f"  LOSSY: {len(record['lossy_tensors'])} tensors; KL vs the artifact {kl['mean_kl']:.3g} mean, "
                   f"{kl['max_kl']:.3g} max, top-1 {kl['top1_agreement'] * 100:.2f}% ({kl['text']})")
    for note in record["notes"]:
        click.echo(f"  note: {note}")


COMMANDS = [export_cmd]
