"""The interface every bench engine implements; the harness (harness.py) is shared by all.

An engine is one module holding one `Engine` subclass, registered by name in
`engines/__init__.py` (`ENGINES`). The harness, the self-check and the runner only call the
methods below, in this order, so a new engine (llama.cpp, ...) changes nothing around it:

    engine = EngineClass.load(source, settings)   # untimed (reported as load_s)
    engine.logprobs(ids, prompt_len, capacity)    # self-check against a reference, before timing
    prompt = engine.prepare(ids)                  # untimed: the ids where the engine reads them
    engine.reset(capacity)                        # untimed: an empty KV cache for `capacity` tokens
    tok = engine.prefill(prompt)                  # timed: TTFT (prefill + the first greedy token)
    tok = engine.decode(tok, pos)                 # timed, one call per token: TPOT's steps
    engine.sync()                                 # before every clock read
    engine.weight_bytes(); engine.step_bytes(cached, capacity); engine.describe()
    engine.close()

Decode at depth (`bench --depth`): the prefill of `depth` tokens runs once, then each repeat
decodes from that cache and gives it back:

    engine.reset(depth + gen_len)
    tok = engine.prefill(prompt)                  # timed once: TTFT at that depth
    tok = engine.as_token(id)                     # instead, at depth 0: a first token to feed
    tok = engine.decode(tok, depth + i)           # timed: the steps of one repeat
    engine.rewind(depth)                          # untimed: the cache as the prefill left it
    engine.cache_depth()                          # the tokens the cache holds now

Sources: a checkpoint directory (`pathlib.Path`: 16-bit, compressed-tensors or bitsandbytes), a
`synthetic.Synthetic` spec (random weights in a named shape), and for engines that read it a
GGUF file (`Path` ending in .gguf). An engine that cannot take a source raises `QuantkitError`
from `load` with one line saying why.

How a llama.cpp engine fits (llama-cpp-python):
- load: `Llama(model_path=gguf, n_threads=settings.threads or os.cpu_count(), n_ctx=settings.max_tokens,
  logits_all=False, verbose=False)`; a quantkit artifact is exported to GGUF first.
- prepare(ids) -> the list itself; reset(capacity) -> `llm.reset()` (clears the KV cache; check
  capacity <= n_ctx); prefill(ids) -> `llm.eval(ids)` then argmax of the last logits (an int);
  decode(tok, pos) -> `llm.eval([tok])`, argmax; sync() -> nothing (eval returns when done).
- logprobs: eval the prompt, then each later id, taking the last logits after each eval.
- weight_bytes / step_bytes from the GGUF's own tensor types (Q4_0 18 bytes per 32 weights,
  Q8_0 34, Q4_1 20, BF16 64) and llama.cpp's cache (K/V in f16, attention over the used cells).
- describe: kernel "llama.cpp (ggml CPU)", dtype per tensor type, threads = n_threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineSettings:
    """What an engine needs to load. `device` is a resolved `torch.device` (quantkit.device.resolve_device)."""

    device: Any
    max_tokens: int  # the longest sequence any measurement will hold (prompt + generated)
    seed: int = 0
    threads: int | None = None  # CPU threads (None: the library's default)
    tensor_parallel: int = 1  # GPUs (vLLM)
    flash_attn: bool | None = None  # engines with the setting (flash_attn_lever); None: the engine's default
    kv_cache: Any = None  # engines with cache types (kv_cache_lever): a core.kv_cache.LlamaCache; None: the default
    reuse_prefix: bool = False  # later requests reuse an earlier one's cached prompt (decode at depth, vLLM)
    # engines that compute in a torch dtype (computes_in_dtype): a core.precision.Precision, the run's
    # (asked for, or chosen from the device's probe); None: chosen from this device's cached probe
    precision: Any = None


@dataclass(frozen=True)
class WeightBytes:
    """Engine.weight_bytes() of a loaded model: the bytes one decode step reads, the bytes stored,
    whether the output layer shares the embedding's, and (llama.cpp) the bytes per GGUF tensor type."""

    per_token: float
    stored: int | None
    tied_lm_head: bool | None
    by_type: dict | None

    @classmethod
    def of(cls, d: dict) -> WeightBytes:
        return cls(
            d["weight_bytes_per_token"], d["stored_weight_bytes"], d["tied_lm_head"], d.get("weight_bytes_by_type")
        )


