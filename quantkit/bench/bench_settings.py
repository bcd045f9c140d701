"""What a bench run measures, built once at the edge (`quantkit bench`'s options, or a recipe's
`bench:` section through BenchSettings.from_recipe) and passed whole; the checks that need a
model's config but no weights."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.bench.engines import ENGINES, engine_class
from quantkit.core.kv_cache import LlamaCache, head_dims, parse_llama_cache, parse_llama_caches
from quantkit.core.option_fields import bound_error, option_fields, spec
from quantkit.core.precision import Precision, choose
from quantkit.core.roofline import Shape, kv_bytes_per_token
from quantkit.device import free_bytes, resolve_device
from quantkit.errors import QuantkitError
from quantkit.gguf.tools import available_cores
from quantkit.models.checkpoint import context_length, context_source
from quantkit.recipe.bench_options import FLASH_ATTN, BenchOptions, combination_error
from quantkit.recipe.schema import BenchConfig

DEVICE_WORDS = {"cuda": "a CUDA GPU (--device cuda)", "cpu": "the CPU (--device cpu)"}


@dataclass(frozen=True)
class BenchSettings(BenchOptions):
    """BenchOptions' fields (recipe/bench_options.py: each one's default, help and bound), built: the
    device resolved, the engine's threads filled in, the K/V cache types spelled one way."""

    @classmethod
    def from_recipe(cls, b: BenchConfig, engine: str) -> "BenchSettings":
        """The settings a recipe's `bench:` section means for one of its engines: every key of the
        section that a bench takes, so `quantkit run` times what `quantkit bench` would. Depths
        and flash attention apply where the engine has them: a torch engine of a run that asks
        llama.cpp's flash attention benches at its own attention."""
        lever = engine_class(engine).flash_attn_lever
        given = {f.name: getattr(b, f.name) for f in option_fields(BenchOptions) if spec(f).recipe}
        return cls(
            **{
                **given,
                "engine": engine,
                "flash_attn": b.flash_attn if lever else "default",
                "dtype": b.dtype if engine_class(engine).computes_in_dtype else None,
            }
        )

    def __post_init__(self):
        engine = engine_class(self.engine)  # an unknown engine: one line listing the valid ones
        device = resolve_device(self.device)  # an unavailable device fails here, before any work
        if str(self.device) == "auto":
            device = engine.auto_device(device)
        if self.threads is None:  # the engine's own threads, so the probe measures what they can reach
            object.__setattr__(self, "threads", engine.default_threads())
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "prompt_sweep", tuple(self.prompt_sweep))
        object.__setattr__(self, "depths", tuple(self.depths))
        object.__setattr__(self, "kv_caches", tuple(c.label for c in parse_llama_caches(",".join(self.kv_caches))))

    @property
    def capacity(self) -> int:
        """Tokens the timed sequence holds: the KV cache is sized to this per measurement."""
        return self.prompt_len + self.gen_len

    @property
    def max_tokens(self) -> int:
        return max((self.prompt_len, *self.prompt_sweep, *self.depths)) + self.gen_len

    @property
    def flash_attn_runs(self) -> tuple[bool | None, ...]:
        """The flash-attention settings each model is benched at (None: the engine's default)."""
        return FLASH_ATTN[self.flash_attn]

    @property
    def kv_cache_runs(self) -> tuple[LlamaCache | None, ...]:
        """The cache types each model is benched at (None: the engine's own)."""
        return tuple(parse_llama_cache(c) for c in self.kv_caches) or (None,)


def check_settings(s: BenchSettings) -> None:
    """Settings that no model can be timed with: rejected before any loading or probing."""

    engine = engine_class(s.engine)
    error = bound_error(s) or combination_error(s)  # each option's values and bound (recipe/bench_options.py)
    if error:
        raise QuantkitError(error)
    if s.tensor_parallel > 1 and not engine.tensor_parallel:
        able = " | ".join(n for n in ENGINES if engine_class(n).tensor_parallel)
        raise QuantkitError(f"--tensor-parallel above 1 only with --engine {able}")
    if s.dtype is not None and not engine.computes_in_dtype:
        able = " | ".join(n for n in ENGINES if engine_class(n).computes_in_dtype)
        raise QuantkitError(
            f"--dtype {s.dtype}: the {s.engine} engine computes in its own types (a GGUF's, vLLM's); "
            f"--engine {able} take a dtype"
        )
    if s.threads is not None and s.threads > available_cores():
        raise QuantkitError(
            f"--threads {s.threads}: this process may run on {available_cores()} CPUs; give at most that many "
            "(more threads than CPUs only wait for each other, and the device probe would not measure them)"
        )
    _check_depths(s, engine)
    check_kv_caches(s, [c for c in s.kv_cache_runs if c is not None], "--kv-cache")
    if s.device.type not in engine.devices:
        raise QuantkitError(
            f"--engine {s.engine} needs {' or '.join(DEVICE_WORDS.get(d, d) for d in engine.devices)}, "
            f"not --device {s.device}"
        )
    engine.check(s.device)


def _check_depths(s: BenchSettings, engine) -> None:
    """--depth and --flash-attn: depths the engine can decode at, flash attention where it has the setting."""
    if s.flash_attn != "default" and not engine.flash_attn_lever:
        able = " | ".join(n for n in ENGINES if engine_class(n).flash_attn_lever)
        raise QuantkitError(
            f"--flash-attn {s.flash_attn}: the {s.engine} engine has no flash-attention setting (--engine {able} has)"
        )
    if s.depths and min(s.depths) < engine.min_depth:
        raise QuantkitError(
            f"--depth {min(s.depths)}: the {s.engine} engine decodes after at least {engine.min_depth} cached "
            f"token(s) ({engine.min_depth_reason})"
        )


def run_precision(s: BenchSettings, probe: dict) -> Precision | None:
    """What the run's engine computes in: --dtype where given, else the faster of bf16 and float32
    in `probe` (the run's own probe of the device, bench/probe.py); None for an engine that computes
    in its own types."""
    if not engine_class(s.engine).computes_in_dtype:
        return None
    return choose(probe.get("matmul_tflops"), s.dtype)


def check_kv_caches(s: BenchSettings, caches: list[LlamaCache], where: str) -> None:
    """Cache types only where the engine has them, and each at every flash-attention setting of the
    run that llama.cpp runs it with (a quantized V cache needs flash attention on)."""
    if not caches:
        return
    engine = engine_class(s.engine)
    if not engine.kv_cache_lever:
        able = " | ".join(n for n in ENGINES if engine_class(n).kv_cache_lever)
        raise QuantkitError(
            f"{where} {caches[0].label}: the {s.engine} engine holds its KV cache at its own type (--engine {able} "
            "takes cache types)"
        )
    for cache in caches:
        for fa in s.flash_attn_runs:
            cache.check_flash_attn(fa, f"{where} {cache.label} with --flash-attn {s.flash_attn}")


def check_kv_heads(cfg: dict, s: BenchSettings, where: str) -> None:
    """Each cache type of the run holds this model's attention heads in llama.cpp at each
    flash-attention setting (core/kv_cache.py check_heads), before the device probe or a load."""
    if not engine_class(s.engine).kv_cache_lever:
        return
    for cache in (c or LlamaCache() for c in s.kv_cache_runs):
        for fa in s.flash_attn_runs:
            cache.check_heads(*head_dims(cfg), fa, f"{where}: --kv-cache {cache.label}")


def check_lengths(cfg: dict, s: BenchSettings) -> None:
    """The longest sequence of the run within the model's context (a config that names none: what
    transformers and the exported GGUF assume, models/checkpoint.py context_length)."""
    limit = context_length(cfg)
    if not limit or s.max_tokens <= limit:
        return
    deepest = max(s.depths, default=0)
    source = context_source(cfg)
    where = f"the model's context ({limit}" + ("" if source.startswith("config.json") else f"; {source}") + ")"
    if deepest + s.gen_len == s.max_tokens:
        raise QuantkitError(f"--depth {deepest} + {s.gen_len} generated tokens ({s.max_tokens}) exceed {where}")
    raise QuantkitError(f"prompt + generated tokens ({s.max_tokens}) exceed {where}")


def check_fits_bytes(weights: float, cfg: dict, s: BenchSettings, what: str) -> None:
    """Estimate from the weight bytes and the KV cache before allocating anything."""

    need = weights * 1.15 + kv_bytes_per_token(Shape.from_config(cfg)) * s.max_tokens
    have = free_bytes(s.device)
    if need > have:
        raise QuantkitError(f"{what}: needs about {need / 1e9:.1f} GB on {s.device}, {have / 1e9:.1f} GB available")
