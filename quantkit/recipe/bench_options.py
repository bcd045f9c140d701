"""What a bench run measures, as options: each field's name, type, default, help and bound, once.

`quantkit bench`'s options and a recipe's `bench:` section are both made from these fields
(cli/_options.py, recipe/section_fields.py), and bench/bench_settings.py's BenchSettings is this
record with what building it resolves (the device, the engine's threads) and the checks that need
the engine. It sits in the recipe's layer, below the bench that runs it.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from typing import Any, Callable

from quantkit.core.option_fields import INTS, SWITCH, WORDS, flag, option
from quantkit.core.precision import DTYPES

# The bench engines' names (bench/engines ENGINES, which tests/test_recipe.py checks them against):
# the recipe and these options name them below the package that implements them.
BENCH_ENGINES = ("eager", "compiled", "vllm", "llamacpp")
# --flash-attn: the engine's own default, on, off, or both (each model benched once per setting)
FLASH_ATTN = {"default": (None,), "on": (True,), "off": (False,), "both": (False, True)}
DEVICE_PATTERN = r"^(auto|cpu(:0)?|cuda(:[0-9]+)?)$"  # a recipe's --device values; resolved when the bench starts


@dataclass(frozen=True)
class BenchOptions:
    # any --device spec; a torch.device once BenchSettings is built (quantkit.device.resolve_device)
    device: Any = option(
        "auto", help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one).", pattern=DEVICE_PATTERN
    )
    # a recipe names its engines in `engine:` / `engines:` (recipe/schema.py BenchConfig)
    engine: str = option("compiled", help=" | ".join(BENCH_ENGINES), recipe=False)
    prompt_len: int = option(256, help="Prompt tokens whose prefill is the TTFT.", ge=1)
    gen_len: int = option(64, help="Tokens generated per measurement (the TPOT's steps, one fewer).", ge=2)
    repeats: int = option(5, help="Timed runs, at least.", ge=1)
    min_seconds: float = option(2.0, help="Keep repeating until this much time was measured.", ge=0)
    warmups: int = option(2, help="Untimed runs first (engines that compile always get at least 1).", ge=0)
    prompt_sweep: tuple[int, ...] = option(
        (),
        help="Comma-separated prompt lengths for a TTFT sweep, e.g. 64,128,256,512.",
        flag="--sweep",
        cli=INTS,
        ge=1,
    )
    seed: int = option(0, help="Seed of the prompts' token ids.", cli=None, recipe=False)
    tensor_parallel: int = option(1, help="GPUs per model (--engine vllm).", ge=1, recipe=False)
    threads: int | None = option(
        None,
        help="CPU threads for the engine (default: the library's; llamacpp: every core this process may use).",
        ge=1,
    )
    self_check: bool = option(
        True,
        help="Compare the engine's next-token logits with transformers' load of the checkpoint before timing; "
        "refuse a mismatch.",
        cli=SWITCH,
    )
    # decode timed with this many tokens already in the KV cache, a row per depth (each prefilled
    # once); with depths, prompt_len is the self-check's prompt only
    depths: tuple[int, ...] = option(
        (),
        help="Comma-separated KV depths, e.g. 0,1024,4096: TPOT with that many tokens already cached (each "
        "depth prefilled once, its TTFT timed), a row per depth, the rule check across models and depths.",
        flag="--depth",
        cli=INTS,
        ge=0,
    )
    flash_attn: str = option(
        "default",
        help="Flash attention (--engine llamacpp): on, off, or both (a row for each); default: the engine's (off).",
        choices=tuple(FLASH_ATTN),
    )
    # the K/V cache types each model is benched at (`q8_0`, `q8_0/f16`: core/kv_cache.py), on
    # engines whose cache type is a setting (kv_cache_lever); (): the engine's own
    kv_caches: tuple[str, ...] = option(
        (),
        help="llama.cpp's K/V cache types (--engine llamacpp), comma-separated, a row for each: f16,q8_0,q4_0; K/V "
        "differently as q8_0/f16. Flash attention is on for a quantized V cache (llama.cpp runs it only so) "
        "[default: f16].",
        flag="--kv-cache",
        cli=WORDS,
        recipe=False,
    )
    # what the torch engines compute in (computes_in_dtype); None: chosen from the device's probe at
    # the start of the run (core/precision.py: no bf16 where the device has no bf16 arithmetic)
    dtype: str | None = option(
        None,
        help="What the torch engines (eager, compiled) compute in [default: the faster of bfloat16 and float32 in "
        "the run's probe of the device: float32 on a CPU without bf16 arithmetic].",
        choices=DTYPES,
    )


def combination_error(o: Any, name: Callable[[Field], str] = flag) -> str | None:
    """Options of `o` (BenchOptions, or a recipe's `bench:` section) that each hold but not
    together, in one line naming them by `name` (the flag; a recipe names its key); None where
    they go together."""
    by = {f.name: f for f in fields(BenchOptions)}
    if o.depths and o.prompt_sweep:
        sweep, depths = name(by["prompt_sweep"]), name(by["depths"])
        return f"{sweep} and {depths}: each depth's prefill is its TTFT; give one of the two"
    if len(set(o.depths)) != len(o.depths):
        return f"{name(by['depths'])}: each depth at most once"
    return None
