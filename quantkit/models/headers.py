"""Safetensors headers, read within bounds, and each 16-bit float tensor's bytes checked against
the dtype its header gives.

A header is JSON of at most safetensors' own limit (MAX_HEADER_BYTES); a larger length field is
a crafted or broken file, refused before a byte of it is parsed. What a tensor's entry says is
checked where the checkpoint is read, never trusted later: offsets inside the file, and a
sample of its values plausible in its labelled dtype. F16 and BF16 have the same size, so a
header that relabels one as the other passes every size check, and the model then computes on
garbage (an F16 payload read as BF16 is mostly values near 1e-13; converting it "verified"
with mean KL NaN).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from quantkit.errors import ModelError

# safetensors refuses a header longer than this (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
# Values read per 16-bit tensor for its dtype check: one run from its middle, 1 KiB.
SAMPLE_VALUES = 512
# Fewer non-zero values than this in the sample say nothing about a distribution (a zero bias).
MIN_VALUES = 16
# The median magnitude of a real weight tensor lies within what F16 can hold at all (its smallest
# subnormal to its largest value): that is why 16-bit checkpoints work. An F16 payload read as
# BF16 puts it near 2^(8k-7) for F16 weights of typical magnitude 2^k: 1e-13 for weights near
# 0.03, far below; BF16 payloads read as F16 are squeezed into [0.25, 4) and are not caught here.
PLAUSIBLE = (2.0**-24, 65504.0)
FLOAT16 = {"F16": torch.float16, "BF16": torch.bfloat16}
OTHER16 = {"F16": "BF16", "BF16": "F16"}


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file, as its header gives it."""

    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offsets of its bytes in the file
    end: int


def read_header(path: Path) -> tuple[int, dict]:
    """The length field and the parsed JSON header; one line for a header that is too long for
    safetensors, longer than the file, or not a JSON object of tensor entries."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > MAX_HEADER_BYTES:
                raise ModelError(
                    f"{path}: not a valid safetensors file (a header of {n:,} bytes; safetensors reads at most "
                    f"{MAX_HEADER_BYTES:,})"
                )
            if n <= 0 or n > size - 8:
                raise ValueError
            header = json.loads(fh.read(n))
    except (ValueError, struct.error, UnicodeDecodeError, RecursionError):
        raise ModelError(f"{path}: not a valid safetensors file (corrupt or truncated header)") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    return n, header


def entries(path: Path) -> dict[str, Entry]:
    """name -> Entry of every tensor in one safetensors file; offsets checked against the file."""
    n, header = read_header(path)
    items = [(k, v) for k, v in header.items() if k != "__metadata__"] if isinstance(header, dict) else None
    if items is None or not all(_well_formed(v) for _, v in items):
        raise ModelError(
            f"{path}: not a valid safetensors file (its header is not a table of tensors with a dtype, a shape "
            "and data_offsets)"
        )
    out = {
        k: Entry(v["dtype"], tuple(v["shape"]), 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
        for k, v in items
    }
    _check_layout(path, out, 8 + n)
    size, end = path.stat().st_size, max((e.end for e in out.values()), default=8 + n)
    if end > size:
        raise ModelError(f"{path}: truncated safetensors file ({size} bytes, header promises {end})")
    return out


# Bytes per value of safetensors' dtypes; a dtype not listed here is left to safetensors to judge.
ITEMSIZE = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0"), 1),
    **dict.fromkeys(("I16", "U16", "F16", "BF16"), 2),
    **dict.fromkeys(("I32", "U32", "F32"), 4),
    **dict.fromkeys(("I64", "U64", "F64"), 8),
}


def _check_layout(path: Path, table: dict[str, Entry], base: int) -> None:
    """What safetensors checks when it loads, said before anything loads: every tensor's bytes run
    forwards from the end of the header, hold exactly its shape in its dtype, and no two overlap."""
    for name, e in table.items():
        why = None
        if e.start < base or e.end < e.start:
            why = "its data_offsets are negative or run backwards"
        elif e.dtype in ITEMSIZE and e.end - e.start != ITEMSIZE[e.dtype] * math.prod(e.shape):
            why = (
                f"its {e.dtype} shape {list(e.shape)} takes {ITEMSIZE[e.dtype] * math.prod(e.shape)} bytes, "
                f"its data_offsets give it {e.end - e.start}"
            )
        if why:
            raise ModelError(f"{path}: not a valid safetensors file (tensor {name}: {why})")
    spans = sorted((e.start, e.end, name) for name, e in table.items() if e.end > e.start)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise ModelError(f"{path}: not a valid safetensors file (the data of {first} and {second} overlap)")


def _well_formed(v) -> bool:
    """A tensor entry: a dtype name, a shape of non-negative integers, two integer data_offsets."""
    if not isinstance(v, dict) or not isinstance(v.get("dtype"), str):
        return False
    offsets, shape = v.get("data_offsets"), v.get("shape")
    return (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
        and isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    )


def checkpoint_entries(path: Path) -> dict[str, Entry]:
    """Every tensor of a checkpoint directory's *.safetensors files (empty without any)."""
    out: dict[str, Entry] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(entries(f))
    return out


def check_values(path: Path, table: dict[str, Entry]) -> None:
    """A sample of every F16/BF16 tensor read in its labelled dtype: finite, and of a magnitude a
    weight can have (PLAUSIBLE); one line naming the tensor and its dtype otherwise. At most
    SAMPLE_VALUES values (1 KiB) are read per tensor."""
    with open(path, "rb") as fh:
        for name, e in table.items():
            count = math.prod(e.shape) if e.shape else 0
            if e.dtype not in FLOAT16 or count == 0:
                continue
            take = min(count, SAMPLE_VALUES)
            fh.seek(e.start + 2 * ((count - take) // 2))
            raw = fh.read(2 * take)
            if len(raw) == 2 * take:
                _check_sample(path, name, e.dtype, raw)


def _check_sample(path: Path, name: str, dtype: str, raw: bytes) -> None:
    values = torch.frombuffer(bytearray(raw), dtype=FLOAT16[dtype]).float()
    if not bool(torch.isfinite(values).all()):
        raise ModelError(
            f"{path}: tensor {name} ({dtype}) holds non-finite values (NaN or infinity); the weights are broken"
        )
    typical = median_magnitude(values)
    if typical is None or PLAUSIBLE[0] <= typical <= PLAUSIBLE[1]:
        return
    other = OTHER16[dtype]
    alt = median_magnitude(torch.frombuffer(bytearray(raw), dtype=FLOAT16[other]).float())
    hint = (
        f"; read as {other} they are (typical {alt:.3g}): {other} data labelled {dtype}?"
        if alt is not None and PLAUSIBLE[0] <= alt <= PLAUSIBLE[1]
        else ""
    )
    raise ModelError(
        f"{path}: tensor {name} is labelled {dtype} but its bytes are not {dtype} weights (typical magnitude "
        f"{typical:.3g} read as {dtype}; weights lie between {PLAUSIBLE[0]:.2g} and {PLAUSIBLE[1]:g}){hint}"
    )


def median_magnitude(values) -> float | None:
    """The median |x| of the finite non-zero values, or None when there are too few to tell."""
    mags = values[torch.isfinite(values) & (values != 0)].abs()
    return float(mags.median()) if mags.numel() >= MIN_VALUES else None


def tensor_bytes(path: Path) -> dict[str, int]:
    """name -> bytes, from every *.safetensors header in a checkpoint directory."""
    return {name: e.end - e.start for name, e in checkpoint_entries(path).items()}
