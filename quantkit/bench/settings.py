"""What a bench run measures, built once at the edge (`quantkit bench`'s options, or a recipe's
`bench:` section through BenchSettings.from_recipe) and passed whole; the checks that need a
model's config but no weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.bench.engines import ENGINES, engine_class
from quantkit.core.roofline import Shape, kv_bytes_per_token
from quantkit.device import free_bytes, resolve
from quantkit.errors import QuantkitError
from quantkit.recipe.schema import BenchConfig

DEVICE_WORDS = {"cuda": "a CUDA GPU (--device cuda)", "cpu": "the CPU (--device cpu)"}


@dataclass(frozen=True)
class BenchSettings:
    device: Any = "auto"  # any --device spec; a torch.device once built (quantkit.device.resolve)
    engine: str = "compiled"
    prompt_len: int = 256
    gen_len: int = 64
    repeats: int = 5
    min_seconds: float = 2.0
    warmups: int = 2
    prompt_sweep: tuple[int, ...] = ()
    seed: int = 0
    tensor_parallel: int = 1
    threads: int | None = None
    self_check: bool = True

    @classmethod
    def from_recipe(cls, b: BenchConfig, engine: str) -> "BenchSettings":
        """The settings a recipe's `bench:` section means for one of its engines: every key of the
        section that a bench takes, so `quantkit run` times what `quantkit bench` would."""
        return cls(
            device=b.device,
            engine=engine,
            prompt_len=b.prompt_len,
            gen_len=b.gen_len,
            repeats=b.repeats,
            min_seconds=b.min_seconds,
            warmups=b.warmups,
            prompt_sweep=b.prompt_sweep,
            threads=b.threads,
            self_check=b.self_check,
        )

    def __post_init__(self):
        engine = engine_class(self.engine)  # an unknown engine: one line listing the valid ones
        device = resolve(self.device)  # an unavailable device fails here, before any work
        if str(self.device) == "auto":
            device = engine.auto_device(device)
        if self.threads is None:  # the engine's own threads, so the probe measures what they can reach
            object.__setattr__(self, "threads", engine.default_threads())
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "prompt_sweep", tuple(self.prompt_sweep))

    @property
    def capacity(self) -> int:
        """Tokens the timed sequence holds: the KV cache is sized to this per measurement."""
        return self.prompt_len + self.gen_len

    @property
    def max_tokens(self) -> int:
        return max((self.prompt_len, *self.prompt_sweep)) + self.gen_len

    def to_json(self) -> dict:
        return {
            **self.__dict__,
            "device": str(self.device),
            "prompt_sweep": list(self.prompt_sweep),
        }


def check_settings(s: BenchSettings) -> None:
    """Settings that no model can be timed with: rejected before any loading or probing."""

    engine = engine_class(s.engine)
    if s.prompt_len <= 0 or s.gen_len <= 1:
        raise QuantkitError("--prompt-len must be > 0 and --gen-len > 1")
    if s.repeats < 1 or s.warmups < 0 or not 0 <= s.min_seconds < float("inf"):  # NaN fails every comparison
        raise QuantkitError("--repeats must be >= 1, --warmups >= 0 and --min-seconds a finite number >= 0")
    if any(x <= 0 for x in s.prompt_sweep):
        raise QuantkitError("--sweep: prompt lengths must be positive")
    if s.tensor_parallel < 1 or (s.tensor_parallel > 1 and not engine.tensor_parallel):
        able = " | ".join(n for n in ENGINES if engine_class(n).tensor_parallel)
        raise QuantkitError(f"--tensor-parallel must be >= 1, and above 1 only with --engine {able}")
    if s.threads is not None and s.threads < 1:
        raise QuantkitError("--threads must be >= 1")
    if s.device.type not in engine.devices:
        raise QuantkitError(
            f"--engine {s.engine} needs {' or '.join(DEVICE_WORDS.get(d, d) for d in engine.devices)}, "
            f"not --device {s.device}"
        )
    engine.check(s.device)


def check_lengths(cfg: dict, s: BenchSettings) -> None:
    limit = cfg.get("max_position_embeddings")
    if not limit or s.max_tokens <= limit:
        return
    raise QuantkitError(f"prompt + generated tokens ({s.max_tokens}) exceed the model's context ({limit})")


def check_fits_bytes(weights: float, cfg: dict, s: BenchSettings, what: str) -> None:
    """Estimate from the weight bytes and the KV cache before allocating anything."""

    need = weights * 1.15 + kv_bytes_per_token(Shape.from_config(cfg)) * s.max_tokens
    have = free_bytes(s.device)
    if need > have:
        raise QuantkitError(f"{what}: needs about {need / 1e9:.1f} GB on {s.device}, {have / 1e9:.1f} GB available")
