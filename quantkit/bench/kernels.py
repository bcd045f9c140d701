"""Low-bit linear layers for benchmarking on real kernels (never decompressed to 16 bits).

The kernels are PyTorch's own weight-only int4/int8 matmuls, the ones gpt-fast and torchao's
CPU layouts call:
- int4, CPU:  aten._weight_int4pack_mm_for_cpu   (AVX-512/AVX2; groups 32/64/128/256)
- int4, CUDA: aten._weight_int4pack_mm           (tinygemm; bf16 activations)
- int8, any:  aten._weight_int8pack_mm           (per-channel scales)
- W8A8:       torch._int_mm after dynamic per-token int8 quantization of the activation
- FP8 W8A8:   torch._scaled_mm (e4m3 x e4m3, row-wise scales) after dynamic per-token FP8
              quantization of the activation, where the device has FP8 matmuls (`fp8_kernel_missing`)
Both int4 kernels compute w = (q_u - 8) * scale + zero with q_u in [0, 15]; compressed-tensors
stores signed q in [-8, 7] with w = (q - zp) * scale, so q_u = q + 8 and zero = -zp * scale.

These kernels are built for decode (one row). For a prefill of many rows they were 3-4x slower
than a bf16 GEMM on this CPU (demo model, 256-token prompt: TTFT 650 ms int8, 540 ms int4, 160 ms
bf16), so from PREFILL_ROWS rows on, the weight-only layers dequantize their stored integers to
bf16 for that one call and run a dense GEMM, as llama.cpp does for batches. Nothing dense is kept:
decode reads the int8/int4 weights, and the bytes per token are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INT4_GROUPS = (32, 64, 128, 256)
PREFILL_ROWS = 32  # from this many rows, dequantize for the call and use a dense GEMM
CPU_BLOCK_N = 64  # _convert_weight_to_int4pack_for_cpu packs 64 output rows per block


def unpack_int4_cpu(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """q_u (n, k) back from `_convert_weight_to_int4pack_for_cpu`'s layout: viewed as (n/64, k, 32)
    bytes, byte (b, j, t) holds rows 64b + t (low nibble) and 64b + 32 + t (high) of column j.
    The layout is ATen's, not a public format: each layer checks it at construction and keeps
    the int4 kernel for prefill too where it does not hold."""
    blocks = packed.view(n // CPU_BLOCK_N, k, CPU_BLOCK_N // 2)
    both = torch.cat([blocks & 0xF, blocks >> 4], dim=2)  # (n/64, k, 64)
    return both.permute(0, 2, 1).reshape(n, k)


class Int4WeightOnlyLinear(nn.Module):
    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        zp: torch.Tensor | None,
        group_size: int,
        bias: torch.Tensor | None,
        device,
        dtype=torch.bfloat16,
        inner_k_tiles: int = 8,
    ):
        super().__init__()
        device = torch.device(device)
        n, k = q.shape
        if group_size not in INT4_GROUPS or k % group_size:
            raise ValueError(f"int4 kernel needs a group size in {INT4_GROUPS} dividing {k}")
        self.in_features, self.out_features, self.group_size = k, n, group_size
        scale = scale.float().reshape(n, k // group_size)
        zero = torch.zeros_like(scale) if zp is None else -zp.float().reshape(n, -1) * scale
        self.register_buffer(
            "scales_and_zeros", torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(dtype).to(device)
        )
        q_u = (q.to(torch.int32) + 8).to(device)
        self._cuda = device.type == "cuda"  # the one branch on the device: which kernel
        if self._cuda:
            self.kernel = "aten._weight_int4pack_mm (tinygemm)"
            packed = (q_u[:, ::2] << 4 | q_u[:, 1::2]).to(torch.uint8)
            self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack(packed, inner_k_tiles))
        else:
            self.kernel = "aten._weight_int4pack_mm_for_cpu"
            self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q_u, 1))
        self.register_buffer("bias", None if bias is None else bias.to(dtype).to(device))
        self._dense_prefill = (
            not self._cuda
            and n % CPU_BLOCK_N == 0
            and torch.equal(unpack_int4_cpu(self.weight, n, k), q_u.to(torch.uint8))
        )

    def dequantized(self) -> torch.Tensor:
        """The bf16 weight (n, k) from the packed int4 values, scales and zeros."""
        n, k, g = self.out_features, self.in_features, self.group_size
        q = unpack_int4_cpu(self.weight, n, k).to(self.scales_and_zeros.dtype).view(n, k // g, g) - 8
        sz = self.scales_and_zeros.transpose(0, 1)  # (n, groups, 2)
        return (q * sz[..., :1] + sz[..., 1:]).view(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self._dense_prefill and x2.shape[0] >= PREFILL_ROWS:
            y = F.linear(x2, self.dequantized())
        elif self._cuda:
            y = torch.ops.aten._weight_int4pack_mm(x2, self.weight, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.weight, self.group_size, self.scales_and_zeros)
        y = y.reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int8WeightOnlyLinear(nn.Module):
    """Per-channel int8 weights; an asymmetric zero point becomes a rank-1 correction."""

    kernel = "aten._weight_int8pack_mm"

    def __init__(
        self, q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None, bias, device, dtype=torch.bfloat16
    ):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight", q.to(torch.int8).contiguous().to(device))
        self.register_buffer("scales", scale.reshape(-1).to(dtype).to(device))
        corr = None if zp is None else (zp.float().reshape(-1) * scale.float().reshape(-1)).to(dtype).to(device)
        self.register_buffer("zero_correction", corr)
        self.register_buffer("bias", None if bias is None else bias.to(dtype).to(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.shape[0] >= PREFILL_ROWS and x2.device.type == "cpu":
            y = F.linear(x2, self.weight.to(x2.dtype) * self.scales[:, None])
        else:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, self.scales)
        if self.zero_correction is not None:
            y = y - x2.sum(-1, keepdim=True) * self.zero_correction
        y = y.reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int8DynamicActivationLinear(nn.Module):
    """W8A8: int8 per-channel weights, activations quantized per token at run time, int8 GEMM."""

    kernel = "torch._int_mm (int8 x int8 -> int32), dynamic per-token activations"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias, device, dtype=torch.bfloat16):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight_t", q.to(torch.int8).t().contiguous().to(device))
        self.register_buffer("scales", scale.reshape(1, -1).float().to(device))
        self.register_buffer("bias", None if bias is None else bias.to(dtype).to(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        x_scale = x2.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 127.0
        xq = torch.round(x2 / x_scale).clamp(-128, 127).to(torch.int8)
        rows = xq.shape[0]
        if rows <= 16:  # torch._int_mm needs more than 16 rows; pad (decode has one)
            xq = F.pad(xq, (0, 0, 0, 17 - rows))
        acc = torch._int_mm(xq, self.weight_t)[:rows]
        y = (acc.float() * x_scale * self.scales).to(x.dtype).reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448, E4M3's largest finite value: a row's absmax maps onto it


def fp8_kernel_missing(device, dynamic: bool, n: int, k: int) -> str | None:
    """Why an FP8 layer of `n` x `k` cannot run as FP8 on `device` (None: torch._scaled_mm runs it).

    FP8 tensor cores start at CUDA compute capability 8.9 (Ada, Hopper). torch also has a CPU
    `_scaled_mm`, but it widens the operands inside and ran ~20x slower than the bf16 GEMM of the
    same layer (2048 x 2048, one row, AVX-512 without AMX-FP8): a conversion, not a kernel to time.
    FP8 weights with 16-bit activations (w8a16) have no torch kernel on any device."""
    if not dynamic:
        return "no FP8 weight-only (W8A16) matmul in torch"
    if device.type != "cuda":
        return f"no FP8 matmul kernel on {device.type}"
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 9):
        return f"no FP8 tensor cores on compute capability {cc[0]}.{cc[1]} (FP8 needs 8.9 or later)"
    if n % 16 or k % 16:
        return f"torch._scaled_mm needs both dimensions a multiple of 16, this layer is {n} x {k}"
    return None


def fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token FP8: each row's absmax onto FP8_MAX, as compressed-tensors' FP8_DYNAMIC
    does (scale = absmax / 448, then a cast to E4M3). Returns the E4M3 rows and their float32 scales."""
    scale = (x.abs().amax(-1, keepdim=True).float() / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """FP8 E4M3 weights with a scale per output channel; with `dynamic`, each input row rounded to
    FP8 per token at run time (FP8_DYNAMIC), else activations left in 16 bits (w8a16).

    Where the device has an FP8 matmul the weights stay FP8 and torch._scaled_mm multiplies. Where
    it has none (`emulated` says why) the weights are dequantized to `dtype` (the engine's) once, at
    load, and a GEMM in it runs on the FP8-rounded activations: the arithmetic transformers does on
    such a device, timed at that dtype's bytes per weight, which is what the bytes per token then count. Only the
    stored weight and the matmul call differ between the two; `use_kernel` forces the choice (tests)."""

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        bias,
        device,
        dynamic: bool,
        dtype=torch.bfloat16,
        use_kernel: bool | None = None,
    ):
        super().__init__()
        device = torch.device(device)
        self.out_features, self.in_features = q.shape
        self.dynamic = dynamic
        self.emulated = (
            fp8_kernel_missing(device, dynamic, *q.shape)
            if use_kernel is None
            else (None if use_kernel else "emulation asked for")
        )
        if self.emulated is None:
            self.kernel = "torch._scaled_mm (FP8 e4m3, row-wise scales), dynamic per-token FP8 activations"
            self.register_buffer(
                "weight_t", q.to(FP8).to(device).t()
            )  # column-major, as _scaled_mm takes its second operand
            self.register_buffer("scales", scale.reshape(1, -1).float().to(device))
        else:
            self.kernel = f"F.linear on {str(dtype).removeprefix('torch.')} weights dequantized from FP8" + (
                " (activations rounded to FP8 per token)" if dynamic else ""
            )
            self.register_buffer("weight", (q.float() * scale.float().reshape(-1, 1)).to(dtype).to(device))
        self.register_buffer("bias", None if bias is None else bias.to(dtype).to(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.dynamic:
            xq, x_scale = fp8_per_token(x2)
        if self.emulated is not None:
            y = F.linear((xq.float() * x_scale).to(x.dtype) if self.dynamic else x2, self.weight)
        else:
            rows = xq.shape[0]
            pad = -rows % 16  # _scaled_mm takes row counts in multiples of 16; decode has one
            y = torch._scaled_mm(
                F.pad(xq.view(torch.uint8), (0, 0, 0, pad)).view(FP8),
                self.weight_t,
                scale_a=F.pad(x_scale, (0, 0, 0, pad), value=1.0),
                scale_b=self.scales,
                out_dtype=x.dtype,
            )[:rows]
        y = y.reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias
