"""What an export hands on: the record of what an exporter wrote, typed and frozen, with one JSON
form (`to_json`, `from_json`); what a run keeps of it is the exporter's `kept` (export/exporter.py).

CopyRecord is `--format compressed-tensors`'s: the artifact's own directory copied. It has no file
of its own: its JSON is `quantkit export --json`'s output.

The GGUF exporters' records (GgufRecord for `--format gguf`, KquantRecord for `--format gguf --type
T`) are the record file the gguf package writes beside the GGUF, so they live there
(gguf/gguf_records.py), where that file's readers below export/ (export's --force, the bench's GGUF
source, eval's provenance of a GGUF) read them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantkit.core.record_checks import COUNT, TEXT, Whole, check_values, of_kind

COPY_KIND = "quantkit-export"


@dataclass(frozen=True)
class CopyRecord:
    """The artifact's files copied to `out` and checked against its manifest there."""

    format: str
    out: str  # the directory written
    artifact: str  # the artifact copied
    files: int  # its files, quantkit.json included
    bytes: int
    sha256: str  # the copy's checkpoint hash
    kind: str = field(default=COPY_KIND, init=False)

    def to_json(self) -> dict:
        return {"kind": self.kind, **self.__dict__}

    @classmethod
    def from_json(cls, data) -> CopyRecord:
        d = of_kind(cls, data, COPY_KIND, "export record")
        rules = {**dict.fromkeys(("format", "out", "artifact", "sha256"), TEXT), "files": Whole(1), "bytes": COUNT}
        d = check_values(d, rules, "export record")
        return cls(**{k: v for k, v in d.items() if k != "kind"})
