"""`--format gguf --type T`: llama.cpp's own quantization of a 16-bit checkpoint (gguf/llama_quantize.py), with
an importance matrix from quantkit's calibration windows; `--mixed` lets quantize/kquant_chooser.py choose
each decoder-layer weight's type within T's size."""

from __future__ import annotations

from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.export.exporter import EXACT, LOSSY, REFUSED, Exporter, ExportSettings, Verdict
from quantkit.export.gguf_exact import GgufExact, exact_type
from quantkit.gguf.gguf_records import GgufRecord, KquantRecord
from quantkit.gguf.llama_quantize import QUANT_TYPES, KquantOptions, check_type, export_kquant
from quantkit.models.scheme_facts import SchemeFacts
from quantkit.quantize import kquant_chooser

# what a run keeps of llama-quantize's record beyond the exact export's (kept): null on the exact route
LLAMA_QUANTIZE_KEPT = ("gguf_type", "bits_per_weight", "bits_per_weight_layers", "fallback_types", "imatrix_sha256")


def takes(facts: SchemeFacts) -> Verdict:
    if facts.weights == "dense":
        return Verdict(LOSSY, "llama-quantize's rounding to --type, with an importance matrix from --calib")
    qtype = exact_type(facts)
    if qtype in QUANT_TYPES:
        return Verdict(EXACT, f"--type {qtype} only, its own grid: the exact export (not with --mixed)")
    return Verdict(REFUSED, "already quantized: give --type the 16-bit checkpoint it was converted from")


class GgufKquant(Exporter):
    name = "gguf-kquant"
    format = "gguf"
    writes = "one GGUF file for llama.cpp, in llama-quantize's --type (K-quants, i-quants, legacy types)"
    selected_by = "qtype"

    def takes(self, facts: SchemeFacts) -> Verdict:
        return takes(facts)

    def check(self, settings: ExportSettings) -> None:
        check_type(settings.qtype)  # an unknown type is named before the other options are looked at
        lossy = [
            flag
            for flag, given in (
                ("--embeddings q8_0", settings.embeddings != "keep"),
                ("--allow-lossy", settings.allow_lossy),
                ("--kl-text", settings.kl_text),
            )
            if given
        ]
        if lossy:
            raise QuantkitError(
                f"{lossy[0]} applies to the exact export; with --type, llama-quantize chooses every tensor's type"
            )
        if settings.mixed is not None:
            kquant_chooser.parse_types(settings.mixed)

    def out_name(self, stem: str, settings: ExportSettings) -> str:
        return f"{stem}.{settings.qtype}.gguf"

    def export(self, artifact: Path, out: Path | None, settings: ExportSettings) -> KquantRecord | GgufRecord:
        """llama-quantize's record; the exact export's where the artifact is already quantized in --type's grid."""
        s = settings
        opts = KquantOptions(
            qtype=s.qtype,
            calib=s.calib,
            samples=s.samples,
            seq_len=s.seq_len,
            seed=s.seed,
            region=s.region,
            imatrix=s.imatrix,
            force=s.force,
        )
        chooser = (
            kquant_chooser.chooser(kquant_chooser.parse_types(s.mixed), gptq=s.mixed_gptq)
            if s.mixed is not None
            else None
        )
        return export_kquant(artifact, out, opts, chooser)

    def kept(self, record: KquantRecord | GgufRecord) -> dict:
        kept = GgufExact().kept(record)
        if isinstance(record, GgufRecord):  # the exact route: none of llama-quantize's figures
            return kept | dict.fromkeys(LLAMA_QUANTIZE_KEPT)
        kept |= {
            "gguf_type": record.gguf_type,
            "bits_per_weight": record.bits_per_weight,
            "bits_per_weight_layers": record.bits_per_weight_layers,
            "fallback_types": record.fallback_types,
            "imatrix_sha256": record.imatrix.sha256 if record.imatrix else None,
        }
        if record.mixed:  # the choice's summary; every weight's type and cost stay in the GGUF's own record
            kept["mixed"] = {k: v for k, v in record.mixed.items() if k not in ("weights", "windows")}
        return kept

    def summary(self, record: KquantRecord | GgufRecord) -> list[str]:
        if isinstance(record, GgufRecord):  # a quantized artifact's own grid: the exact export's record
            return GgufExact().summary(record)
        im = record.imatrix
        lines = [
            f"wrote {record.gguf} ({record.bytes / 1e6:.1f} MB, {record.gguf_type}, "
            f"{record.bits_per_weight_layers:.2f} bits/weight in the decoder layers, "
            f"{record.bits_per_weight:.2f} overall)",
            "  tensor types: " + ", ".join(f"{n} x {t}" for t, n in record.tensor_types.items()),
        ]
        if im:
            lines.append(
                f"  importance matrix: llama-imatrix over {im.windows} windows of {im.chunk_tokens} tokens from "
                f"{im.text_source} (sha256 {im.sha256[:12]})"
            )
        if record.mixed:
            lines.append(f"  {kquant_chooser.describe(record.mixed)}")
        return lines + [f"  note: {note}" for note in record.notes]