@dataclass(frozen=True)
class Described:
    """What a row takes from Engine.describe() besides what it pops (kind, kernel, emulated, notes)."""

    name: str | None
    dtype: str | None
    threads: int | None
    flash_attn: bool | None
    cpu_variant: str | None

    @classmethod
    def of(cls, d: dict) -> Described:
        return cls(d.get("name"), d.get("dtype"), d.get("threads"), d.get("flash_attn"), d.get("cpu_variant"))


class Engine:
    """Batch-1 greedy generation behind the few calls the harness makes.

    Class attributes (capabilities) an engine sets; callers ask these, never the name:
      name      registry name ("eager", "compiled", "vllm", "llamacpp")
      compiles  True when the first calls compile or capture graphs: the harness then runs at
                least one warm-up, so compilation is never timed as decode
      full_logprobs  False when logprobs() reports only some tokens per position (NaN elsewhere):
                the self-check then uses a tail bucket (a lower bound of the KL)
      takes_gguf  True when it runs GGUF files (a checkpoint directory is exported exactly to GGUF
                first): `quantkit run` gives it the variant's exported GGUF
      devices   device types it runs on ("cpu", "cuda"); check() refuses what this machine's
                build cannot do
      tensor_parallel  it spreads one model over several GPUs (--tensor-parallel above 1)
      sizes_own_memory  it sizes its own memory pool: the weights-fit precheck is its to make
      times_itself  it runs in another process and times its own steps there: the harness calls
                timed_run() instead of timing prefill()/decode() across the process boundary
      flash_attn_lever  it has a flash-attention setting (EngineSettings.flash_attn; --flash-attn)
      kv_cache_lever  its KV cache types are a setting of the run (EngineSettings.kv_cache; --kv-cache):
                llama.cpp's; an engine without it holds the cache at its own type (kv_cache_type())
      applies_kv_scheme  it caches K and V as a checkpoint's FP8 kv_cache_scheme says (vLLM): the
                self-check's reference keeps that rounding; for the others it is switched off
      min_depth  the fewest cached tokens it can decode after (--depth), and min_depth_reason why
      anchored  anchor() runs the library's own benchmark beside each row
      computes_in_dtype  its weights and activations are in a torch dtype it is given
                (EngineSettings.precision; --dtype), chosen from the device's probe unless asked;
                the others compute in their own types (a GGUF's, vLLM's)
      attributes  weight_kernels() and twin_source() measure the terms of each row's attribution
                (core/attribution.py) on this engine; where False, `attribution_missing` says why
    Instance attribute:
      step_note None while every decode() call produced exactly one token; else the reason the
                per-step times are not per-token times (the runner then reports no per-step
                statistics and says why; TPOT stays the measured decode time / tokens)
    """

    name = "?"
    compiles = False
    full_logprobs = True
    takes_gguf = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    tensor_parallel = False
    sizes_own_memory = False
    times_itself = False
    flash_attn_lever = False
    kv_cache_lever = False
    applies_kv_scheme = False
    min_depth = 0
    min_depth_reason = ""
    anchored = False
    computes_in_dtype = False
    attributes = False
    attribution_missing = "this engine does not time its kernels apart"
    step_note: str | None = None

    @classmethod
    def check(cls, device) -> None:
        """Before anything loads: raise QuantkitError (one line) when this machine cannot run the
        engine on `device` (its library missing, a build without that device)."""

    @classmethod
    def auto_device(cls, device):
        """The device `--device auto` means for this engine, given the one auto resolved to."""
        return device

    @classmethod
    def default_threads(cls) -> int | None:
        """CPU threads when --threads is not given (None: the library's own default)."""
        return None

    @classmethod
    def depth_advice(cls, flash_attn: bool | None) -> str:
        """What a row far above its bytes' time at depth is told: why, and the setting that helps."""
        return "this engine has no attention setting that changes it"

    @classmethod
    def load(cls, source, settings: EngineSettings) -> "Engine":
        """Load `source` onto `settings.device`, ready to generate."""
        raise NotImplementedError

    @classmethod
    def anchor(cls, info: dict, prompt_len: int, gen_len: int, repeats: int, depth: int | None = None) -> dict | None:
        """The engine's own benchmark on what was timed (`info`: describe()'s dict), as
        {"ttft_ms", "tpot_ms", ...} or {"error": line}; None where the engine has none. With
        `depth`, its decode after `depth` cached tokens ({"tpot_ms", ...}; no TTFT)."""
        return None

    def prepare(self, ids: list[int]) -> Any:
        """The prompt's token ids in the form prefill() takes (a tensor on the device, a list...); untimed."""
        raise NotImplementedError

    def reset(self, capacity: int) -> None:
        """Drop the previous sequence: an empty KV cache able to hold `capacity` tokens."""
        raise NotImplementedError

    def prefill(self, prompt) -> Any:
        """Run the prompt, return the first greedy token (in the engine's own form)."""
        raise NotImplementedError

    def decode(self, token, pos: int) -> Any:
        """Feed `token` at position `pos`, return the next greedy token."""
        raise NotImplementedError

    def sync(self) -> None:
        """Wait until queued device work is done (the clock reads after it)."""

    def as_token(self, token_id: int) -> Any:
        """A token id in the form decode() takes: the first token fed at depth 0, where no prefill
        returned one."""
        raise NotImplementedError

    def rewind(self, depth: int) -> None:
        """Drop every cached token past the first `depth` (a repeat's decoded tokens), keeping what
        the prefill cached: the next decode() is at position `depth` again. Untimed."""
        raise NotImplementedError

    def cache_depth(self) -> int:
        """The tokens the KV cache holds now."""
        raise NotImplementedError

    def timed_run(self, prompt, capacity: int, gen_len: int) -> tuple[float, list[float]]:
        """Engines that time themselves (times_itself): one repeat of harness.run_timed, timed where
        the model runs: (TTFT in s, the gen_len - 1 decode steps' times in s)."""
        raise NotImplementedError

    def weight_bytes(self) -> dict:
        """{"weight_bytes_per_token", "stored_weight_bytes", "tied_lm_head"} of the loaded model."""
        raise NotImplementedError

    def weight_bytes_per_token(self) -> float:
        """The bytes of weights one decode step reads (weight_bytes()'s first figure)."""
        return self.weight_bytes()["weight_bytes_per_token"]

    def kv_bytes_per_token(self) -> float:
        """Bytes one cached token occupies in this engine's KV cache (roofline.kv_bytes at its precision)."""
        raise NotImplementedError

    def kv_cache_type(self) -> str:
        """The cache's element type as this engine holds it (`f16`, `bfloat16`, `q8_0/f16`, `fp8_e4m3`)."""
        raise NotImplementedError

    def step_bytes(self, cached: int, capacity: int) -> float:
        """Bytes one decode step moves when `cached` tokens are in a cache sized `capacity`:
        weights plus what this engine's KV cache really reads and writes (accounting.py)."""
        raise NotImplementedError

    def logprobs(self, ids: list[int], prompt_len: int, capacity: int):
        """Next-token log-probabilities, float32 CPU tensor (len(ids) - prompt_len + 1, vocab):
        after the prefill of ids[:prompt_len], then after each of ids[prompt_len:] fed by decode()
        (the timed paths), in a cache reset to `capacity`. Entries the engine does not report are
        NaN (vLLM gives its top-k only)."""
        raise NotImplementedError

    def describe(self) -> dict:
        """{"engine", "kernel", "dtype", "threads", "device", "device_name", ...} for the report."""
        raise NotImplementedError

    def weight_kernels(self) -> tuple:
        """The loaded model's weights through this engine's own kernels, one row each, timed per
        storage format (core/attribution.KernelTime; bench/weight_timing.py). Engines that attribute."""
        raise NotImplementedError

    def twin_source(self) -> tuple[Any, str]:
        """A source this engine loads as the model's twin (its layers, heads, head size and
        vocabulary at tiny widths: bench/twin_timing.py) and a line saying what it is; QuantkitError with
        the reason where the model has none. Engines that attribute."""
        raise NotImplementedError

    def close(self) -> None:
        """Free the model (the runner loads the next one in the same process)."""
