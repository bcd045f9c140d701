"""The record quantkit export writes beside a GGUF (NAME.quantkit.json, kind quantkit-gguf-export,
schema 2): one typed, frozen record per kind of export, each with one JSON form (`to_json`,
`from_json`).

- GgufRecord: `--format gguf`, the exact export (gguf/artifact_to_gguf.py `export_gguf`).
- KquantRecord: `--format gguf --type T`, llama-quantize's (gguf/llama_quantize.py `export_kquant`).

Their parts: ExportedFrom (the artifact or checkpoint exported), ConvertedFrom (the checkpoint it was
converted from), MappingLine, Verification, KlCheck (a lossy export's KL) and Imatrix (llama-imatrix's
importance matrix).

The exporters build the record and write its `to_json()`, so the file is that JSON exactly, and return
the record. The file's readers (gguf/target.py `read_record`: export's --force, the bench's GGUF
source and self-check, eval's provenance of a GGUF) read it through `gguf_record`, which tells the
two forms apart, and take a file that does not read as no record.

`from_json` refuses unknown and missing keys and values of the wrong type with one line
(core/record_checks.py), and reads what older quantkits wrote: a schema-1 record (before it named
the checkpoint the artifact was converted from: `origin` None), a lossy export's KL from before the
reference's logits were checked too (`reference_finite` None), and llama-quantize's records from
before the decoder layers' bits per weight (`bits_per_weight_layers` None) and the importance
matrix's reuse (`reused` None) were recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantkit.core.record_checks import (
    COUNT,
    FLAG,
    FLAG_OR_NONE,
    FRACTION,
    LIST,
    NONNEG,
    NONNEG_OR_NONE,
    OBJECT,
    OBJECT_OR_NONE,
    TEXT,
    TEXT_OR_NONE,
    RecordError,
    Whole,
    check_values,
    checked,
    of_kind,
)

RECORD_KIND = "quantkit-gguf-export"
SCHEMA_VERSION = 2  # 2: quantkit.source.sha256 names the checkpoint converted from (1: the artifact)
READS = (1, 2)  # the schema versions from_json reads


@dataclass(frozen=True)
class ExportedFrom:
    """The artifact (or 16-bit checkpoint) exported: its path, checkpoint hash, name and quantization."""

    artifact: str
    sha256: str
    name: str | None  # quantkit.json's; None: a checkpoint without one
    quantization: dict | None  # quantkit.json's; None: a checkpoint without one

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> ExportedFrom:
        what = "GGUF export record's source"
        rules = {"artifact": TEXT, "sha256": TEXT, "name": TEXT_OR_NONE, "quantization": OBJECT_OR_NONE}
        return cls(**check_values(checked(cls, data, what), rules, what))


@dataclass(frozen=True)
class ConvertedFrom:
    """The checkpoint the artifact was converted from (the artifact itself when it records none)."""

    sha256: str
    path: str

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> ConvertedFrom:
        what = "GGUF export record's origin"
        return cls(**check_values(checked(cls, data, what), {"sha256": TEXT, "path": TEXT}, what))


@dataclass(frozen=True)
class MappingLine:
    """The tensors one mapping wrote (`INT4 symmetric, group 32 -> Q4_0`), and whether it is exact."""

    mapping: str
    tensors: int
    exact: bool

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> MappingLine:
        what = "GGUF export record's mapping"
        return cls(**check_values(checked(cls, data, what), {"mapping": TEXT, "tensors": COUNT, "exact": FLAG}, what))


@dataclass(frozen=True)
class Verification:
    """Every tensor dequantized by gguf and compared with the artifact's weight before it was written."""

    method: str
    tensors: int
    exact_tensors: int
    max_abs_diff_exact: float

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> Verification:
        what = "GGUF export record's verification"
        rules = {"method": TEXT, "tensors": COUNT, "exact_tensors": COUNT, "max_abs_diff_exact": NONNEG}
        return cls(**check_values(checked(cls, data, what), rules, what))


@dataclass(frozen=True)
class KlCheck:
    """A lossy export's KL(artifact || GGUF weights) per token (gguf/fidelity.py logits_kl)."""

    finite: bool
    reference_finite: bool | None  # None: written before the reference's logits were checked
    # not finite only in a record written before an export with no finite KL was refused
    mean_kl: float
    max_kl: float
    top1_agreement: float
    tokens: int
    text: str  # the text the windows came from, in words
    reference: str  # what the GGUF's weights were compared with
    engine: str

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> KlCheck:
        what = "GGUF export record's kl_vs_artifact"
        data = {"reference_finite": None, **data} if isinstance(data, dict) else data  # an older export's
        rules = {"finite": FLAG, "reference_finite": FLAG_OR_NONE, "top1_agreement": FRACTION, "tokens": COUNT}
        rules |= dict.fromkeys(("text", "reference", "engine"), TEXT)
        return cls(**check_values(checked(cls, data, what), rules, what))


