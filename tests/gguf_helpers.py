"""Helpers for the GGUF tests: read a GGUF back under the artifact's names, the artifact's own
dequantized weights, and hand-crafted compressed-tensors artifacts with grids GGUF cannot hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch


def hf_name_map(record: dict) -> dict:
    """GGUF tensor name -> (artifact tensor name, heads of the q/k row permutation or None)."""
    return {t["name"]: (t["source"], t["rope_permuted_heads"]) for t in record["tensors"]}


def gguf_tensors(path: Path, names: dict) -> dict[str, torch.Tensor]:
    """Every tensor of the GGUF dequantized with gguf.quants.dequantize, q/k rows back in transformers' order."""
    import gguf

    from quantkit.gguf.grids import rope_unpermute

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name not in names:
            continue
        src, heads = names[t.name]
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        w = w.reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        out[src] = rope_unpermute(w, heads) if heads else w
    return out


def artifact_weights(path: Path, dtype) -> dict[str, torch.Tensor]:
    """The artifact's weights as transformers + compressed-tensors decompress them, in `dtype`."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    cfg = json.loads((Path(path) / "config.json").read_text())
    kw = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if "quantization_config" in cfg else {}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw)
    return {k: v for k, v in model.state_dict().items() if v.is_floating_point()}


LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CASES = {  # name -> (bits, symmetric, group size or -1, scale dtype, g_idx kind)
    "g16": (4, True, 16, torch.float16, None),
    "permuted-g-idx": (4, True, 32, torch.float16, "columns"),
    "blockwise-g-idx": (4, True, 32, torch.float16, "blocks"),
    "bf16-scales": (4, True, 32, torch.bfloat16, None),
    "bf16-exact-scales": (4, True, 32, torch.bfloat16, None),
    "int8-asym": (8, False, -1, torch.float16, None),
    "int2": (2, True, 32, torch.float16, None),
}


def _quantize(w: torch.Tensor, bits: int, symmetric: bool, group: int, scale_dtype):
    rows, cols = w.shape
    g = cols if group == -1 else group
    wg = w.float().reshape(rows, cols // g, g)
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if symmetric:
        scale = (wg.abs().amax(-1) / qmax).clamp_min(1e-6).to(scale_dtype)
        zero = torch.zeros_like(scale, dtype=torch.int8)
    else:
        lo, hi = wg.amin(-1), wg.amax(-1)
        scale = ((hi - lo) / (qmax - qmin)).clamp_min(1e-6).to(scale_dtype)
        zero = (qmin - torch.round(lo / scale.float())).clamp(qmin, qmax).to(torch.int8)
    codes = torch.round(wg / scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)).clamp(qmin, qmax).to(torch.int8)
    return codes.reshape(rows, cols), scale, zero


def craft_artifact(src: Path, out: Path, case: str) -> Path:
    """A compressed-tensors pack-quantized artifact of `src` with one of CASES' grids (packed with
    compressed-tensors' own pack_to_int32); its exact weights are saved as reference.pt beside it."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from safetensors.torch import load_file, save_file

    bits, sym, group, sdtype, gidx = CASES[case]
    shutil.copytree(src, out)
    state = load_file(str(out / "model.safetensors"))
    new, ref = {}, {}
    gen = torch.Generator().manual_seed(0)
    for name, t in state.items():
        mod = name[: -len(".weight")]
        if not (name.endswith(".weight") and mod.split(".")[-1] in LINEARS):
            new[name] = t
            continue
        rows, cols = t.shape
        codes, scale, zero = _quantize(t, bits, sym, group, sdtype)
        if case == "bf16-scales":
            scale[0, 0] = torch.tensor(1.1e-6, dtype=torch.bfloat16)  # below fp16's normal range: not an fp16 value
        col_group = torch.arange(cols) // (cols if group == -1 else group)
        if gidx == "columns":
            col_group = col_group[torch.randperm(cols, generator=gen)]
        elif gidx == "blocks":
            col_group = (col_group.reshape(-1, 32)[torch.randperm(cols // 32, generator=gen)]).reshape(-1)
        new[f"{mod}.weight_packed"] = pack_to_int32(codes, bits)
        new[f"{mod}.weight_scale"] = scale
        new[f"{mod}.weight_shape"] = torch.tensor([rows, cols])
        if gidx:
            new[f"{mod}.weight_g_idx"] = col_group.to(torch.int32)
        if not sym:
            new[f"{mod}.weight_zero_point"] = pack_to_int32(zero, bits, packed_dim=0)
        ref[name] = (codes.float() - zero.float()[:, col_group]) * scale.float()[:, col_group]
    save_file(new, str(out / "model.safetensors"))
    torch.save(ref, out / "reference.pt")
    cfg = json.loads((out / "config.json").read_text())
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": sym,
        "strategy": "channel" if group == -1 else "group",
        "group_size": None if group == -1 else group,
        "actorder": "group" if gidx else None,
        "dynamic": False,
    }
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "format": "pack-quantized"}},
        "ignore": ["lm_head"],
    }
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def rerecord(artifact: Path) -> Path:
    """Re-record an artifact's manifest after a test changed its files on purpose, so the export's
    own checks (not the manifest's) meet the change."""
    from quantkit.core.integrity import manifest

    meta_file = Path(artifact) / "quantkit.json"
    meta = json.loads(meta_file.read_text())
    meta["files"] = manifest(Path(artifact), fsync=False)
    meta_file.write_text(json.dumps(meta))
    return artifact


