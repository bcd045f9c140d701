"""Reading an artifact for export: its tensors by module, each weight either dense or as
compressed-tensors stores it (integer codes, scales, zero points), without building the model.

Which scheme a module has is decided as compressed-tensors decides it (an exact name target, then a
`re:` target, then a class-name target such as `Linear`), and then checked against the tensors
themselves (packed width, scale and zero-point shapes), so an artifact that is not what its config
claims is refused rather than exported wrong.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from quantkit.errors import ModelError
from quantkit.models.checkpoint import check_checkpoint, read_config, read_json

QUANT_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")
# compressed-tensors formats whose weights are integer codes on a uniform grid (the others, fp8,
# nvfp4, mxfp4, marlin-24 and sparse formats, have no exact ggml counterpart).
INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")


@dataclass(frozen=True)
class Scheme:
    """What the artifact says one module's weight is."""

    bits: int
    symmetric: bool
    strategy: str  # "group" | "channel"
    group_size: int | None
    fmt: str
    actorder: str | None


@dataclass(frozen=True)
class QuantWeight:
    """A quantized weight unpacked: w = (codes - zero) * scale, one (scale, zero) per row and group."""

    codes: torch.Tensor  # int8 [rows, cols]
    scale: torch.Tensor  # [rows, n_groups], the stored dtype
    zero: torch.Tensor | None  # int8 [rows, n_groups], None when symmetric
    g_idx: torch.Tensor | None  # column -> group, when the artifact stores one
    scheme: Scheme


class Artifact:
    """An artifact directory opened for reading; use as a context manager (it holds shard handles)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        check_checkpoint(self.path)  # config sizes, safetensors headers, truncation, shards named in the index
        self.config = read_config(self.path)
        self.meta = read_json(self.path / "quantkit.json") if (self.path / "quantkit.json").is_file() else {}
        self.quant = self.config.get("quantization_config")
        self._stack = ExitStack()
        self._where: dict[str, object] = {}

    def __enter__(self) -> "Artifact":
        for shard in sorted(self.path.glob("*.safetensors")):
            handle = self._stack.enter_context(safe_open(str(shard), framework="pt"))
            for key in handle.keys():
                if key in self._where:
                    raise ModelError(f"{self.path}: tensor {key} appears in two shards")
                self._where[key] = handle
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    # ------------------------------------------------------------------ tensors

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def tensor(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._where[name].get_slice(name).get_dtype()

    def quantized_modules(self) -> list[str]:
        mods = {n.rsplit(".", 1)[0] for n in self._where if n.rsplit(".", 1)[-1] in ("weight_packed", "weight_scale")}
        return sorted(mods)

    # ------------------------------------------------------------------ schemes

    def scheme(self, module: str) -> Scheme:
        """The config group that governs `module` (compressed-tensors' precedence), checked for export."""
        groups = (self.quant or {}).get("config_groups") or {}
        candidates = []
        for gname, group in groups.items():
            for target in group.get("targets") or []:
                rank = _target_rank(module, str(target))
                if rank is not None:
                    candidates.append((rank, gname, group))
        if not candidates:
            raise ModelError(f"{self.path}: {module} has quantized tensors but no quantization_config group targets it")
        _, gname, group = min(candidates, key=lambda c: c[0])
        w = group.get("weights") or {}
        fmt = group.get("format") or self.quant.get("format")
        if fmt not in INT_FORMATS:
            raise ModelError(
                f"{module}: compressed-tensors format {fmt!r} has no exact GGUF type "
                f"(integer formats: {', '.join(INT_FORMATS)})"
            )
        if w.get("type", "int") != "int" or not isinstance(w.get("num_bits"), int):
            raise ModelError(f"{module}: {w.get('type')} weights of {w.get('num_bits')} bits have no exact GGUF type")
        strategy = w.get("strategy") or ("group" if w.get("group_size") else "channel")
        if strategy not in ("group", "channel"):
            raise ModelError(
                f"{module}: the {strategy!r} weight strategy has no GGUF counterpart (group and channel do)"
            )
        acts = group.get("input_activations")
        if acts and not acts.get("dynamic"):
            raise ModelError(
                f"{module}: static input-activation quantization (calibrated input scales) is part of this "
                "artifact's model and llama.cpp cannot apply it"
            )
        return Scheme(
            int(w["num_bits"]), bool(w.get("symmetric", True)), strategy, w.get("group_size"), fmt, w.get("actorder")
        )

    def quant_params(
        self, module: str
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, tuple[int, int], Scheme]:
        """Scale, zero point (unpacked), g_idx and the weight's shape, without unpacking the codes."""
        sch = self.scheme(module)
        rows, cols = self._weight_shape(module, sch)
        scale = self.tensor(f"{module}.weight_scale")
        if scale.dim() == 1:
            scale = scale.reshape(-1, 1)
        n_groups = 1 if sch.strategy == "channel" else _groups(cols, sch.group_size, module)
        if tuple(scale.shape) != (rows, n_groups) or not scale.is_floating_point():
            raise ModelError(
                f"{module}.weight_scale has shape {tuple(scale.shape)} ({scale.dtype}); "
                f"a {sch.strategy} scheme over a {rows}x{cols} weight needs {rows}x{n_groups}"
            )
        if not bool(torch.isfinite(scale).all()):
            raise ModelError(f"{module}.weight_scale has non-finite values")
        zero = self._zero(module, sch, rows, n_groups)
        g_idx = self.tensor(f"{module}.weight_g_idx") if self.has(f"{module}.weight_g_idx") else None
        return scale, zero, g_idx, (rows, cols), sch

    def quant_weight(self, module: str) -> QuantWeight:
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

        scale, zero, g_idx, (rows, cols), sch = self.quant_params(module)
        if self.has(f"{module}.weight_packed"):
            codes = unpack_from_int32(self.tensor(f"{module}.weight_packed"), sch.bits, torch.Size((rows, cols)))
        else:
            codes = self.tensor(f"{module}.weight")
        lo, hi = -(1 << (sch.bits - 1)), (1 << (sch.bits - 1)) - 1
        if codes.dtype != torch.int8 or int(codes.min()) < lo or int(codes.max()) > hi:
            raise ModelError(f"{module}: weight codes are not {sch.bits}-bit integers in [{lo}, {hi}]")
        return QuantWeight(codes, scale, zero, g_idx, sch)

    def _weight_shape(self, module: str, sch: Scheme) -> tuple[int, int]:
        if self.has(f"{module}.weight_packed"):
            if not self.has(f"{module}.weight_shape"):
                raise ModelError(f"{module}: weight_packed without weight_shape")
            rows, cols = (int(v) for v in self.tensor(f"{module}.weight_shape").tolist())
            packed = self.shape(f"{module}.weight_packed")
            if self.dtype(f"{module}.weight_packed") != "I32" or packed != (rows, math.ceil(cols * sch.bits / 32)):
                raise ModelError(
                    f"{module}.weight_packed has shape {packed}; {sch.bits}-bit codes of a {rows}x{cols} "
                    f"weight pack into {rows}x{math.ceil(cols * sch.bits / 32)} int32"
                )
            return rows, cols
        if not self.has(f"{module}.weight") or self.dtype(f"{module}.weight") != "I8":
            raise ModelError(f"{module}: a quantized module without weight_packed or an int8 weight")
        rows, cols = self.shape(f"{module}.weight")
        return rows, cols

    def _zero(self, module: str, sch: Scheme, rows: int, n_groups: int) -> torch.Tensor | None:
        name = f"{module}.weight_zero_point"
        if not self.has(name):
            if not sch.symmetric:
                raise ModelError(f"{module}: asymmetric weights without weight_zero_point")
            return None
        zp = self.tensor(name)
        if sch.fmt == "pack-quantized" and zp.dtype == torch.int32:
            from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

            if tuple(zp.shape) != (math.ceil(rows * sch.bits / 32), n_groups):
                raise ModelError(
                    f"{name} has shape {tuple(zp.shape)}, not packed {sch.bits}-bit zero points for {rows}x{n_groups}"
                )
            zp = unpack_from_int32(zp, sch.bits, torch.Size((rows, n_groups)), packed_dim=0)
        if zp.is_floating_point() or zp.numel() != rows * n_groups:
            raise ModelError(f"{name}: expected integer zero points of shape {rows}x{n_groups}")
        zp = zp.reshape(rows, n_groups).to(torch.int8)
        if sch.symmetric:  # some writers store all-zero points for symmetric weights
            if bool(zp.any()):
                raise ModelError(f"{module}: the config says symmetric but the artifact stores non-zero zero points")
            return None
        return zp


def _target_rank(module: str, target: str) -> int | None:
    """compressed-tensors' precedence (utils/match.py match_targets): exact name, regex, class name.

    A class-name target (`Linear`) cannot be checked without the model; modules that carry quantized
    tensors are the ones it matched when the artifact was written, and the tensors are checked after."""
    from compressed_tensors.utils.match import match_name

    if target == module:
        return 0
    if target.startswith("re:"):
        return 1 if match_name(module, target) else None
    if "." not in target:
        return 2
    return None


def _groups(cols: int, group_size, module: str) -> int:
    if not isinstance(group_size, int) or group_size <= 0:
        raise ModelError(f"{module}: group strategy without a positive group_size")
    return math.ceil(cols / group_size)


def quant_method(art: Artifact) -> str | None:
    """None for a dense checkpoint, else the quant_method the config names."""
    if not art.quant:
        return None
    return str(art.quant.get("quant_method", "unknown"))
