"""`quantkit export ARTIFACT --format F`: an artifact in a serving format, by the exporter registry's
entry for F (export/export_registry.py); every option reaches the exporter in one ExportSettings."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli._common import MODEL, echo_json, json_option
from quantkit.cli._options import settings_from_cli, settings_options
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
@settings_options(ExportSettings)  # the export's own options: export/exporter.py
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
@json_option
def export_cmd(artifact, fmt, out, mixed, mixed_types, mixed_rounding, as_json, **options):
    """Export a quantkit ARTIFACT in a serving format: gguf for llama.cpp (compressed-tensors INT4/INT8, MXFP4,
    NVFP4 or 16-bit, exactly where grids match; with --type, a 16-bit checkpoint in llama.cpp's own types), or
    compressed-tensors (the artifact itself, copied and checked).

    An artifact quantkit converted must still match its sha256 manifest, as for publish."""
    from quantkit.models.resolve import resolve_model

    for option, value in (("--mixed-types", mixed_types), ("--mixed-rounding", mixed_rounding)):
        if value is not None and not mixed:
            raise QuantkitError(f"{option} applies with --mixed")
    settings = settings_from_cli(
        ExportSettings,
        options,
        mixed=(mixed_types or ",".join(DEFAULT_MIXED)) if mixed else None,
        mixed_gptq=mixed_rounding != "llama-quantize",
    )
    found = resolve_model(artifact, check=False)  # the export checks an artifact against its manifest first
    exporter = exporter_for(fmt, settings)
    exporter.check(settings)
    if out is not None and out.is_dir() and not exporter.directory:
        raise QuantkitError(f"--out {out} is a directory; --format {fmt} writes a file: name it")
    if out is None and found.named:  # a named model lives in the cache: its export goes to the working directory
        out = Path.cwd() / exporter.out_name(found.named, settings)
    record = exporter.export(found.path, out, settings)
    if as_json:
        echo_json(record.to_json())
        return
    for line in exporter.summary(record):
        click.echo(line)


COMMANDS = [export_cmd]
