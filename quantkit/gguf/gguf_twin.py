"""A GGUF's twin: the same architecture, layers, attention heads, head size, vocabulary and tokenizer,
with the hidden and feed-forward widths cut to TWIN_WIDTH and random F16 weights. llama.cpp runs it
through the same graph (every layer's operations, attention over the same K/V geometry, the same
sampling loop), so its decode time is the engine's fixed cost per step plus attention, with almost
no weight bytes: what bench's attribution measures the fixed costs on (bench/twin_timing.py).

Tensors are shrunk by their role in llama.cpp's naming (the dimension that is the hidden width or
the feed-forward width); a tensor of a role not known here (experts, fused projections of other
architectures) leaves the model without a twin, with the reason. The head size is written out
(`{arch}.attention.key_length`/`value_length`), since llama.cpp would otherwise derive it from
the hidden width.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import gguf
import numpy as np

from quantkit.core.attribution import TWIN_WIDTH
from quantkit.errors import QuantkitError
from quantkit.gguf.read import field_value, open_reader

VERSION = 1  # bump when the twin's recipe changes: the cached file is keyed by it

# role suffix (after `blk.N.`, or the whole name) -> for each dimension in ggml order (ne0, ne1):
# "H" the hidden width, "F" the feed-forward width, None kept as it is
ROLES: dict[str, tuple] = {
    "token_embd.weight": ("H", None),
    "output.weight": ("H", None),
    "output_norm.weight": ("H",),
    "output_norm.bias": ("H",),
    "attn_norm.weight": ("H",),
    "attn_norm.bias": ("H",),
    "ffn_norm.weight": ("H",),
    "ffn_norm.bias": ("H",),
    "post_attention_norm.weight": ("H",),
    "post_ffw_norm.weight": ("H",),
    "attn_q.weight": ("H", None),
    "attn_k.weight": ("H", None),
    "attn_v.weight": ("H", None),
    "attn_q.bias": (None,),
    "attn_k.bias": (None,),
    "attn_v.bias": (None,),
    "attn_q_norm.weight": (None,),
    "attn_k_norm.weight": (None,),
    "attn_output.weight": (None, "H"),
    "attn_output.bias": ("H",),
    "ffn_gate.weight": ("H", "F"),
    "ffn_up.weight": ("H", "F"),
    "ffn_gate.bias": ("F",),
    "ffn_up.bias": ("F",),
    "ffn_down.weight": ("F", "H"),
    "ffn_down.bias": ("H",),
    "rope_freqs.weight": (None,),
}
_BLOCK = re.compile(r"blk\.\d+\.(.+)")


def role(name: str) -> tuple | None:
    m = _BLOCK.fullmatch(name)
    return ROLES.get(m.group(1) if m else name)


def twin_shapes(tensors: list[tuple[str, tuple[int, ...]]], width: int = TWIN_WIDTH) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in the twin (ggml order), or QuantkitError naming one whose role is unknown."""
    out = {}
    for name, shape in tensors:
        r = role(name)
        if r is None or len(r) != len(shape):
            raise QuantkitError(f"no twin: tensor {name} {list(shape)} has no role quantkit knows")
        out[name] = tuple(width if want else dim for dim, want in zip(shape, r))
    return out


def _key(path: Path, width: int) -> str:
    st = path.stat()
    return hashlib.sha256(f"{VERSION}:{width}:{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def write_twin(source: Path, where: Path, width: int = TWIN_WIDTH, seed: int = 0) -> Path:
    """The twin of GGUF `source` under directory `where` (made once per source file and width; a
    finished twin is renamed into place, so a killed write leaves none)."""
    out = where / f"twin-{_key(source, width)}.gguf"
    if out.is_file():
        return out
    reader = open_reader(source)
    arch = field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise QuantkitError(f"no twin: {source} names no general.architecture")
    tensors = [(t.name, tuple(int(x) for x in t.shape.tolist())) for t in reader.tensors]
    shapes = twin_shapes(tensors, width)
    heads = field_value(reader, f"{arch}.attention.head_count")
    hidden = field_value(reader, f"{arch}.embedding_length")
    if not isinstance(heads, int) or not isinstance(hidden, int) or heads <= 0:
        raise QuantkitError(f"no twin: {source} has no integer {arch}.attention.head_count / embedding_length")
    head_dim = field_value(reader, f"{arch}.attention.key_length") or hidden // heads
    v_dim = field_value(reader, f"{arch}.attention.value_length") or head_dim
    changed = {
        f"{arch}.embedding_length": (width, gguf.GGUFValueType.UINT32),
        f"{arch}.feed_forward_length": (width, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.key_length": (int(head_dim), gguf.GGUFValueType.UINT32),
        f"{arch}.attention.value_length": (int(v_dim), gguf.GGUFValueType.UINT32),
    }
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".{out.name}.partial-{os.getpid()}"
    writer = gguf.GGUFWriter(path=None, arch=arch)
    try:
        _copy_fields(reader, writer, changed)
        rng = np.random.default_rng(seed)
        arrays = {}
        for name, shape in shapes.items():
            np_shape = tuple(reversed(shape))  # numpy order: the last axis is ggml's ne0
            if len(shape) == 1:  # norms and biases: F32, norms at one so activations stay finite
                arr = np.ones(np_shape, np.float32) if "norm" in name else np.zeros(np_shape, np.float32)
            else:
                arr = (rng.standard_normal(np_shape, dtype=np.float32) * 0.02).astype(np.float16)
            arrays[name] = arr
            writer.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes)
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for arr in arrays.values():
            writer.write_tensor_data(arr)
        writer.flush()
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out


def _copy_fields(reader, writer, changed: dict) -> None:
    """Every key of the source (the tokenizer included) except the widths `changed` replaces."""
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in changed:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for key, (value, vtype) in changed.items():
        writer.add_key_value(key, value, vtype)