@dataclass(frozen=True)
class Imatrix:
    """llama-imatrix's importance matrix over the calibration windows (gguf/llama_quantize.py)."""

    sha256: str
    text_sha256: str  # the calibration text's
    chunk_tokens: int
    chunks_max: int
    seconds: float
    reused: bool | None  # taken from QUANTKIT_HOME/imatrix; None: written before that was recorded
    tool: str
    calibration: dict  # the calibration windows' manifest (data/calib.py)

    @property
    def windows(self) -> int | None:
        """The calibration windows its text held, as their manifest counts them."""
        return self.calibration.get("samples")

    @property
    def text_source(self) -> str | None:
        """Where the calibration text came from (its SPEC), as the manifest names it."""
        return self.calibration.get("source")

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> Imatrix:
        what = "GGUF export record's imatrix"
        data = {"reused": None, **data} if isinstance(data, dict) else data  # an older export's
        rules = {**dict.fromkeys(("sha256", "text_sha256", "tool"), TEXT), "reused": FLAG_OR_NONE}
        rules |= {"chunk_tokens": Whole(1), "chunks_max": Whole(1), "seconds": NONNEG, "calibration": OBJECT}
        return cls(**check_values(checked(cls, data, what), rules, what))


# The values both records hold, checked as they are read.
GGUF_VALUES = {
    **dict.fromkeys(("gguf", "sha256", "architecture", "model_type"), TEXT),
    **dict.fromkeys(("source", "tensor_types", "vocab", "tool_versions"), OBJECT),
    **dict.fromkeys(("mapping", "tensors", "notes"), LIST),
    "bytes": COUNT,
    "origin": OBJECT_OR_NONE,
    "lossless": FLAG,
    "wall_seconds": NONNEG,
}


@dataclass(frozen=True)
class GgufRecord:
    """The exact export: the artifact's own grid in one GGUF, every tensor checked."""

    gguf: str  # the file written
    sha256: str
    bytes: int
    source: ExportedFrom
    origin: ConvertedFrom | None  # None: schema 1 did not record it
    architecture: str  # llama.cpp's
    model_type: str
    lossless: bool
    mapping: tuple[MappingLine, ...]
    tensor_types: dict  # GGUF type -> tensors
    tensors: tuple[dict, ...]  # each tensor's name, source, type, exactness and RoPE permutation
    verification: Verification
    lossy_tensors: tuple[dict, ...]  # each rounded tensor, why, and its difference
    extra_tensors: tuple[str, ...]  # tensors the checkpoint does not hold (rope_freqs.weight)
    vocab: dict
    notes: tuple[str, ...]
    tool_versions: dict
    gguf_quant_version: int
    kl_vs_artifact: KlCheck | None  # a lossy export's KL; None (no key) when lossless
    wall_seconds: float
    kind: str = field(default=RECORD_KIND, init=False)
    schema_version: int = field(default=SCHEMA_VERSION, init=False)

    def to_json(self) -> dict:
        d = {
            "kind": self.kind,
            "schema_version": self.schema_version,
            **self.__dict__,
            "source": self.source.to_json(),
            "origin": self.origin.to_json() if self.origin else None,
            "mapping": [m.to_json() for m in self.mapping],
            "tensors": list(self.tensors),
            "verification": self.verification.to_json(),
            "lossy_tensors": list(self.lossy_tensors),
            "extra_tensors": list(self.extra_tensors),
            "notes": list(self.notes),
            "kl_vs_artifact": self.kl_vs_artifact.to_json() if self.kl_vs_artifact else None,
        }
        if self.kl_vs_artifact is None:
            del d["kl_vs_artifact"]
        return d

    @classmethod
    def from_json(cls, data) -> GgufRecord:
        what = "GGUF export record"
        d = of_kind(cls, _gguf_form(data, what, {"kl_vs_artifact": None}), RECORD_KIND, what)
        rules = {**GGUF_VALUES, "verification": OBJECT, "gguf_quant_version": COUNT, "kl_vs_artifact": OBJECT_OR_NONE}
        d = check_values(d, {**rules, "lossy_tensors": LIST, "extra_tensors": LIST}, what)
        return cls(
            **{
                **_init(d),
                **_provenance(d),
                "mapping": tuple(MappingLine.from_json(m) for m in d["mapping"]),
                "tensors": tuple(d["tensors"]),
                "verification": Verification.from_json(d["verification"]),
                "lossy_tensors": tuple(d["lossy_tensors"]),
                "extra_tensors": tuple(d["extra_tensors"]),
                "notes": tuple(d["notes"]),
                "kl_vs_artifact": KlCheck.from_json(d["kl_vs_artifact"]) if d["kl_vs_artifact"] is not None else None,
            }
        )


