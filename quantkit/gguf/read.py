"""Opening a GGUF file safely: a truncated file or one that is not a GGUF is one clear error.

`inspect` returns what the rest of quantkit needs to know about a GGUF without loading it
(architecture, tensor types, bytes by type, quantkit's own keys), through `gguf.GGUFReader`;
`origin` where quantkit export says the file came from; `written_by_quantkit` whether it did.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf

from quantkit.errors import ModelError

GGUF_MAGIC = b"GGUF"
# What gguf.GGUFReader raises on a file that is not a whole GGUF.
READ_ERRORS = (ValueError, IndexError, KeyError, OverflowError, MemoryError, UnicodeDecodeError)


# A model's GGUF takes gguf.GGUFReader a second or more to parse (its tokenizer's tens of
# thousands of strings, field by field), and one bench reads each file many times (the precheck,
# the roofline's config, the engine, the twin, the attribution): a file at least this large is
# parsed once per process, its reader kept while the file is the same one (path, inode, size,
# modification and change times). Readers are read-only memory maps.
KEEP_READER_BYTES = 16 << 20
_READERS: dict[tuple, object] = {}
_READERS_MAX = 8


def open_reader(path: Path):
    """A gguf.GGUFReader over `path`, or ModelError naming what is wrong with the file."""

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such GGUF file")
    with open(path, "rb") as fh:
        head = fh.read(4)
        st = os.fstat(fh.fileno())
    if head != GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _READERS:
        return _READERS[key]
    try:
        reader = gguf.GGUFReader(str(path))
    except READ_ERRORS as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ModelError(f"{path}: corrupt or truncated GGUF file ({first})") from None
    size = st.st_size
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise ModelError(f"{path}: truncated GGUF file (tensor {t.name} ends past the end of the file)")
    if size >= KEEP_READER_BYTES:
        while len(_READERS) >= _READERS_MAX:
            _READERS.pop(next(iter(_READERS)))
        _READERS[key] = reader
    return reader


def field_value(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return default


def inspect(path: Path) -> dict:
    """Architecture, tensor types and bytes of a GGUF file (read through its header and tensor table)."""
    reader = open_reader(path)
    arch = field_value(reader, "general.architecture")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    nbytes: Counter = Counter()
    for t in reader.tensors:
        nbytes[t.tensor_type.name] += int(t.n_bytes)
    return {
        "path": str(Path(path)),
        "architecture": arch,
        "name": field_value(reader, "general.name"),
        "file_type": field_value(reader, "general.file_type"),
        "tensors": len(reader.tensors),
        "tensor_types": dict(types),
        "bytes_by_type": dict(nbytes),
        "block_count": field_value(reader, f"{arch}.block_count") if arch else None,
        "quantkit_lossless": field_value(reader, "quantkit.lossless"),
    }


@dataclass(frozen=True)
class Origin:
    """Where a GGUF came from, as quantkit export writes it into the file (write.py `_metadata`)."""

    source_sha256: (
        str | None
    )  # the checkpoint the artifact was converted from (the artifact itself when it records none)
    artifact_sha256: str | None  # the artifact that was exported; absent from GGUFs of older quantkit versions
    provenance: (
        dict | None
    )  # the conversion's source and fitted texts, quantkit.json-shaped (None: no conversion record)

    @property
    def known(self) -> bool:
        """quantkit export wrote it, recent enough that source_sha256 names the checkpoint converted from
        (older versions stored the artifact's own hash under that key)."""
        return self.artifact_sha256 is not None


def origin(reader) -> Origin:
    def text(key):
        value = field_value(reader, key)
        return value if isinstance(value, str) else None

    try:
        prov = json.loads(text("quantkit.provenance") or "null")
    except json.JSONDecodeError:
        prov = None
    return Origin(
        text("quantkit.source.sha256"), text("quantkit.artifact.sha256"), prov if isinstance(prov, dict) else None
    )


def written_by_quantkit(path: Path) -> bool:
    """The file is a GGUF whose header carries quantkit export's own keys (a header that does not
    parse, or a file that is not a GGUF, is not)."""

    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            return False
    try:
        reader = gguf.GGUFReader(str(path))
    except READ_ERRORS:
        return False
    return isinstance(field_value(reader, "quantkit.version"), str)
