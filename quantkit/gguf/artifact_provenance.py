"""What quantkit export reads of an artifact's quantkit.json (written by `quantkit convert`): the
checkpoint it was converted from (`source`), which --out may never lie inside (target.py); what
eval's baseline and overlap checks read of it, which the GGUF carries in its header (`Origin`,
read.py); and its name and quantization, which the export record names (gguf_records.py).

quantkit.json is the artifact's own file, not a record of this package: it is read by key here, in
one place, and the exporters build their records from what these functions return.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.gguf.read import Origin


def recorded_source(meta: dict) -> Path | None:
    """The checkpoint an artifact was converted from, as its quantkit.json records it."""
    src = meta.get("source") if isinstance(meta, dict) else None
    path = src.get("path") if isinstance(src, dict) else None
    return Path(path) if isinstance(path, str) and path else None


def export_origin(meta: dict, own: str) -> Origin:
    """The checkpoint the artifact (of checkpoint hash `own`) was converted from (quantkit.json
    `source.sha256`; a checkpoint without one is its own origin), the artifact's own hash, and what
    eval's baseline and overlap checks read from quantkit.json (the source, the calibration and GQA
    recovery windows)."""

    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    recorded = source.get("sha256") if isinstance(source.get("sha256"), str) else None
    if recorded is None:
        return Origin(own, own, None)
    recover = ((meta.get("gqa") or {}).get("recover") or {}) if isinstance(meta.get("gqa"), dict) else {}
    mixed = meta.get("mixed_precision") if isinstance(meta.get("mixed_precision"), dict) else {}
    steps = (meta.get("recipe") or {}).get("steps") if isinstance(meta.get("recipe"), dict) else None
    provenance = {
        "source": {"path": source.get("path"), "sha256": recorded},
        "base_model": meta.get("base_model"),
        "calibration": meta.get("calibration"),
        "gqa": {"recover": {"windows": recover.get("windows")}},
        "mixed_precision": {"windows": {"text": (mixed.get("windows") or {}).get("text")}},
        "recipe": {"steps": [_chosen_on(st) for st in steps] if isinstance(steps, list) else []},
    }
    return Origin(recorded, own, provenance)


def _chosen_on(step) -> dict:
    """A recipe step as eval's overlap check reads it: the text its overrides were chosen on."""
    quant = step.get("quantize") if isinstance(step, dict) else None
    return {"quantize": {"chosen_on": quant.get("chosen_on")}} if isinstance(quant, dict) else {}


def converted_path(origin: Origin) -> str | None:
    """The path of the checkpoint converted from, as `export_origin`'s provenance names it (None
    where the artifact records no conversion)."""
    return ((origin.provenance or {}).get("source") or {}).get("path")


def described(meta: dict) -> tuple[str | None, dict | None]:
    """The artifact's name and quantization, as its quantkit.json gives them (None for a checkpoint without one)."""
    return meta.get("name"), meta.get("quantization")