@dataclass(frozen=True)
class KquantRecord:
    """llama-quantize's `--type` of a 16-bit checkpoint's exact F16 GGUF, with an importance matrix."""

    gguf: str  # the file written
    sha256: str
    bytes: int
    source: ExportedFrom  # the checkpoint quantized
    origin: ConvertedFrom
    architecture: str
    model_type: str
    lossless: bool  # false: llama-quantize rounds
    gguf_type: str  # llama-quantize's --type
    mapping: tuple[MappingLine, ...]
    tensor_types: dict  # GGUF type -> tensors
    weight_types: dict  # the same, 2-D weights only
    bits_per_weight: float  # all tensors
    bits_per_weight_2d: float
    bits_per_weight_layers: float | None  # the decoder layers' linears; None: not recorded then
    fallbacks: tuple[dict, ...]  # weights whose rows are no multiple of the type's block, and their type
    fallback_types: dict
    block: int  # values per block of --type's main type
    tensors: tuple[dict, ...]  # each tensor's name and type
    imatrix: Imatrix | None  # None: llama-quantize alone
    f16: dict  # the exact F16 GGUF it was quantized from: bytes, sha256
    vocab: dict
    notes: tuple[str, ...]
    tool_versions: dict
    wall_seconds: float
    mixed: dict | None  # --mixed's choice (quantize/kquant_chooser.py); None (no key) without --mixed
    kind: str = field(default=RECORD_KIND, init=False)
    schema_version: int = field(default=SCHEMA_VERSION, init=False)  # its F16's

    def to_json(self) -> dict:
        d = {
            "kind": self.kind,
            "schema_version": self.schema_version,
            **self.__dict__,
            "source": self.source.to_json(),
            "origin": self.origin.to_json(),
            "mapping": [m.to_json() for m in self.mapping],
            "fallbacks": list(self.fallbacks),
            "tensors": list(self.tensors),
            "imatrix": self.imatrix.to_json() if self.imatrix else None,
            "notes": list(self.notes),
        }
        if self.mixed is None:
            del d["mixed"]
        return d

    @classmethod
    def from_json(cls, data) -> KquantRecord:
        what = "llama-quantize's GGUF export record"
        d = of_kind(cls, _gguf_form(data, what, {"bits_per_weight_layers": None, "mixed": None}), RECORD_KIND, what)
        rules = {**GGUF_VALUES, "origin": OBJECT, "gguf_type": TEXT, "block": Whole(1), "fallbacks": LIST}
        rules |= dict.fromkeys(("weight_types", "fallback_types", "f16"), OBJECT)
        rules |= dict.fromkeys(("bits_per_weight", "bits_per_weight_2d"), NONNEG)
        rules |= {"bits_per_weight_layers": NONNEG_OR_NONE, "imatrix": OBJECT_OR_NONE, "mixed": OBJECT_OR_NONE}
        d = check_values(d, rules, what)
        return cls(
            **{
                **_init(d),
                **_provenance(d),
                "mapping": tuple(MappingLine.from_json(m) for m in d["mapping"]),
                "fallbacks": tuple(d["fallbacks"]),
                "tensors": tuple(d["tensors"]),
                "imatrix": Imatrix.from_json(d["imatrix"]) if d["imatrix"] is not None else None,
                "notes": tuple(d["notes"]),
            }
        )


def gguf_record(data) -> GgufRecord | KquantRecord:
    """The record beside a GGUF, by its form: llama-quantize's names its `gguf_type`, the exact export's does not."""
    return (
        KquantRecord.from_json(data) if isinstance(data, dict) and "gguf_type" in data else GgufRecord.from_json(data)
    )


def of_record_kind(data) -> bool:
    """JSON that quantkit export wrote beside a GGUF, read or not (a newer schema, a damaged value):
    what its --force may replace."""
    return isinstance(data, dict) and data.get("kind") == RECORD_KIND


def _gguf_form(data, what: str, absent: dict) -> dict:
    """A record's JSON in the current form: a known schema (schema 1 migrated), and the keys
    `absent` (each key -> the value it reads as) where an older or a lossless export wrote none."""
    if not isinstance(data, dict):
        raise RecordError(f"{what}: expected a JSON object, not {type(data).__name__}")
    version = data.get("schema_version")
    if version not in READS:
        raise RecordError(f"{what} of schema {version!r}: this quantkit reads {', '.join(map(str, READS))}")
    if version == 1:
        data = migrate_v1(data)
    return {**absent, **data}


def migrate_v1(data: dict) -> dict:
    """A schema-1 record as schema 2 holds it. Schema 2 added `origin`, the checkpoint the artifact
    was converted from; schema 1 recorded the artifact alone (`source`), so it is None."""
    return {**data, "schema_version": SCHEMA_VERSION, "origin": None}


def _provenance(d: dict) -> dict:
    """A checked record's `source` and `origin` read as their parts."""
    origin = d["origin"]
    return {
        "source": ExportedFrom.from_json(d["source"]),
        "origin": ConvertedFrom.from_json(origin) if origin is not None else None,
    }


def _init(d: dict) -> dict:
    """A record's JSON less what every record of its class holds alike (its kind and schema)."""
    return {k: v for k, v in d.items() if k not in ("kind", "schema_version")}
