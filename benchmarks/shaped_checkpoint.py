#!/usr/bin/env python3
"""Build a random-weight checkpoint in the exact shape of a public model, for cost and speed work.

RANDOM WEIGHTS: its accuracy means nothing. Perplexity, KL and task scores measured on it say
nothing about quantization quality; only bytes, FLOPs, wall time and memory carry over.

What is real: the architecture (model_type, every layer's shape, q/k/v biases for Qwen2, RoPE
settings), the vocabulary size and so the embedding and LM-head sizes, bf16 safetensors shards
with an index, as the hub ships them. What is not: the weights (normal(0, initializer_range),
norms 1, biases 0, seeded per tensor name, so a tensor is the same whatever the shard order), and
the tokenizer: the demo's (SmolLM2, 49,152 tokens) is reused, so token ids stay below 49,152
while the embedding keeps its real row count (Qwen's own config also has more embedding rows
than tokenizer entries). No hub download is needed or made.

  python benchmarks/shaped_checkpoint.py llama3.2-1b --out shapes/llama3.2-1b
  python benchmarks/shaped_checkpoint.py --list
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantkit.core.hardware import SHAPE_ARCH, SHAPES  # noqa: E402

# What the shape table leaves out, from each model's public config.json.
ARCH_EXTRAS: dict[str, dict] = {
    "llama3.2-1b": dict(
        hub_id="meta-llama/Llama-3.2-1B",
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2.5-0.5b": dict(
        hub_id="Qwen/Qwen2.5-0.5B",
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "smollm2-135m": dict(
        hub_id="HuggingFaceTB/SmolLM2-135M",
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    ),
}
SHARD_BYTES = 2 * 10**9  # the hub's usual shard size for models of this class
NOTE = "RANDOM WEIGHTS in a real model's shape, for cost/speed measurements only: accuracy figures on it mean nothing."


def build_config(shape: str, tokenizer):
    from transformers import AutoConfig

    extras = {k: v for k, v in ARCH_EXTRAS.get(shape, {}).items() if k != "hub_id"}
    params = {**SHAPES[shape], **extras}  # the public config's figures over the shape table's (e.g. the context)
    return AutoConfig.for_model(
        SHAPE_ARCH.get(shape, "llama"),
        **params,
        dtype="bfloat16",
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def init_tensor(name: str, shape: tuple[int, ...], std: float, seed: int):
    """The tensor for `name`: seeded by (seed, name) alone; generated in float32, stored as bf16."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight":
        return torch.ones(shape, dtype=torch.bfloat16)
    if leaf == "bias":
        return torch.zeros(shape, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return (torch.randn(shape, generator=g) * std).to(torch.bfloat16)


def tensor_specs(config) -> list[tuple[str, tuple[int, ...]]]:
    """Every stored tensor's name and shape, from the model built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # Tied weights are stored once (under the embedding's name), as save_pretrained does.
    state = model.state_dict()
    tied = config.tie_word_embeddings and "lm_head.weight" in state
    return [(n, tuple(t.shape)) for n, t in state.items() if not (tied and n == "lm_head.weight")]


def write_shards(out: Path, specs, std: float, seed: int) -> tuple[int, int]:
    """bf16 shards of at most SHARD_BYTES and model.safetensors.index.json; returns (params, bytes)."""
    from safetensors.torch import save_file

    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = 2 * _numel(shape)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map, total = {}, 0
    for i, group in enumerate(shards, 1):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: init_tensor(n, s, std, seed) for n, s in group}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for n, s in group:
            weight_map[n] = fname
            total += _numel(s)
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": 2 * total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total, 2 * total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def build(shape: str, out: Path, seed: int, force: bool) -> dict:
    from transformers import GenerationConfig

    from quantkit.models.checkpoint import load_tokenizer
    from quantkit.models.resolve import resolve_path

    if out.exists() and not force:
        raise SystemExit(f"{out} exists; pass --force to replace it")
    tok = load_tokenizer(resolve_path("demo"))
    config = build_config(shape, tok)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        params, nbytes = write_shards(tmp, tensor_specs(config), config.initializer_range, seed)
        config.save_pretrained(str(tmp))
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        info = {
            "name": f"random-{shape}",
            "base_model": f"random weights in the shape of {ARCH_EXTRAS.get(shape, {}).get('hub_id', shape)}",
            "random_weights": True,
            "shape": shape,
            "seed": seed,
            "parameters": params,
            "weight_bytes": nbytes,
            "tokenizer": "the demo's (SmolLM2, 49,152 tokens); ids >= 49,152 never occur",
            "note": NOTE,
        }
        (tmp / "quantkit-source.json").write_text(json.dumps(info, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="?", help=f"one of: {', '.join(SHAPES)}")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    ap.add_argument("--list", action="store_true", help="list the shapes")
    args = ap.parse_args()
    if args.list or not args.shape:
        for name, dims in SHAPES.items():
            print(f"{name:14s} {SHAPE_ARCH.get(name, 'llama'):6s} {dims}")
        return
    if args.shape not in SHAPES:
        raise SystemExit(f"unknown shape {args.shape!r}; known: {', '.join(SHAPES)}")
    out = (args.out or Path(f"random-{args.shape}")).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    info = build(args.shape, out, args.seed, args.force)
    print(json.dumps({"path": str(out), **info}, indent=2))


if __name__ == "__main__":
    main()
