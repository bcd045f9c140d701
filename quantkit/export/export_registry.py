"""The exporters, by name: every serving format `quantkit export --format` writes and a recipe's
`export: {formats: [...]}` names. Adding one is a module with an Exporter subclass (export/exporter.py)
and one line here.

Several exporters may write one format: `--format gguf` is the exact export unless `--type` is
given, which picks llama-quantize's (an exporter's `selected_by`). What each takes of each scheme is
its `takes`; the docs table of them (docs/ARCHITECTURE.md, which a test holds equal to it) is
`capability_table()`.
"""

from __future__ import annotations

from quantkit.errors import QuantkitError, RecipeError
from quantkit.export.compressed_tensors import CompressedTensors
from quantkit.export.exporter import Exporter, ExportSettings
from quantkit.export.gguf_exact import GgufExact
from quantkit.export.gguf_kquant import GgufKquant
from quantkit.models import scheme_facts as sf

EXPORTERS: dict[str, Exporter] = {
    "compressed-tensors": CompressedTensors(),
    "gguf": GgufExact(),
    "gguf-kquant": GgufKquant(),
}


def formats() -> list[str]:
    """The formats `--format` and export.formats take, each once."""
    return sorted({e.format for e in EXPORTERS.values()})


def exporter_for(fmt: str, settings: ExportSettings = ExportSettings()) -> Exporter:
    """The exporter that writes `fmt` with these settings: one whose `selected_by` setting is given,
    else the format's own. An unknown format is one line listing the valid ones."""
    found = [e for e in EXPORTERS.values() if e.format == fmt]
    if not found:
        raise QuantkitError(f"unknown export format {fmt!r}; valid: {', '.join(formats())}")
    picked = [e for e in found if e.selected_by and getattr(settings, e.selected_by) is not None]
    return (picked or [e for e in found if e.selected_by is None])[0]


def check_formats(names, where: str = "export.formats") -> None:
    """A recipe's export formats are ones an exporter writes (RecipeError naming the key otherwise)."""
    for i, name in enumerate(names):
        if name not in formats():
            raise RecipeError(f"{where}[{i}]: unknown export format {name!r}; valid: {', '.join(formats())}")


# The schemes the docs table shows, one per kind quantkit writes or reads (models/scheme_facts.py).
SCHEMES: tuple[tuple[str, sf.SchemeFacts], ...] = (
    ("16-bit", sf.DENSE),
    ("INT4 symmetric, group 128", sf.int_weights(4, 128, True)),
    ("INT4 asymmetric, group 128", sf.int_weights(4, 128, False)),
    ("INT4 symmetric, group 48", sf.int_weights(4, 48, True)),
    ("INT8 per channel", sf.int_weights(8, -1, True)),
    ("INT8 W8A8, dynamic activations", sf.int_weights(8, -1, True, ("int", 8, True))),
    ("FP8 per channel, dynamic activations", sf.fp8_weights(True)),
    ("MXFP4", sf.MXFP4),
    ("NVFP4", sf.NVFP4),
    ("bitsandbytes NF4", sf.bnb_4bit("nf4", False)),
    ("bitsandbytes LLM.int8()", sf.LLM_INT8),
)


def capability_table(exporters: dict[str, Exporter] | None = None) -> str:
    """What each exporter does with each scheme, as a markdown table (docs/ARCHITECTURE.md)."""
    exporters = EXPORTERS if exporters is None else exporters
    names = list(exporters)
    lines = [
        "| scheme | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, facts in SCHEMES:
        cells = []
        for n in names:
            v = exporters[n].takes(facts)
            cells.append(f"{v.kind}: {v.reason}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| exporter | `--format` | writes |", "|---|---|---|"]
    for n in names:
        e = exporters[n]
        how = f" when `{e.selected_by}` is given" if e.selected_by else ""
        lines.append(f"| `{n}` | `{e.format}`{how} | {e.writes} |")
    return "\n".join(lines) + "\n"
