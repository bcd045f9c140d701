"""`quantkit export ARTIFACT --format gguf`: an artifact in another serving format."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, echo_json, json_option
from quantkit.errors import QuantkitError
from quantkit.quantize.ggufmix import DEFAULT_TYPES as DEFAULT_MIXED  # no torch at import: --help stays fast


def _gguf(
    artifact: Path,
    out: Path | None,
    qtype: str | None = None,
    calib: dict | None = None,
    mixed: str | None = None,
    gptq: bool = True,
    **opts,
) -> dict:
    from quantkit.gguf.exporter import GgufOptions, export_gguf

    if mixed is not None and qtype is None:
        raise QuantkitError(
            "--mixed chooses among llama.cpp's types within --type's size; give --type (e.g. --type Q4_K_M)"
        )
    if qtype is None:
        return export_gguf(artifact, out, GgufOptions(**opts))
    from quantkit.gguf.kquant import KquantOptions, check_type, export_kquant

    check_type(qtype)  # an unknown type is named before the other options are looked at
    lossy = [
        f
        for f, v in (
            ("--embeddings q8_0", opts["embeddings"] != "keep"),
            ("--allow-lossy", opts["allow_lossy"]),
            ("--kl-text", opts["kl_text"]),
        )
        if v
    ]
    if lossy:
        raise QuantkitError(
            f"{lossy[0]} applies to the exact export; with --type, llama-quantize chooses every tensor's type"
        )
    chooser = None
    if mixed is not None:
        from quantkit.quantize.ggufmix import chooser as mixed_chooser
        from quantkit.quantize.ggufmix import parse_types

        chooser = mixed_chooser(parse_types(mixed), gptq=gptq)
    return export_kquant(artifact, out, KquantOptions(qtype=qtype, force=opts["force"], **(calib or {})), chooser)


# Export formats by name (one entry per format; `quantkit run`'s `export: {formats: [...]}` uses the same names).
FORMATS = {"gguf": _gguf}


@click.command("export")
@click.argument("artifact", type=MODEL)
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), required=True, help="Format to write.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write, with its record NAME.quantkit.json beside it (default: ARTIFACT.gguf beside the "
    "artifact directory); never inside the artifact or the checkpoint it was converted from.",
)
@click.option(
    "--embeddings",
    type=click.Choice(["keep", "q8_0"]),
    default="keep",
    show_default=True,
    help="token_embd/output: keep their 16 bits, or Q8_0 (lossy; its KL is measured).",
)
@click.option(
    "--allow-lossy",
    is_flag=True,
    help="Map grids GGUF cannot hold exactly (group sizes not a multiple of 32, permuted act-order groups, "
    "scales that are not fp16 values) with ggml's rounding, and report the KL instead of refusing.",
)
@click.option(
    "--kl-text",
    default=None,
    metavar="SPEC",
    help="Text for a lossy export's KL (file:PATH, set:NAME, hf:...; default: seeded random token ids).",
)
@click.option(
    "--type",
    "qtype",
    default=None,
    metavar="TYPE",
    help="llama.cpp's own quantization of a 16-bit checkpoint (Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, Q4_0, ...): the "
    "exact F16 GGUF, an importance matrix from --calib's windows (llama-imatrix), then llama-quantize. "
    "Needs llama.cpp's tools (QUANTKIT_WITH_LLAMA_TOOLS=1 ./scripts/_install.sh).",
)
@click.option(
    "--calib",
    default="mix:default",
    show_default=True,
    metavar="SPEC",
    help="With --type: the calibration text whose windows make the importance matrix (as convert's --calib).",
)
@click.option(
    "--calib-samples", type=click.IntRange(min=1), default=128, show_default=True, help="With --type: windows."
)
@click.option(
    "--calib-seq-len",
    type=click.IntRange(min=8),
    default=512,
    show_default=True,
    help="With --type: tokens per window.",
)
@click.option(
    "--mixed",
    is_flag=True,
    help="With --type: each decoder-layer weight gets the type, among --mixed-types, that its estimated KL "
    "(K-FAC over 4 calibration windows of 256 tokens) and --type's own file size allow, then its codes by "
    "GPTQ within llama-quantize's block scales (over the --calib windows); the file is no larger than --type "
    "alone makes.",
)
@click.option(
    "--mixed-types",
    default=None,
    metavar="TYPES",
    help="With --mixed: the types a weight may take, comma-separated (default: " + ",".join(DEFAULT_MIXED) + ").",
)
@click.option(
    "--mixed-rounding",
    type=click.Choice(["gptq", "llama-quantize"]),
    default=None,
    help="With --mixed: each weight's codes by GPTQ within llama-quantize's block scales (default), or "
    "llama-quantize's own rounding.",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing --out and its record, only when quantkit export wrote them."
)
@json_option
def export_cmd(
    artifact,
    fmt,
    out,
    embeddings,
    allow_lossy,
    kl_text,
    qtype,
    calib,
    calib_samples,
    calib_seq_len,
    mixed,
    mixed_types,
    mixed_rounding,
    force,
    as_json,
):
    """Export a quantkit ARTIFACT (compressed-tensors INT4/INT8 or 16-bit) for llama.cpp, exactly where grids match;
    with --type, quantize a 16-bit checkpoint with llama.cpp's own types.

    An artifact quantkit converted must still match its sha256 manifest, as for publish."""
    from quantkit.models.resolve import resolve

    for option, value in (("--mixed-types", mixed_types), ("--mixed-rounding", mixed_rounding)):
        if value is not None and not mixed:
            raise QuantkitError(f"{option} applies with --mixed")
    found = resolve(artifact, check=False)  # the export checks an artifact against its manifest first
    if out is None and found.named:  # a named model lives in the cache: its GGUF goes to the working directory
        out = Path.cwd() / f"{found.named}.{qtype or 'gguf'}{'.gguf' if qtype else ''}"
    artifact = found.path
    calib_opts = {"calib": calib, "samples": calib_samples, "seq_len": calib_seq_len}
    record = FORMATS[fmt](
        artifact,
        out,
        qtype=qtype,
        calib=calib_opts,
        mixed=(mixed_types or ",".join(DEFAULT_MIXED)) if mixed else None,
        gptq=mixed_rounding != "llama-quantize",
        embeddings=embeddings,
        allow_lossy=allow_lossy,
        force=force,
        kl_text=kl_text,
    )
    if as_json:
        echo_json(record)
        return
    if record.get("gguf_type"):
        _echo_kquant(record)
        return
    click.echo(f"wrote {record['gguf']} ({record['bytes'] / 1e6:.1f} MB, {record['architecture']})")
    for m in record["mapping"]:
        click.echo(f"  {m['tensors']:4d} x {m['mapping']}{'' if m['exact'] else '  [not exact]'}")
    v = record["verification"]
    if record["lossless"]:
        click.echo(
            f"  lossless: {v['exact_tensors']} tensors dequantized by gguf equal the artifact's weights "
            f"(max abs diff {v['max_abs_diff_exact']:g})"
        )
    else:
        kl = record["kl_vs_artifact"]
        click.echo(
            f"  LOSSY: {len(record['lossy_tensors'])} tensors; KL vs the artifact {kl['mean_kl']:.3g} mean, "
            f"{kl['max_kl']:.3g} max, top-1 {kl['top1_agreement'] * 100:.2f}% ({kl['text']})"
        )
    for note in record["notes"]:
        click.echo(f"  note: {note}")


def _echo_kquant(record: dict) -> None:
    im = record["imatrix"]
    click.echo(
        f"wrote {record['gguf']} ({record['bytes'] / 1e6:.1f} MB, {record['gguf_type']}, "
        f"{record['bits_per_weight_layers']:.2f} bits/weight in the decoder layers, "
        f"{record['bits_per_weight']:.2f} overall)"
    )
    click.echo("  tensor types: " + ", ".join(f"{n} x {t}" for t, n in record["tensor_types"].items()))
    if im:
        click.echo(
            f"  importance matrix: llama-imatrix over {im['calibration'].get('samples')} windows of "
            f"{im['chunk_tokens']} tokens from {im['calibration'].get('source')} (sha256 {im['sha256'][:12]})"
        )
    if record.get("mixed"):
        from quantkit.quantize.ggufmix import describe

        click.echo(f"  {describe(record)}")
    for note in record["notes"]:
        click.echo(f"  note: {note}")


COMMANDS = [export_cmd]
