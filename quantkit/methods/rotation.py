"""Rotations before quantization (transform steps): SpinQuant's offline R1/R2 through
llm-compressor's SpinQuantModifier, fused into the weights so the artifact needs nothing at run time.

Online rotations (QuIP, SpinQuant R3/R4) are refused when the recipe is read (recipe.ONLINE_REFUSED).
"""

from __future__ import annotations

import torch

from quantkit.errors import RecipeError
from quantkit.methods.patches import llmcompressor_spinquant_keep_embeddings

# Architectures whose module names match SpinQuant's default mapping and whose norms are plain
# RMSNorm (x * w), so fuse_norm_linears is exact; each is converted in tests/test_methods_rotation.py.
# Gemma's norms scale by (1 + w), others fuse q/k/v or add norms after the MLP: not supported.
SPINQUANT_ARCHITECTURES = ("llama", "mistral", "qwen2")


def modifiers(transform) -> list:
    if transform is None:
        return []
    from llmcompressor.modifiers.transform import SpinQuantModifier

    llmcompressor_spinquant_keep_embeddings()
    return [
        SpinQuantModifier(
            rotations=list(transform.rotations),
            transform_type=transform.transform_type,
            transform_block_size=transform.block_size,
        )
    ]


def _sizes(cfg: dict, rotations) -> dict[str, int]:
    """The dimension each rotation acts on: R1 the hidden size, R2 the head dimension."""
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    return {r: {"R1": hidden, "R2": head_dim}[r] for r in rotations}


def _constructible(kind: str, n: int) -> bool:
    """Whether compressed-tensors can build a rotation of order n of this kind."""
    if kind == "random-matrix" or n & (n - 1) == 0:
        return True
    if kind == "hadamard":  # deterministic (Sylvester) Hadamard: powers of two only
        return False
    from compressed_tensors.transform.utils.hadamard import random_hadamard_matrix

    try:  # a known Hadamard matrix of order k with n / k a power of two
        random_hadamard_matrix(n, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    except ValueError:
        return False
    return True


def check(cfg: dict, transform, key: str) -> None:
    """At preflight, before loading: the architecture is supported and every rotation can be built."""
    arch = cfg.get("model_type")
    if arch not in SPINQUANT_ARCHITECTURES:
        raise RecipeError(
            f"{key}: spinquant supports the {', '.join(SPINQUANT_ARCHITECTURES)} architectures "
            f"(module names and RMSNorm fusing checked); this model is {arch!r}"
        )
    for rot, n in _sizes(cfg, transform.rotations).items():
        size = transform.block_size if transform.block_size and rot == "R1" else n
        if transform.block_size and rot == "R1" and n % transform.block_size:
            raise RecipeError(f"{key}.block_size: {transform.block_size} does not divide the hidden size {n}")
        if not _constructible(transform.transform_type, size):
            pow2 = [b for b in (32, 64, 128, 256, 512) if n % b == 0]
            hint = f"; block_size: {pow2[-1]} or " if pow2 else "; "
            raise RecipeError(
                f"{key}: {rot} needs a {transform.transform_type} rotation of order {size}, which compressed-tensors "
                f"cannot build (hadamard: powers of two){hint}transform_type: random-hadamard or random-matrix"
            )
