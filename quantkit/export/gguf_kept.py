"""What a run keeps of a GGUF's export record, read once as a typed record: the exact export's
(export/gguf_exact.py `kept`) or llama-quantize's (export/gguf_kquant.py `kept`, also a `gguf:`
variant's, pipeline/serving.py). The run stores the kept JSON as the exporter wrote it; its readers
(the report's row, the front's point, the llama.cpp engines' source) take it through this record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantkit.core.record_checks import RecordError


@dataclass(frozen=True)
class GgufKept:
    path: Path  # the GGUF file
    sha256: str | None = None
    bytes: int | None = None
    gguf_type: str | None = None  # llama-quantize's --type; None: the exact export (the artifact's own grid)
    bits_per_weight_layers: float | None = None  # the decoder layers' bits per weight (llama-quantize's)
    fallback_types: dict = field(default_factory=dict)  # tensors llama-quantize gave a 32-block type instead
    mixed: dict | None = None  # --mixed's choice, summarised

    @classmethod
    def from_json(cls, kept: dict, where: str = "GGUF record") -> GgufKept:
        if not isinstance(kept, dict) or not isinstance(kept.get("gguf"), str):
            raise RecordError(f"{where}: a GGUF export's record names its file under 'gguf'")
        return cls(
            path=Path(kept["gguf"]),
            sha256=kept.get("sha256"),
            bytes=kept.get("bytes"),
            gguf_type=kept.get("gguf_type"),
            bits_per_weight_layers=kept.get("bits_per_weight_layers"),
            fallback_types=dict(kept.get("fallback_types") or {}),
            mixed=kept.get("mixed") or None,
        )
