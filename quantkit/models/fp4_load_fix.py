"""Narrow workaround for a compressed-tensors 0.19 fault: FP4 weights (NVFP4, MXFP4) decompress to
bfloat16 whatever dtype transformers loads the model at.

Upstream fault: `NVFP4PackedCompressor.decompress` (compressors/nvfp4/base.py; the MXFP4
compressor inherits it) unpacks the codes with `unpack_fp4_from_uint8`'s default dtype, bfloat16,
and dequantizes in it. A model loaded at float16 or float32 then holds bfloat16 weights in its
linears and its first forward fails ("expected m1 and m2 to have the same dtype ... Half !=
BFloat16"); and NVFP4's w = q * (s / g) is rounded through bfloat16 where the model's own fake
quantization (`forward_quantize`, which the in-memory model ran) computes in the model's dtype, so
the reloaded model is not the one that was converted (verification KL 1.9e-5 on the tiny fixture
once the dtypes agree by a cast). Upstream fixed it (compressed-tensors#839) and reverted the fix
(#858: "we need the model's dtype to be passed to decompress_model").

Fix: pass it. While `ModelCompressor.decompress_model` runs, FP4 codes unpack to the dtype of the
model's input embeddings (the dtype it is being loaded at), so each weight is dequantized in that
dtype with compressed-tensors' own arithmetic. Other formats, and FP4 decompression outside a model
load, are untouched. `tests/test_methods_fp4.py` converts both formats at float16 (the reload fails
without the fix) and reloads at float32.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch

_DTYPE: ContextVar = ContextVar("quantkit_fp4_decompress_dtype", default=None)
_MARK = "_quantkit_fp4_dtype_fix"


def install() -> None:
    """Patch compressed-tensors once per process (idempotent); call before transformers loads a checkpoint."""
    from compressed_tensors.compressors.model_compressors.model_compressor import ModelCompressor
    from compressed_tensors.compressors.nvfp4 import base as nvfp4_base

    if getattr(ModelCompressor.decompress_model, _MARK, False):
        return
    original_decompress, original_unpack = ModelCompressor.decompress_model, nvfp4_base.unpack_fp4_from_uint8

    def decompress_model(self, model):
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        token = _DTYPE.set(getattr(getattr(embeddings, "weight", None), "dtype", None))
        try:
            return original_decompress(self, model)
        finally:
            _DTYPE.reset(token)

    def unpack_fp4_from_uint8(a, m, n, dtype=None):
        return original_unpack(a, m, n, dtype=dtype or _DTYPE.get() or torch.bfloat16)  # bfloat16: upstream default

    setattr(decompress_model, _MARK, True)
    ModelCompressor.decompress_model = decompress_model
    nvfp4_base.unpack_fp4_from_uint8 = unpack_fp4_from_uint8  # the name NVFP4PackedCompressor.decompress calls
