"""Reading an artifact for export: its tensors by module, each weight either dense or as
compressed-tensors stores it (integer codes, scales, zero points; or FP4 codes and block scales),
without building the model.

Which scheme a module has is decided as compressed-tensors decides it (an exact name target, then a
`re:` target, then a class-name target such as `Linear`), read as facts (models/scheme_facts.py),
and then checked against the tensors themselves (packed width, scale and zero-point shapes), so an
artifact that is not what its config claims is refused rather than exported wrong.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from quantkit.errors import ModelError
from quantkit.gguf import grids
from quantkit.models import scheme_facts
from quantkit.models.checkpoint import check_checkpoint, read_config, read_json
from quantkit.models.scheme_facts import SchemeFacts

QUANT_SUFFIXES = (
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
    "weight_global_scale",
)
# compressed-tensors formats whose weights are integer codes on a uniform grid (marlin-24 and the
# sparse formats are not), and the packed FP4 formats, by the weight format they hold.
INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
FP4_FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp4": "mxfp4-pack-quantized"}


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
class Fp4Weight:
    """An FP4 weight as stored: codes (sign and E2M1 index, 0..15) and one scale byte per block
    (E4M3 for NVFP4, an E8M0 exponent for MXFP4), and NVFP4's per-tensor global scale."""

    codes: torch.Tensor  # uint8 [rows, cols]
    scale_bytes: torch.Tensor  # uint8 [rows, cols / block]
    global_scale: float | None
    facts: SchemeFacts

    @property
    def block(self) -> int:
        return self.facts.group_size

    def block_scales(self) -> torch.Tensor:
        """Each block's scale, float64, exactly (E4M3 value, or 2^(e - 127))."""
        return (grids.e4m3_values if self.facts.weights == "nvfp4" else grids.e8m0_values)(self.scale_bytes)

    def weight(self) -> torch.Tensor:
        """What compressed-tensors' decompression computes, q * s (/ g), exactly (float64)."""
        return grids.fp4_weight(self.codes, self.block_scales(), self.block, self.global_scale)


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

    def group(self, module: str) -> dict:
        """The config group that governs `module` (compressed-tensors' precedence)."""
        groups = (self.quant or {}).get("config_groups") or {}
        candidates = []
        for gname, group in groups.items():
            for target in group.get("targets") or []:
                rank = _target_rank(module, str(target))
                if rank is not None:
                    candidates.append((rank, gname, group))
        if not candidates:
            raise ModelError(f"{self.path}: {module} has quantized tensors but no quantization_config group targets it")
        return min(candidates, key=lambda c: c[0])[2]

    def facts(self, module: str) -> SchemeFacts:
        """What `module`'s weights are, from its config group; refused where llama.cpp could not apply
        part of the artifact's model (calibrated input scales)."""
        facts = scheme_facts.of_config_group(self.group(module))
        if facts.dynamic is False:
            raise ModelError(
                f"{module}: static input-activation quantization (calibrated input scales) is part of this "
                "artifact's model and llama.cpp cannot apply it"
            )
        return facts

    def _format(self, module: str) -> str | None:
        return self.group(module).get("format") or (self.quant or {}).get("format")

    def scheme(self, module: str) -> Scheme:
        """`module`'s integer scheme, checked for export (tensor_map.py asks only of integer weights)."""
        facts, fmt = self.facts(module), self._format(module)
        if facts.weights != "int":
            raise ModelError(f"{module}: {facts.label} weights are not integer codes; no integer GGUF grid holds them")
        if fmt not in INT_FORMATS:
            raise ModelError(
                f"{module}: compressed-tensors format {fmt!r} has no exact GGUF type "
                f"(integer formats: {', '.join(INT_FORMATS)})"
            )
        if facts.strategy not in ("group", "channel"):
            raise ModelError(
                f"{module}: the {facts.strategy!r} weight strategy has no GGUF counterpart (group and channel do)"
            )
        actorder = (self.group(module).get("weights") or {}).get("actorder")
        return Scheme(facts.bits, facts.symmetric, facts.strategy, facts.group_size, fmt, actorder)

    def fp4_weight(self, module: str, codes: bool = True) -> Fp4Weight:
        """An FP4 module's codes (unpacked unless `codes=False`: the plan reads only scales), block
        scale bytes and global scale, checked against its config."""
        facts, fmt = self.facts(module), self._format(module)
        if facts.weights not in FP4_FORMATS or fmt != FP4_FORMATS[facts.weights] or not facts.symmetric:
            raise ModelError(
                f"{module}: {facts.label} weights in format {fmt!r} are not a packed FP4 format quantkit reads"
            )
        name = f"{module}.weight_packed"
        if not self.has(name) or self.dtype(name) != "U8" or len(self.shape(name)) != 2:
            raise ModelError(f"{module}: an FP4 module without a 2-D uint8 weight_packed")
        rows, half = self.shape(name)
        cols, block = 2 * half, facts.group_size
        want = ("F8_E4M3" if facts.weights == "nvfp4" else "U8", (rows, cols // block))
        scale = f"{module}.weight_scale"
        if cols % block or not self.has(scale) or (self.dtype(scale), self.shape(scale)) != want:
            raise ModelError(
                f"{scale}: {self.dtype(scale) if self.has(scale) else 'missing'} "
                f"{self.shape(scale) if self.has(scale) else ''}; {facts.weights} over a {rows}x{cols} weight "
                f"needs {want[0]} {want[1]}"
            )
        global_scale = None
        if facts.weights == "nvfp4":
            g = f"{module}.weight_global_scale"
            if not self.has(g) or self.shape(g) not in ((1,), ()):
                raise ModelError(f"{module}: NVFP4 weights without a one-value weight_global_scale")
            global_scale = float(self.tensor(g).float().reshape(-1)[0])
            if not (global_scale > 0 and math.isfinite(global_scale)):
                raise ModelError(f"{g} is {global_scale}, not a positive finite scale")
        unpacked = grids.fp4_codes(self.tensor(name)) if codes else torch.empty(rows, 0, dtype=torch.uint8)
        return Fp4Weight(unpacked, self.tensor(scale).view(torch.uint8), global_scale, facts)

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
