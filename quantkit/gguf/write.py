"""Writing the GGUF: header and metadata first, then each tensor streamed one at a time.

The file is written under a temp name beside the target, fsync'ed and renamed into place only when
every tensor has passed its check and the file reads back with the planned tensor table; its
export record is staged beside it the same way and renamed in the same step, with SIGINT/SIGTERM
held between the two renames, so a GGUF never stands beside another export's record. A failure
(or Ctrl-C, or `kill`) removes the temp files, so the target is never half written. A kill -9 can
leave `.NAME.partial-PID` files, which the next export to the same target removes (under its lock).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from quantkit import __version__
from quantkit.core.atomic import file_mode, fsync_dir, signals_deferred, strict_json
from quantkit.gguf.artifact import Artifact
from quantkit.gguf.gguf_arch import Hparams, add_hparams, extra_tensors
from quantkit.gguf.read import Origin, open_reader
from quantkit.gguf.tensor_map import TensorPlan, file_type, mapping_summary
from quantkit.gguf.tensors import tensor_bytes
from quantkit.gguf.vocab import VocabInfo, add_vocab


@dataclass(frozen=True)
class Written:
    """What `write` checked as it wrote: each tensor's check, the vocabulary's summary, and the
    tensors the checkpoint does not hold (rope_freqs.weight)."""

    checks: dict  # tensor name -> its check (tensors.tensor_bytes)
    vocab: VocabInfo
    extra_tensors: list[str]


@dataclass
class Stage:
    """The GGUF's temp file, and the export record to rename into place with it."""

    path: Path
    record: dict | None = None


def _partial(path: Path) -> Path:
    return path.parent / f".{path.name}.partial-{os.getpid()}"


def _remove_stale(path: Path) -> None:
    """What a killed export left: an exact name (a glob of `path.name` could match other targets' files)."""
    pat = re.compile(rf"\.{re.escape(path.name)}\.partial-\d+")
    for stale in path.parent.iterdir():
        if pat.fullmatch(stale.name) and stale.is_file() and not stale.is_symlink():
            stale.unlink(missing_ok=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, file_mode())


@contextmanager
def staged_file(out: Path, record_file: Path):
    """Yield a Stage beside `out`; when the block succeeds, fsync and rename it to `out` and its
    `record` (set by the block) to `record_file`, as one step."""
    _remove_stale(out)
    _remove_stale(record_file)
    stage, rec_tmp = Stage(_partial(out)), _partial(record_file)
    try:
        yield stage
        with open(stage.path, "rb+") as fh:
            os.fsync(fh.fileno())
        if stage.record is not None:
            _write_synced(rec_tmp, strict_json(stage.record, indent=2, default=str) + "\n")
        with signals_deferred():
            os.replace(stage.path, out)
            if stage.record is not None:
                os.replace(rec_tmp, record_file)
    except BaseException:
        stage.path.unlink(missing_ok=True)
        rec_tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out.parent)


def _metadata(writer, art: Artifact, hp: Hparams, plans: list[TensorPlan], origin: Origin) -> VocabInfo:
    name = art.meta.get("name") or art.config.get("_name_or_path") or art.path.name
    writer.add_type("model")
    writer.add_name(str(name))
    writer.add_quantized_by(f"quantkit {__version__}")
    writer.add_file_type(int(file_type(plans)))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_hparams(writer, hp)
    info = add_vocab(writer, art.path, hp.vocab_size, art.config)
    # quantkit's own keys (llama.cpp ignores keys it does not know): what the file claims and where it came from
    writer.add_bool("quantkit.lossless", all(p.exact for p in plans))
    writer.add_string("quantkit.version", __version__)
    writer.add_string("quantkit.source.sha256", origin.source_sha256)  # eval's baseline check compares it
    writer.add_string("quantkit.artifact.sha256", origin.artifact_sha256)
    if (
        origin.provenance is not None
    ):  # a GGUF moved away from its record still carries eval's baseline and overlap checks
        writer.add_string("quantkit.provenance", strict_json(origin.provenance, default=str))
    writer.add_string("quantkit.mapping", strict_json(mapping_summary(plans)))
    if art.meta.get("quantization"):
        writer.add_string("quantkit.quantization", strict_json(art.meta["quantization"], default=str))
    return info


def _byte_shape(shape: tuple[int, ...], qtype: str) -> tuple[int, ...]:
    return gguf.quant_shape_to_byte_shape(shape, getattr(gguf.GGMLQuantizationType, qtype))


def write(tmp: Path, art: Artifact, hp: Hparams, plans: list[TensorPlan], origin: Origin) -> Written:
    """Write the GGUF at `tmp`; return per-tensor checks and the vocabulary summary."""

    extra = extra_tensors(art.path, hp)
    writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, hp.spec.gguf_arch)])
    try:
        info = _metadata(writer, art, hp, plans, origin)
        for p in plans:
            shape = _byte_shape(p.shape, p.qtype)
            writer.add_tensor_info(
                p.name,
                shape,
                np.dtype(np.uint8),
                int(np.prod(shape)),
                raw_dtype=getattr(gguf.GGMLQuantizationType, p.qtype),
            )
        for name, arr in extra.items():
            writer.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes)
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        checks = {}
        for p in plans:
            data, checks[p.name] = tensor_bytes(art, p)
            writer.write_tensor_data(data)
            del data
        for arr in extra.values():
            writer.write_tensor_data(arr)
        writer.flush()
    finally:
        writer.close()
    _check_table(tmp, plans, extra)
    return Written(checks, info, sorted(extra))


def _check_table(path: Path, plans: list[TensorPlan], extra: dict) -> None:
    """The written file reads back with exactly the planned tensors, types and shapes."""
    reader = open_reader(path)
    got = {t.name: (t.tensor_type.name, tuple(int(x) for x in reversed(t.shape.tolist()))) for t in reader.tensors}
    want = {p.name: (p.qtype, p.shape) for p in plans}
    want.update({n: ("F32", a.shape) for n, a in extra.items()})
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:1]
        raise RuntimeError(f"the written GGUF's tensor table differs from the plan ({diff})")
