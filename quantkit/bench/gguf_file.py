"""A GGUF file as a bench source: its shape, the bytes a llama.cpp decode step reads by tensor
type, the checkpoint its self-check compares with, and the GGUFs exported on the fly.

Bytes per token come from the file's own tensor types (gguf.GGML_QUANT_SIZES: Q4_0 18 bytes per
32 weights, Q4_1 20, Q8_0 34, F16/BF16 2 per weight, F32 4), each tensor read once per step, as
quantkit's torch accounting counts (accounting.weight_read_bytes): token_embd one row (a
get_rows), output.weight in full, and with no output.weight (tied) token_embd in full as well,
since llama.cpp then multiplies by it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf

from quantkit import __version__
from quantkit.core.integrity import sha256_file
from quantkit.errors import ModelError, QuantkitError
from quantkit.gguf.artifact_to_gguf import GgufOptions, export_gguf
from quantkit.gguf.gguf_records import SCHEMA_VERSION, GgufRecord, KquantRecord
from quantkit.gguf.read import field_value, open_reader
from quantkit.gguf.target import read_record, record_path
from quantkit.gguf.tensor_map import NotLosslessError
from quantkit.home import subdir
from quantkit.models.checkpoint import checkpoint_hash

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str  # gguf.GGMLQuantizationType member name
    shape: tuple[int, ...]  # torch order (rows, cols)


def is_gguf(source) -> bool:
    """A bench source that names a file (a directory is a checkpoint, a Synthetic spec neither)."""
    return isinstance(source, Path) and not source.is_dir()


def type_bytes(qtype: str, n_elements: int) -> int:
    """Bytes of `n_elements` weights stored as `qtype` (ggml's block size and block bytes)."""

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    if n_elements % block:
        raise ModelError(f"{n_elements} weights do not fill whole {qtype} blocks of {block}")
    return n_elements // block * size


def weight_read_bytes(tensors: list[TensorInfo]) -> dict:
    """What one decode step reads from the weights (see the module docstring)."""

    sizes = {t.name: type_bytes(t.qtype, math.prod(t.shape)) for t in tensors}
    emb = next((t for t in tensors if t.name == EMBEDDING), None)
    if emb is None:
        raise ModelError(f"the GGUF has no {EMBEDDING}")
    tied = OUTPUT not in sizes
    stored = sum(sizes.values())
    row = sizes[EMBEDDING] // emb.shape[0]
    per_token = stored + row if tied else stored - sizes[EMBEDDING] + row
    by_type: dict[str, int] = {}
    for t in tensors:
        by_type[t.qtype] = by_type.get(t.qtype, 0) + sizes[t.name]
    return {
        "weight_bytes_per_token": int(per_token),
        "stored_weight_bytes": int(stored),
        "tied_lm_head": tied,
        "weight_bytes_by_type": by_type,
    }


def tensor_infos(reader) -> list[TensorInfo]:
    return [
        TensorInfo(t.name, t.tensor_type.name, tuple(int(x) for x in reversed(t.shape.tolist())))
        for t in reader.tensors
    ]


def _first(value):
    return value[0] if isinstance(value, list) and value else value


def gguf_config(path: Path) -> dict:
    """The transformers-style config fields quantkit's roofline needs, from the GGUF's own keys."""

    reader = open_reader(path)
    arch = field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{path}: the GGUF names no general.architecture")

    def need(key: str):
        value = _first(field_value(reader, f"{arch}.{key}"))
        if not isinstance(value, int) or value <= 0:
            raise ModelError(f"{path}: the GGUF has no {arch}.{key}; quantkit benches decoder-only transformer GGUFs")
        return value

    names = {t.name: t for t in tensor_infos(reader)}
    if EMBEDDING not in names:
        raise ModelError(f"{path}: the GGUF has no {EMBEDDING}")
    heads = need("attention.head_count")
    hidden = need("embedding_length")
    return {
        "model_type": arch,
        "vocab_size": names[EMBEDDING].shape[0],
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _first(field_value(reader, f"{arch}.attention.head_count_kv")) or heads,
        "head_dim": _first(field_value(reader, f"{arch}.attention.key_length")) or hidden // heads,
        "value_head_dim": _first(field_value(reader, f"{arch}.attention.value_length")) or hidden // heads,
        "max_position_embeddings": _first(field_value(reader, f"{arch}.context_length")),
        "tie_word_embeddings": OUTPUT not in names,
    }


def export_record(gguf: Path) -> GgufRecord | KquantRecord | None:
    """quantkit export's record beside a GGUF (NAME.quantkit.json) when it describes this very file."""
    rec = read_record(record_path(gguf))
    return rec if rec is not None and _record_matches(gguf, rec) else None


def _record_matches(gguf: Path, rec: GgufRecord | KquantRecord) -> bool:
    """The export record describes this very file (size, then sha256)."""
    return rec.bytes == gguf.stat().st_size and sha256_file(gguf) == rec.sha256


def reference_source(source) -> tuple[Path | None, str | None]:
    """The checkpoint the self-check loads in transformers: a directory source itself; for a GGUF,
    the artifact its quantkit export record (NAME.quantkit.json beside it) names, when that artifact
    is still there unchanged. (None, why) when there is nothing to compare with."""

    if not is_gguf(source):
        return source, None
    rec = read_record(record_path(source))
    if rec is None:
        return None, (
            "not possible: a GGUF without quantkit's export record beside it (not exported by quantkit export), "
            "so there is no checkpoint to compare llama.cpp's logits with"
        )
    if not rec.lossless:  # llama-quantize's types, --allow-lossy: not the checkpoint's numbers by design
        made = rec.gguf_type if isinstance(rec, KquantRecord) else "--allow-lossy"
        return None, (
            f"skipped: a lossy GGUF ({made}) does not compute its checkpoint's logits by design; quantkit eval "
            "measures how far it is"
        )
    art = Path(rec.source.artifact)
    if not (art / "config.json").is_file():
        return None, f"not possible: the checkpoint it was exported from ({art}) is no longer there"
    if checkpoint_hash(art) != rec.source.sha256:
        return None, f"not possible: {art} changed since the GGUF was exported from it"
    if not _record_matches(source, rec):
        return None, "not possible: the GGUF changed since its export record was written"
    return art, None


# ---------------------------------------------------------------- GGUFs exported on the fly


def _cache_key(source_hash: str, opts) -> str:
    options = {k: v for k, v in asdict(opts).items() if k != "force"}
    blob = json.dumps(
        {"source": source_hash, "options": options, "quantkit": __version__, "schema": SCHEMA_VERSION}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def exported_gguf(source: Path) -> tuple[Path, dict]:
    """A quantkit artifact or 16-bit checkpoint -> its exact GGUF in QUANTKIT_HOME/gguf, keyed by the
    source's content hash and the export options, exported once and reused while the file still
    matches its record (size and sha256). quantkit export writes it transactionally (temp file,
    fsync, rename, then the record) under its lock, so a killed export never leaves a file that
    is reused."""

    opts = GgufOptions()
    source_hash = checkpoint_hash(source)
    out = subdir("gguf") / f"{_cache_key(source_hash, opts)}.gguf"
    rec = read_record(record_path(out)) if out.is_file() else None
    if rec is not None and rec.source.sha256 == source_hash and _record_matches(out, rec):
        return out, {"gguf": str(out), "cached": True, "export_s": 0.0, "lossless": rec.lossless}
    t = time.perf_counter()
    try:
        rec = export_gguf(source, out, GgufOptions(force=True))
    except NotLosslessError as exc:
        raise QuantkitError(
            f"--engine llamacpp: {source} has no exact GGUF ({exc}); export it with `quantkit export "
            f"{source} --format gguf --allow-lossy` and bench the .gguf"
        ) from None
    return out, {
        "gguf": str(out),
        "cached": False,
        "export_s": time.perf_counter() - t,
        "lossless": rec.lossless,
    }
