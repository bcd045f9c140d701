"""`quantkit export ARTIFACT --format F`: an artifact in a serving format, by the exporter registry's
entry for F (export/export_registry.py); every option reaches the exporter in one ExportSettings."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, echo_json, json_option
from quantkit.data.sources import syntaxes
from quantkit.errors import QuantkitError
from quantkit.export.export_registry import exporter_for, formats
from quantkit.export.exporter import ExportSettings
from quantkit.quantize.kquant_chooser import DEFAULT_TYPES as DEFAULT_MIXED


class FormatChoice(click.Choice):
    """--format's choices: the exporter registry's formats (export/export_registry.py) when the command runs."""

    def __init__(self):
        super().__init__(formats())

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(formats())

    @choices.setter
    def choices(self, value) -> None:  # always the registry's
        pass


@click.command("export")
@click.argument("artifact", type=MODEL)
@click.option("--format", "fmt", type=FormatChoice(), required=True, help="Format to write.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="File to write, with its record NAME.quantkit.json beside it (default: ARTIFACT.gguf beside the "
    "artifact directory; for compressed-tensors, the directory ARTIFACT.compressed-tensors); never inside the "
    "artifact or the checkpoint it was converted from.",
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
    help=f"Text for a lossy export's KL ({' | '.join(syntaxes(parts=False, generated=False))}; the first four "
    "128-token windows of its first half; default: seeded random token ids).",
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
    """Export a quantkit ARTIFACT in a serving format: gguf for llama.cpp (compressed-tensors INT4/INT8, MXFP4,
    NVFP4 or 16-bit, exactly where grids match; with --type, a 16-bit checkpoint in llama.cpp's own types), or
    compressed-tensors (the artifact itself, copied and checked).

    An artifact quantkit converted must still match its sha256 manifest, as for publish."""
    from quantkit.models.resolve import resolve_model

    for option, value in (("--mixed-types", mixed_types), ("--mixed-rounding", mixed_rounding)):
        if value is not None and not mixed:
            raise QuantkitError(f"{option} applies with --mixed")
    found = resolve_model(artifact, check=False)  # the export checks an artifact against its manifest first
    settings = ExportSettings(
        embeddings=embeddings,
        allow_lossy=allow_lossy,
        kl_text=kl_text,
        qtype=qtype,
        calib=calib,
        samples=calib_samples,
        seq_len=calib_seq_len,
        mixed=(mixed_types or ",".join(DEFAULT_MIXED)) if mixed else None,
        mixed_gptq=mixed_rounding != "llama-quantize",
        force=force,
    )
    exporter = exporter_for(fmt, settings)
    exporter.check(settings)
    if out is not None and out.is_dir() and not exporter.directory:
        raise QuantkitError(f"--out {out} is a directory; --format {fmt} writes a file: name it")
    if out is None and found.named:  # a named model lives in the cache: its export goes to the working directory
        out = Path.cwd() / exporter.out_name(found.named, settings)
    record = exporter.export(found.path, out, settings)
    if as_json:
        echo_json(record)
        return
    for line in exporter.summary(record):
        click.echo(line)


COMMANDS = [export_cmd]
