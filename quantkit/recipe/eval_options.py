"""What an evaluation runs with, as options: each field's name, type, default, help and bound, once.

`quantkit eval`'s options and a recipe's `eval:` section are both made from these fields
(cli/_options.py, recipe/section_fields.py), and evals/eval_settings.py's EvalSettings is this
record with its checks. It sits in the recipe's layer, below the evals that run it.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from typing import Any, Callable

from quantkit.core.option_fields import FLAG, INTS, MANY, ONOFF, WORDS, flag, option
from quantkit.data.sources import syntaxes

# The scorers' names (evals/scorers SCORERS) and lm-eval's backends (evals/lmeval.py BACKENDS),
# named below the package that implements them; tests/test_recipe.py checks they agree.
EVAL_ENGINES = ("transformers", "llamacpp", "vllm")
TASK_BACKENDS = ("hf", "vllm")
SPLITS = ("all", "selection", "confirmation")  # evals/splits.py: the region, or one of its halves
REGIONS = ("first-half", "second-half", "all")
KL_CHOICES = ("exact", "topk")
EVAL_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_BUCKETS = (512, 2048, 8192)
DEVICE_PATTERN = r"^(auto|cpu(:0)?|cuda(:[0-9]+)?)$"  # a recipe's --device values; resolved when the eval starts


@dataclass(frozen=True)
class EvalOptions:
    # text SPECs, one result per text; none: the default domains (evals/domains.py)
    texts: tuple[str, ...] = option(
        (),
        help=f"{' | '.join(syntaxes(parts=False))}; repeatable, one row per text. Default (without --tasks): "
        "set:world-factbook (held-out encyclopedic text) and set:shakespeare-plays (literature no calibration "
        "reads), plus set:wikitext2-valid where QUANTKIT_WIKITEXT2_VALID points at a copy.",
        flag="--text",
        cli=MANY,
    )
    seq_len: int = option(512, help="Tokens per window.", ge=8)
    max_tokens: int = option(8192, help="Tokens to score per text (whole windows).", ge=8)
    region: str = option("first-half", help="The part of each text scored.", choices=REGIONS)
    split: str = option(
        "all",
        help="Which part of the region to score: all, selection (its first half: choose recipes, rank methods and "
        "layers here) or confirmation (its second half, which no choice saw: report these figures).",
        choices=SPLITS,
    )
    # exact: KL over the whole vocabulary; topk: the baseline's top-256 plus a tail bucket (a lower
    # bound, from the cached baseline pass). None: exact where the scorer gives whole rows, else topk
    kl: str | None = option(
        None,
        help="exact: KL(baseline || model) over the whole vocabulary; topk: over the baseline's top-256 tokens plus "
        "one tail bucket, a lower bound [default: exact, with every engine; the bound, said, for a baseline whose "
        "output layer alone does not reproduce its logits].",
        choices=KL_CHOICES,
    )
    # edges of the position buckets within a window (DEFAULT_BUCKETS: [0, 512), [512, 2048),
    # [2048, 8192)); edges a window does not reach are dropped (said, unless these are the
    # default's), positions past the last edge are one more bucket. None: DEFAULT_BUCKETS
    position_buckets: tuple[int, ...] | None = option(
        None,
        help="Edges of the positions within a window the figures are also given for (a KV cache grows along the "
        f"window) [default: {','.join(map(str, DEFAULT_BUCKETS))}]; edges a window does not reach are dropped.",
        cli=INTS,
        ge=1,
    )
    tasks: tuple[str, ...] = option(
        (), help="Comma-separated lm-eval tasks (local ones from evals/, or standard names online).", cli=WORDS
    )
    limit: int | None = option(None, help="Examples per lm-eval task.", ge=1)
    # a --device spec or torch.device (under torchrun, the rank's)
    device: Any = option(
        "auto", help="auto | cpu | cuda | cuda:N (the baseline, the model and lm-eval tasks).", pattern=DEVICE_PATTERN
    )
    # None: evals/placement.py default_dtype(device)
    dtype: str | None = option(
        None, help="Precision the models load in [default: bfloat16 on a GPU, float32 on the CPU].", choices=EVAL_DTYPES
    )
    # windows per forward pass; None: evals/placement.py default_batch_size
    batch_size: int | None = option(
        None,
        help="Windows per forward pass [default: 1 on the CPU; on a GPU, what fits 40% of its free memory, up to 32].",
        ge=1,
    )
    # the scorer of the model under test; a recipe names its engines in `engines:` (recipe/schema.py)
    engine: str = option(
        "transformers",
        help=f"What scores MODEL: {' | '.join(EVAL_ENGINES)} (llamacpp on a GGUF file, or an artifact exported "
        "exactly on the fly). The baseline is scored by transformers either way.",
        # no fixed choices: the scorer registry (evals/scorers SCORERS) checks the name when the run
        # is built, so a scorer added to it is taken here without a line here
        recipe=False,
    )
    # The KV cache the model under test is scored with, as its engine quantizes it: llama.cpp's K/V
    # types (`q8_0`, `q8_0/f16`; core/kv_cache.py), or `f16` in transformers (an artifact's FP8 K/V
    # rounding switched off); None: the engine's own. A scorer's kv_caches says what it takes.
    kv_cache: str | None = option(
        None,
        help="The KV cache MODEL is scored with: llama.cpp's cache types with --engine llamacpp (q8_0, q4_0, ...; "
        "K/V: q8_0/f16), or f16 in transformers (an artifact's FP8 K/V rounding off) [default: the engine's own: "
        "transformers applies an artifact's FP8 K/V scales, llama.cpp caches in f16].",
        recipe=False,
    )
    # llama.cpp's flash attention; None: off, but on for a quantized V cache
    flash_attn: bool | None = option(
        None,
        help="llama.cpp's flash attention (--engine llamacpp) [default: off, on for a quantized V cache, which "
        "llama.cpp runs only with it].",
        cli=ONOFF,
        recipe=False,
    )
    tasks_backend: str = option(
        "hf",
        help="lm-eval's backend: hf (in process; data parallel under `accelerate launch`) or vllm.",
        choices=TASK_BACKENDS,
    )
    tensor_parallel: int = option(1, help="vLLM tensor_parallel_size (--tasks-backend vllm).", ge=1)
    data_parallel: int = option(1, help="vLLM data_parallel_size (--tasks-backend vllm).", ge=1)
    allow_overlap: bool = option(
        False,
        help="Allow evaluation windows that overlap text the artifact was fitted on (calibration, GQA recovery).",
        cli=FLAG,
        recipe=False,
    )
    baseline_mismatch_ok: bool = option(
        False,
        help="Compare with a --baseline other than the checkpoint the artifact was converted from (its "
        "quantkit.json source.sha256).",
        cli=FLAG,
        recipe=False,
    )
    trust_remote_code: bool = option(
        False, help="Allow model code from the checkpoints (off by default).", cli=FLAG, recipe=False
    )


def buckets_error(o: Any, name: Callable[[Field], str] = flag) -> str | None:
    """Position buckets' edges each once and increasing, in one line naming them by `name` (the
    flag; a recipe names its key); None where they are."""
    edges = o.position_buckets
    if edges is not None and list(edges) != sorted(set(edges)):
        by = {f.name: f for f in fields(EvalOptions)}
        return f"{name(by['position_buckets'])} {','.join(map(str, edges))}: give each edge once, in increasing order"
    return None
