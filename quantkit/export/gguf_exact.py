"""`--format gguf`: the artifact's own grid in one GGUF file for llama.cpp (gguf/artifact_to_gguf.py), exact
where a GGUF type holds it, refused (or, with --allow-lossy, rounded and its KL measured) where not."""

from __future__ import annotations

from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.export.exporter import EXACT, LOSSY, REFUSED, Exporter, ExportSettings, Verdict
from quantkit.gguf.artifact_to_gguf import GgufOptions, export_gguf
from quantkit.gguf.gguf_records import GgufRecord, KquantRecord
from quantkit.models.scheme_facts import SchemeFacts

GGML_BLOCK = 32  # values per scale block of Q4_0, Q4_1 and Q8_0 (ggml-common.h QK4_0, QK4_1, QK8_0)
INT_TYPES = {(4, True): "Q4_0", (4, False): "Q4_1", (8, True): "Q8_0"}  # (bits, symmetric) -> the GGUF grid
# The FP4 types keep the artifact's own scales (gguf/tensor_map.py); NVFP4's per-tensor scale is
# llama.cpp's F32 multiplier beside the weight, exact where 1/g is a float32 value.
SCALES_KEPT = {
    "MXFP4": "codes and E8M0 block exponents kept",
    "NVFP4": "codes and E4M3 block scales kept, the global scale as the tensor's F32 .scale",
}


def exact_type(facts: SchemeFacts) -> str | None:
    """The GGUF type that holds a scheme's grid exactly, as gguf/tensor_map.py maps it (None: none does).
    Exact on the scheme's facts; the export still checks each tensor's scales (fp16 values, act-order groups)."""
    if facts.dynamic is False:  # calibrated input scales: part of the model, and llama.cpp has none
        return None
    if facts.weights in ("mxfp4", "nvfp4"):
        return facts.weights.upper()
    if facts.weights != "int":
        return None
    if facts.strategy == "group" and facts.group_size and facts.group_size % GGML_BLOCK:
        return None
    return INT_TYPES.get((facts.bits, facts.symmetric)) if facts.strategy in ("group", "channel") else None


def takes(facts: SchemeFacts) -> Verdict:
    if facts.weights == "dense":
        return Verdict(EXACT, "16-bit weights copied (F16/BF16)")
    qtype = exact_type(facts)
    if qtype is not None:
        acts = "" if facts.activations == "16-bit" else "; llama.cpp computes the activations in its own types"
        where = SCALES_KEPT.get(qtype, "where each block's scale is an fp16 value")
        return Verdict(EXACT, f"{facts.label} -> {qtype}, {where}{acts}")
    if facts.weights == "int" and facts.dynamic is not False and facts.strategy in ("group", "channel"):
        return Verdict(LOSSY, f"{facts.label}: no GGUF type has its grid; with --allow-lossy, rounded to ggml's")
    if facts.container == "bitsandbytes":
        return Verdict(REFUSED, "bitsandbytes' blocks have no GGUF type; export the 16-bit checkpoint")
    if facts.dynamic is False:
        return Verdict(REFUSED, "calibrated input scales, which llama.cpp cannot apply")
    return Verdict(REFUSED, f"{facts.label} weights have no GGUF type; export the 16-bit checkpoint")


class GgufExact(Exporter):
    name = "gguf"
    format = "gguf"
    writes = "one GGUF file for llama.cpp, the artifact's grid kept"

    def takes(self, facts: SchemeFacts) -> Verdict:
        return takes(facts)

    def check(self, settings: ExportSettings) -> None:
        if settings.mixed is not None:
            raise QuantkitError(
                "--mixed chooses among llama.cpp's types within --type's size; give --type (e.g. --type Q4_K_M)"
            )

    def out_name(self, stem: str, settings: ExportSettings) -> str:
        return f"{stem}.gguf"

    def export(self, artifact: Path, out: Path | None, settings: ExportSettings) -> GgufRecord:
        s = settings
        opts = GgufOptions(embeddings=s.embeddings, allow_lossy=s.allow_lossy, force=s.force, kl_text=s.kl_text)
        return export_gguf(artifact, out, opts)

    def kept(self, record: GgufRecord | KquantRecord) -> dict:
        return {
            "gguf": record.gguf,
            "sha256": record.sha256,
            "bytes": record.bytes,
            "lossless": record.lossless,
            "tensor_types": record.tensor_types,
            "mapping": [m.to_json() for m in record.mapping],
        }

    def summary(self, record: GgufRecord) -> list[str]:
        lines = [f"wrote {record.gguf} ({record.bytes / 1e6:.1f} MB, {record.architecture})"]
        lines += [f"  {m.tensors:4d} x {m.mapping}{'' if m.exact else '  [not exact]'}" for m in record.mapping]
        v, kl = record.verification, record.kl_vs_artifact
        if record.lossless:
            lines.append(
                f"  lossless: {v.exact_tensors} tensors dequantized by gguf equal the artifact's weights "
                f"(max abs diff {v.max_abs_diff_exact:g})"
            )
        else:
            lines.append(
                f"  LOSSY: {len(record.lossy_tensors)} tensors; KL vs the artifact {kl.mean_kl:.3g} mean, "
                f"{kl.max_kl:.3g} max, top-1 {kl.top1_agreement * 100:.2f}% ({kl.text})"
            )
        return lines + [f"  note: {note}" for note in record.notes]
