"""What llama-quantize gave each tensor of a GGUF, read back from the file: its ggml type, the
types' counts, the bits per weight (all tensors, the 2-D weights, the decoder layers' linears as
models/sizes.py counts them) and the weights whose rows no block of the requested type divides
(llama-quantize gives them a 32-block type instead). gguf/llama_quantize.py records it; the
Pareto front prices a type by it (pipeline/pareto.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf

from quantkit.gguf.read import open_reader

# A llama-quantize type (a mix, "mostly X") -> its main ggml tensor type: K-quant mixes drop their
# size letter; IQ2_M and IQ3_M/IQ3_XS mixes are built on IQ2_S and IQ3_S (llama-quant.cpp).
MAIN_TYPE = {"IQ2_M": "IQ2_S", "IQ3_M": "IQ3_S", "IQ3_XS": "IQ3_S"}


def main_type(qtype: str) -> str:
    return MAIN_TYPE.get(qtype) or re.sub(r"^(Q\d_K)_[SML]$", r"\1", qtype)


def ggml_block(qtype: str) -> int:
    """Values per block of `qtype`'s main tensor type (ggml-common.h, as the gguf library lists it)."""

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[main_type(qtype)]][0]


# The decoder layers' linear weights: what quantkit's bits/weight counts (models/sizes.py), by GGUF name.
LAYER_LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")


@dataclass(frozen=True)
class TypeReport:
    """What llama-quantize gave each tensor, and the bits per weight that makes."""

    type_of: dict[str, str]  # tensor name -> its ggml type, in the file's order
    requested: str
    block: int  # values per block of the requested type's main type
    tensor_types: dict[str, int]  # ggml type -> tensors
    weight_types: dict[str, int]  # the same, 2-D weights only
    bits_per_weight: float  # all tensors
    bits_per_weight_2d: float
    bits_per_weight_layers: float  # the decoder layers' linears
    layer_bytes: int  # the decoder layers' linears, as models/sizes.py counts them
    layer_weights: int
    fallbacks: list[dict]  # 2-D weights whose rows no block divides: tensor, row, type
    fallback_types: dict[str, int]

    @property
    def tensors(self) -> tuple[dict, ...]:
        """Each tensor's name and type, as the export record lists them."""
        return tuple({"name": n, "type": t} for n, t in self.type_of.items())


def type_report(tensors: list[tuple[str, tuple[int, ...], str, int]], requested: str) -> TypeReport:
    """From (name, shape in ggml order (row length first), type, bytes) of every tensor: the count
    per type, bits per weight (all tensors; the 2-D weights; the decoder layers' linears), and the 2-D weights whose
    row length is no multiple of the requested type's block (llama-quantize gave them another type)."""
    counts = Counter(t for _, _, t, _ in tensors)
    weights = [(n, s, t, b) for n, s, t, b in tensors if len(s) == 2]
    block = ggml_block(requested)
    fallbacks = [(n, s[0], t) for n, s, t, _ in weights if s[0] % block]

    def bpw(rows) -> float:
        elems = sum(_numel(s) for _, s, _, _ in rows)
        return 8 * sum(b for *_, b in rows) / elems if elems else 0.0

    layers = [w for w in weights if LAYER_LINEAR.fullmatch(w[0])]
    return TypeReport(
        type_of={n: t for n, _, t, _ in tensors},
        requested=requested,
        block=block,
        tensor_types=dict(sorted(counts.items())),
        weight_types=dict(sorted(Counter(t for _, _, t, _ in weights).items())),
        bits_per_weight=bpw(tensors),
        bits_per_weight_2d=bpw(weights),
        bits_per_weight_layers=bpw(layers),
        layer_bytes=sum(b for *_, b in layers),
        layer_weights=sum(_numel(s) for _, s, _, _ in layers),
        fallbacks=[{"tensor": n, "row": row, "type": t} for n, row, t in fallbacks],
        fallback_types=dict(sorted(Counter(t for *_, t in fallbacks).items())),
    )


def layer_sizes(report: TypeReport) -> tuple[int, int]:
    """A type_report's decoder-layer linears: (their bytes, their weights)."""
    return report.layer_bytes, report.layer_weights


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def read_types(path: Path, requested: str) -> TypeReport:
    """type_report of a GGUF file, read with the gguf library (through gguf.read's safe opener)."""

    reader = open_reader(path)
    rows = [(t.name, tuple(int(x) for x in t.shape), t.tensor_type.name, int(t.n_bytes)) for t in reader.tensors]
    return type_report(rows, requested)
