"""Checking and loading checkpoints (what names them: models/resolve.py)."""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import re
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

from quantkit.core.atomic import write_text
from quantkit.core.integrity import sha256_file
from quantkit.errors import ModelError
from quantkit.home import subdir
from quantkit.models import fp4_load_fix, headers, kv_scheme
from quantkit.models import offload as offloading


def check_checkpoint(path: Path, *, allow_pickle: bool = False) -> None:
    """Refuse what would fail later with a traceback, or run without bound: no config, pickles,
    truncated or crafted safetensors, tensors whose bytes are not their dtype, a config that
    describes other weights than the headers hold."""
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
            check_config(read_config(path), path / "config.json")
            return
        raise ModelError(f"{path}: no *.safetensors weights")
    cfg = read_config(path)
    check_config(cfg, path / "config.json")
    tables = [(shard, check_safetensors_file(shard)) for shard in shards]
    table: dict[str, headers.Entry] = {name: e for _, t in tables for name, e in t.items()}
    check_against_weights(cfg, table, path / "config.json")
    kv_scheme.check_scales(cfg, tables)  # an FP8 KV cache's k_scale/v_scale: shape, dtype, values
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelError(f"{index}: no 'weight_map' of tensor names to shard files")
        names = set(weight_map.values())
        if any(Path(n).name != n or n in (".", "..") for n in names):
            raise ModelError(f"{index}: weight_map names shard files outside the checkpoint directory")
        missing = sorted(n for n in names if not (path / n).is_file())
        if missing:
            raise ModelError(f"{path}: missing weight shard {missing[0]} named in model.safetensors.index.json")


def check_safetensors_file(path: Path) -> dict[str, headers.Entry]:
    """Header parses within safetensors' limit, every tensor's bytes lie where its entry says and
    the file holds them (catches truncation), and a sample of each 16-bit tensor is plausible in
    its dtype. Returns the tensors' entries."""
    table = headers.entries(path)
    headers.check_values(path, table)
    return table


# Every file that decides what the model computes: its config, its weights in each format a loader
# reads (safetensors; pickles: PyTorch's .bin/.pt/.pth, loaded with --allow-pickle) and the model code
# of a --trust-remote-code checkpoint. Tokenizer files are left out: `eval` compares vocabularies
# itself, and re-saving a tokenizer (another transformers version) must not change a model's identity.
# A checkpoint with only config.json and *.safetensors hashes as it always has.
HASHED_PATTERNS = ("config.json", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.py")


def hashed_files(path: Path) -> list[Path]:
    return sorted({f for pattern in HASHED_PATTERNS for f in path.glob(pattern) if f.is_file()})


def checkpoint_hash(path: Path) -> str:
    """sha256 over the files that define the model (HASHED_PATTERNS); cached by (path, size, mtime)."""

    files = hashed_files(path)
    stamp = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32]
    memo = subdir("hashes") / f"{key}.txt"
    if memo.is_file():
        cached = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", cached):
            return cached
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        try:
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
        except OSError as exc:
            raise ModelError(f"{f}: cannot read ({exc.strerror or type(exc).__name__})") from None
    digest = h.hexdigest()
    write_text(memo, digest)
    return digest


def content_hash(path: Path) -> str:
    """What a step's cache key names a model by: a checkpoint directory's checkpoint_hash, or a
    file's sha256 (a GGUF variant)."""

    return sha256_file(path) if path.is_file() else checkpoint_hash(path)


