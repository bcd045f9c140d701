"""Writing the GGUF: header and metadata first, then each tensor streamed one at a time.

The file is written under a temp name beside the target, fsync'ed and renamed into place only when
every tensor has passed its check and the file reads back with the planned tensor table; a failure
(or Ctrl-C) removes the temp file, so the target is never half written. A kill -9 can leave a
`.NAME.partial-*` file, which the next export to the same target removes.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..atomic import fsync_dir
from .arch import Hparams, add_hparams, extra_tensors
from .plan import TensorPlan, file_type, mapping_summary
from .read import open_reader
from .source import Artifact
from .tensors import tensor_bytes
from .vocab import VocabInfo, add_vocab


@contextmanager
def staged_file(out: Path):
    """Yield a temp path beside `out`; fsync and rename it to `out` when the block succeeds."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        stale.unlink(missing_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out.parent)


def _metadata(writer, art: Artifact, hp: Hparams, plans: list[TensorPlan], source_hash: str) -> VocabInfo:
    import gguf

    from .. import __version__

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
    writer.add_string("quantkit.source.sha256", source_hash)
    writer.add_string("quantkit.mapping", json.dumps(mapping_summary(plans)))
    if art.meta.get("quantization"):
        writer.add_string("quantkit.quantization", json.dumps(art.meta["quantization"], default=str))
    return info


def _byte_shape(shape: tuple[int, ...], qtype: str) -> tuple[int, ...]:
    import gguf

    return gguf.quant_shape_to_byte_shape(shape, getattr(gguf.GGMLQuantizationType, qtype))


def write(tmp: Path, art: Artifact, hp: Hparams, plans: list[TensorPlan], source_hash: str) -> dict:
    """Write the GGUF at `tmp`; return per-tensor checks and the vocabulary summary."""
    import gguf

    extra = extra_tensors(art.path, hp)
    writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, hp.spec.gguf_arch)])
    try:
        info = _metadata(writer, art, hp, plans, source_hash)
        for p in plans:
            shape = _byte_shape(p.shape, p.qtype)
            writer.add_tensor_info(p.name, shape, np.dtype(np.uint8), int(np.prod(shape)), raw_dtype=getattr(gguf.GGMLQuantizationType, p.qtype))
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
    return {"checks": checks, "vocab": info, "extra_tensors": sorted(extra)}


def _check_table(path: Path, plans: list[TensorPlan], extra: dict) -> None:
    """The written file reads back with exactly the planned tensors, types and shapes."""
    reader = open_reader(path)
    got = {t.name: (t.tensor_type.name, tuple(int(x) for x in reversed(t.shape.tolist()))) for t in reader.tensors}
    want = {p.name: (p.qtype, p.shape) for p in plans}
    want.update({n: ("F32", a.shape) for n, a in extra.items()})
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:1]
        raise RuntimeError(f"the written GGUF's tensor table differs from the plan ({diff})")
