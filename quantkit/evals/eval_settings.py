"""EvalSettings: everything one evaluation runs with, as one frozen record.

Built once at the edge - from `quantkit eval`'s options (`from_cli`) or from a recipe's `eval:`
block for one of its engines (`from_recipe`, in `quantkit run`) - checked there (one line, exit 2),
then passed whole: evals/eval_runner.py's `prepare_eval`/`run_eval` and `eval --plan` take it as it is.
The CLI's defaults are these fields' defaults; tests/test_eval_cli.py walks the command's options
and checks that each one reaches the settings the run uses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from quantkit.core.kv_cache import parse_llama_cache
from quantkit.errors import DataError
from quantkit.evals.placement import DTYPES
from quantkit.evals.splits import REGIONS, SPLITS

KL_CHOICES = ("exact", "topk")
DEFAULT_BUCKETS = (512, 2048, 8192)


@dataclass(frozen=True)
class EvalSettings:
    texts: tuple[str, ...] = ()  # text SPECs, one result per text; none: the default domains (evals/domains.py)
    seq_len: int = 512
    max_tokens: int = 8192  # tokens per text, whole windows
    region: str = "first-half"
    split: str = "all"  # evals/splits.py: the region, its selection half or its confirmation half
    # exact: KL over the whole vocabulary; topk: the baseline's top-256 plus a tail bucket (a lower
    # bound, from the cached baseline pass). None: exact where the scorer gives whole rows, else topk
    kl: str | None = None
    # edges of the position buckets within a window (DEFAULT_BUCKETS: [0, 512), [512, 2048),
    # [2048, 8192)); edges a window does not reach are dropped (said, unless these are the
    # default's), positions past the last edge are one more bucket. None: DEFAULT_BUCKETS
    position_buckets: tuple[int, ...] | None = None
    tasks: tuple[str, ...] = ()
    limit: int | None = None
    device: Any = "auto"  # a --device spec or torch.device (under torchrun, the rank's)
    dtype: str | None = None  # None: placement.default_dtype(device)
    batch_size: int | None = None  # windows per forward pass; None: placement.default_batch_size
    engine: str = "transformers"  # the scorer of the model under test (evals/scorers SCORERS)
    # The KV cache the model under test is scored with (--kv-cache), as its engine quantizes it:
    # llama.cpp's K/V types (`q8_0`, `q8_0/f16`; core/kv_cache.py), or `f16` in transformers (an
    # artifact's FP8 K/V rounding switched off); None: the engine's own (transformers applies the
    # checkpoint's kv_cache_scheme, llama.cpp caches in f16). A scorer's kv_caches says what it takes.
    kv_cache: str | None = None
    # llama.cpp's flash attention (--flash-attn); None: off, but on for a quantized V cache
    flash_attn: bool | None = None
    tasks_backend: str = "hf"
    tensor_parallel: int = 1  # lm-eval's vLLM backend
    data_parallel: int = 1
    allow_overlap: bool = False
    baseline_mismatch_ok: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.seq_len < 8:
            raise DataError("--seq-len must be at least 8")
        if self.max_tokens < self.seq_len:
            raise DataError(f"--max-tokens {self.max_tokens} is less than one window of --seq-len {self.seq_len}")
        if self.batch_size is not None and self.batch_size < 1:
            raise DataError(f"--batch-size {self.batch_size}: give at least 1 window per forward pass")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise DataError(f"--dtype {self.dtype}: use one of {', '.join(DTYPES)}")
        if self.region not in REGIONS:
            raise DataError(f"--region {self.region}: use one of {', '.join(REGIONS)}")
        if self.split not in SPLITS:
            raise DataError(f"--split {self.split}: use one of {', '.join(SPLITS)}")
        if self.kl is not None and self.kl not in KL_CHOICES:
            raise DataError(f"--kl {self.kl}: use one of {', '.join(KL_CHOICES)}")
        if self.kv_cache is not None:
            object.__setattr__(self, "kv_cache", parse_llama_cache(self.kv_cache).label)
        edges = self.position_buckets
        if edges is None:
            return
        if not edges or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in edges):
            raise DataError(f"--position-buckets {_edges(edges)}: give positive token positions, e.g. 512,2048,8192")
        if list(edges) != sorted(set(edges)):
            raise DataError(f"--position-buckets {_edges(edges)}: give each edge once, in increasing order")

    @property
    def edges(self) -> tuple[int, ...]:
        """The position buckets' edges this evaluation cuts at (stats.bucket_ranges)."""
        return self.position_buckets or DEFAULT_BUCKETS

    @classmethod
    def from_cli(cls, **options) -> "EvalSettings":
        """From `quantkit eval`'s options as click passes them: --text repeated, --tasks and
        --position-buckets comma-separated (not given: None, the default buckets)."""
        o = dict(options)
        o["texts"] = tuple(o.get("texts") or ())
        o["tasks"] = parse_list(o.get("tasks") or "")
        o["position_buckets"] = parse_edges(o.get("position_buckets"))
        o["flash_attn"] = {"on": True, "off": False, None: None}[o.get("flash_attn")]
        return cls(**o)

    @classmethod
    def from_recipe(cls, ev, engine: str, texts, tasks) -> "EvalSettings":
        """One engine's settings from a recipe's eval block (recipe/schema.py EvalConfig), whose
        fields carry these names; `texts` and `tasks` as the run resolved them."""
        own = {f.name for f in fields(cls)} - {"texts", "tasks", "engine", "kv_cache", "flash_attn"}
        given = {k: v for k, v in ev.model_dump().items() if k in own}
        return cls(**given, texts=tuple(texts), tasks=tuple(tasks), engine=engine)


def parse_list(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in str(value).split(",") if t.strip())


def parse_edges(value) -> tuple[int, ...] | None:
    """`512,2048,8192` (or a sequence of ints) -> (512, 2048, 8192); anything else, one line."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(value)
    try:
        return tuple(int(x) for x in parse_list(value))
    except ValueError:
        raise DataError(
            f"--position-buckets {value}: give comma-separated token positions, e.g. 512,2048,8192"
        ) from None


def _edges(edges) -> str:
    return ",".join(str(e) for e in edges)