def read_json(file: Path) -> dict:
    """A JSON object from a checkpoint's file, or one line naming the file."""
    try:
        data = json.loads(file.read_bytes().decode("utf-8-sig"))
    except OSError as exc:
        raise ModelError(f"{file}: cannot read ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError:
        raise ModelError(f"{file}: not valid JSON (not UTF-8 text; a binary file?)") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{file}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ModelError(f"{file}: not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ModelError(f"{file}: expected a JSON object, found {type(data).__name__}")
    return data


def read_config(path: Path) -> dict:
    return read_json(path / "config.json")


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(cfg: dict) -> int | None:
    """The longest sequence the model was built for: its config's own key, else what transformers
    assumes for its model type (the config class's default, which a GGUF export writes too: Llama's
    2048); None where neither says."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    for key in CONTEXT_KEYS:
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default_context(text.get("model_type"))


def context_source(cfg: dict) -> str:
    """Where context_length's figure comes from, for a message."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    key = next((k for k in CONTEXT_KEYS if k in text), None)
    if key:
        return f"config.json {key}"
    return f"transformers' default for {text.get('model_type')}: config.json names no max_position_embeddings"


@functools.cache
def default_context(model_type) -> int | None:
    """The context transformers' config class for `model_type` assumes when a config names none."""
    if not isinstance(model_type, str):
        return None
    from transformers import AutoConfig  # heavy: only for a config without its context

    try:
        value = getattr(AutoConfig.for_model(model_type), "max_position_embeddings", None)
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# The sizes every code path reads (preflight's skeleton, roofline, bench, GQA), under their names in
# `transformers.PretrainedConfig` or a common alias (GPT-2's n_embd, T5's d_model, ...). Without them
# transformers quietly takes its class defaults (Llama: hidden 4096, 32 layers) and fails later on a
# shape mismatch, so they are required here.
SIZE_FIELDS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab_size": ("vocab_size",),
}


def check_config(cfg: dict, file: Path) -> None:
    """model_type and positive integer sizes (top level or a multimodal model's text_config)."""
    if not isinstance(cfg.get("model_type"), str) or not cfg["model_type"]:
        raise ModelError(f"{file}: no model_type; not a Hugging Face model config")
    scopes = [cfg] + ([cfg["text_config"]] if isinstance(cfg.get("text_config"), dict) else [])
    missing = []
    for field, names in SIZE_FIELDS.items():
        values = [scope[n] for scope in scopes for n in names if n in scope]
        if not values:
            missing.append(field)
        elif not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise ModelError(f"{file}: {field} must be a positive integer, found {values[0]!r}")
    if missing:
        raise ModelError(f"{file}: missing {', '.join(missing)}; the config does not describe the model's sizes")


# A module list's entries in a tensor name: `model.layers.7.mlp...` -> ("model.layers", 7); the first
# number in a name is its outermost list (experts inside a layer come after the layer's number).
_NUMBERED = re.compile(r"^(.*?)\.(\d+)\.")


def layer_counts(names) -> dict[str, int]:
    """prefix -> entries of each numbered module list in the tensor names (`model.layers` -> 32)."""
    counts: dict[str, int] = {}
    for name in names:
        m = _NUMBERED.match(name)
        if m:
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    return counts


def check_against_weights(cfg: dict, table: dict[str, headers.Entry], file: Path) -> None:
    """The config's sizes against the tensors the headers hold, before any skeleton is built from
    it: a config that claims 10,000,000 layers for weights of 2 builds (and costs) the 10,000,000.
    Layers: no more than the longest numbered module list of the weights (fewer is allowed: a
    checkpoint may carry extra layers, e.g. a multi-token-prediction head). hidden_size and
    vocab_size: some weight has that dimension (the norms, the embedding)."""
    scopes = [cfg] + ([cfg["text_config"]] if isinstance(cfg.get("text_config"), dict) else [])
    counts = layer_counts(table)
    prefix, most = max(counts.items(), key=lambda kv: kv[1], default=("", 0))
    held = f"{most} layers ({prefix}.0 to {prefix}.{most - 1})" if most else "no numbered layers"
    for n in _values(scopes, "num_hidden_layers"):
        if n > most:
            raise ModelError(
                f"{file}: num_hidden_layers is {n:,} but the weights hold {held}; the config does not describe "
                "this checkpoint's weights"
            )
    dims = {d for e in table.values() for d in e.shape}
    for field in ("hidden_size", "vocab_size"):
        for n in _values(scopes, field):
            if n not in dims:
                raise ModelError(
                    f"{file}: {field} is {n:,} but no weight has a dimension of {n:,}; the config does not describe "
                    "this checkpoint's weights"
                )


def _values(scopes: list[dict], field: str) -> list[int]:
    return [s[n] for s in scopes for n in SIZE_FIELDS[field] if isinstance(s.get(n), int)]


# Tokenizer files transformers reads as JSON; a broken one otherwise surfaces as a bare KeyError or a
# JSONDecodeError that does not say which file.
TOKENIZER_JSON = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)