def flip_tensor_bytes(shard: Path, suffix: str, n: int = 4096) -> str:
    """Invert the first `n` bytes of the data of the first tensor whose name ends with `suffix`, in
    place (the file keeps its size); returns the tensor's name."""
    blob = bytearray(Path(shard).read_bytes())
    hlen = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + hlen])
    name = next(k for k in sorted(header) if k.endswith(suffix))
    start, end = header[name]["data_offsets"]
    lo = 8 + hlen + start
    for i in range(lo, min(lo + n, 8 + hlen + end)):
        blob[i] ^= 0xFF
    Path(shard).write_bytes(bytes(blob))
    return name


def without_quantkit_keys(gguf_file: Path, out: Path) -> Path:
    """A copy of a GGUF whose quantkit.* keys are renamed (same length, so the file stays valid):
    a GGUF as another tool would have written it."""
    import gguf

    data = Path(gguf_file).read_bytes()
    end = gguf.GGUFReader(str(gguf_file)).data_offset
    out.write_bytes(data[:end].replace(b"quantkit.", b"imported.") + data[end:])
    return out


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root (links not followed) -> its sha256; links -> their target."""
    import hashlib
    import os

    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def exact_json(**changes) -> dict:
    """An exact export's record as gguf/artifact_to_gguf.py writes it, of made-up values (no export
    needed), with `changes`."""
    from quantkit.gguf.gguf_records import ConvertedFrom, ExportedFrom, GgufRecord, MappingLine, Verification

    record = GgufRecord(
        gguf="/models/tiny.gguf",
        sha256="12" * 32,
        bytes=1_000_000,
        source=ExportedFrom("/models/tiny", "34" * 32, "tiny", None),
        origin=ConvertedFrom("34" * 32, "/models/tiny"),
        architecture="llama",
        model_type="llama",
        lossless=True,
        mapping=(MappingLine("BF16 -> F16", 3, True),),
        tensor_types={"F16": 2, "F32": 1},
        tensors=(),
        verification=Verification("every tensor dequantized and compared", 3, 3, 0.0),
        lossy_tensors=(),
        extra_tensors=(),
        vocab={"model": "llama", "tokens": 256},
        notes=(),
        tool_versions={"quantkit": "0.0", "gguf": "0.0"},
        gguf_quant_version=2,
        kl_vs_artifact=None,
        wall_seconds=1.0,
    )
    return {**record.to_json(), **changes}


def kquant_json(exact: dict, mixed: bool = True) -> dict:
    """llama-quantize's record as gguf/llama_quantize.py writes it (the tools need not be installed)."""
    rec = {
        "kind": exact["kind"],
        "schema_version": exact["schema_version"],
        "gguf": "/models/tiny.Q4_K_M.gguf",
        "sha256": "ab" * 32,
        "bytes": 2_000_000,
        **{k: exact[k] for k in ("source", "origin", "architecture", "model_type")},
        "lossless": False,
        "gguf_type": "Q4_K_M",
        "mapping": [{"mapping": "F16 -> Q4_K_M (llama-quantize, imatrix)", "tensors": 3, "exact": False}],
        "tensor_types": {"F32": 1, "Q4_K": 1, "Q6_K": 1},
        "weight_types": {"Q4_K": 1, "Q6_K": 1},
        "bits_per_weight": 4.9,
        "bits_per_weight_2d": 4.8,
        "bits_per_weight_layers": 4.5,
        "fallbacks": [{"tensor": "blk.0.ffn_down.weight", "row": 96, "type": "Q5_0"}],
        "fallback_types": {"Q5_0": 1},
        "block": 256,
        "tensors": [{"name": "a", "type": "F32"}, {"name": "b", "type": "Q4_K"}, {"name": "c", "type": "Q6_K"}],
        "imatrix": {
            "sha256": "cd" * 32,
            "text_sha256": "ef" * 32,
            "chunk_tokens": 64,
            "chunks_max": 4,
            "seconds": 1.5,
            "reused": False,
            "tool": "llama-imatrix",
            "calibration": {"source": "file:text.txt", "samples": 4, "seq_len": 64},
        },
        "f16": {"bytes": 4_000_000, "sha256": "01" * 32},
        "vocab": exact["vocab"],
        "notes": ["1 weights have rows of 96 values, no multiple of Q4_K_M's 256-value block: ..."],
        "tool_versions": {**exact["tool_versions"], "llama-quantize": "b1", "llama.cpp build": "abc"},
        "wall_seconds": 12.5,
    }
    if mixed:
        rec["mixed"] = {
            "reference_bytes": 2_100_000,
            "budget_bytes": 1_500_000,
            "candidates": ["Q4_K", "Q6_K"],
            "windows": [{"samples": 4}],
            "cost_reference": 0.02,
            "cost_chosen": 0.01,
            "weights": [{"tensor": "b", "type": "Q4_K"}],
            "gptq": {"windows": 4, "proxy_before": 2.0, "proxy_after": 1.0},
        }
    return rec