def load_tokenizer(path: Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    for name in TOKENIZER_JSON:
        if (path / name).is_file():
            read_json(path / name)
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError) as exc:
        raise ModelError(f"{path}: no usable tokenizer ({_first_line(exc)})") from None
    except Exception as exc:  # the `tokenizers` library raises a plain Exception for a malformed tokenizer.json
        if type(exc) is not Exception:
            raise
        raise ModelError(f"{path}/tokenizer.json: not a valid tokenizer ({_first_line(exc)})") from None


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def check_remote_code(path: Path, cfg: dict, trust_remote_code: bool) -> None:
    """A model type transformers does not know, whose code ships with the checkpoint (`auto_map`),
    runs only with --trust-remote-code; without it, say so before anything imports that code."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    auto = cfg.get("auto_map") if isinstance(cfg.get("auto_map"), dict) else {}
    if cfg.get("model_type") in CONFIG_MAPPING or trust_remote_code:
        if trust_remote_code and cfg.get("model_type") not in CONFIG_MAPPING and "AutoModelForCausalLM" not in auto:
            raise ModelError(
                f"{path}/config.json: model_type {cfg.get('model_type')!r} is unknown to transformers and its "
                "auto_map names no AutoModelForCausalLM class to load"
            )
        return
    if auto:
        files = sorted({str(v).split(".")[0] + ".py" for v in auto.values() if isinstance(v, str)})
        raise ModelError(
            f"{path}: model_type {cfg.get('model_type')!r} is defined by code in the checkpoint ({', '.join(files)}); "
            "pass --trust-remote-code to run it (it runs with your permissions), or use a supported model"
        )
    raise ModelError(
        f"{path}: unsupported architecture {cfg.get('model_type')!r}: transformers does not know this model type"
    )


def load_faults() -> tuple[type[BaseException], ...]:
    """What transformers raises for a checkpoint it cannot load: a bad file or config, not a fault of ours."""

    return (OSError, ValueError, KeyError, RuntimeError, ImportError, StrictDataclassError, SafetensorError)


def one_line(exc: BaseException, limit: int = 240) -> str:
    """An exception's message on one line (transformers' config validation errors span several)."""
    text = " ".join(str(exc).split())
    return text[:limit] if text else type(exc).__name__


def check_loading_info(path: Path, info: dict) -> None:
    """Refuse weights the checkpoint lacks or holds in another shape than its config describes:
    transformers initialises those at random and carries on."""
    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:
        key, found, expected = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise ModelError(
            f"{path}: {key} has shape {list(found)} in the weights but the config.json describes {list(expected)}{more}"
        )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelError(
            f"{path}: the checkpoint has no weights for {missing[0]}{more}; "
            "transformers would fill them with random values"
        )


def load_model(
    path: Path,
    *,
    dtype: str = "bfloat16",
    device: str = "cpu",
    trust_remote_code: bool = False,
    offload=None,
    offload_folder: Path | None = None,
):
    """Load a causal LM as a user would (transformers, quantization config honoured); with an
    `offload.OffloadPlan`, through compressed-tensors' CPU/disk offloading at the plan's precision.

    Weights the checkpoint lacks are an error: transformers would initialise them at random and
    carry on (a checkpoint missing one q_proj loaded "fine")."""
    from transformers import AutoModelForCausalLM

    check_remote_code(path, read_config(path), trust_remote_code)
    fp4_load_fix.install()  # FP4 weights decompress at the model's dtype (compressed-tensors 0.19 fault)
    try:
        if offload is not None:
            return offloading.load(path, offload, offload_folder, trust_remote_code=trust_remote_code)
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path),
            dtype=getattr(torch, dtype),
            trust_remote_code=trust_remote_code,
            device_map=device,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, by name and shape
        )
    except pickle.UnpicklingError:  # torch's weights_only loader refused a pickle: its advice (turn it off) is not ours
        raise ModelError(
            f"{path}: {_pickles(path)} holds objects other than tensors, which PyTorch's safe loader (weights_only) "
            "refuses: loading it could run code; quantkit does not load it (convert the weights to safetensors "
            "where you trust them)"
        ) from None
    except load_faults() as exc:
        raise ModelError(
            f"{path}: failed to load the model{' with offloading' if offload else ''} ({one_line(exc)})"
        ) from None
    check_loading_info(path, info)
    model.eval()
    return model


def _pickles(path: Path) -> str:
    """The checkpoint's pickle weight file, or its pickle files (the refused one is among them)."""
    files = sorted(f.name for pattern in ("*.bin", "*.pt", "*.pth") for f in path.glob(pattern))
    if len(files) == 1:
        return files[0]
    return f"one of its pickle files ({', '.join(files)})" if files else "a pickle file"


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
    kept = {
        name: buf.detach().clone()
        for name, buf in model.named_buffers()
        if buf.is_floating_point() and _non_persistent(model, name)
    }
    # NVFP4's per-tensor global scales stay float32, as compressed-tensors computes them and vLLM
    # declares them (an fp16 one overflows once a tensor's largest weight is below 448 * 6 / 65504):
    # removed and registered again, since assigning into the offload cache would round in place.
    scales = {name: p.detach().clone() for name, p in model.named_parameters() if name.endswith("_global_scale")}
    model = model.to(dtype)
    for name, buf in kept.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner).register_buffer(leaf, buf, persistent=False)
    for name, scale in scales.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        delattr(module, leaf)
        module.register_parameter(leaf, torch.nn.Parameter(scale, requires_grad=False))
    return model


def _non_persistent(model, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(owner)._non_persistent_buffers_set
