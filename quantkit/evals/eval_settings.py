"""EvalSettings: everything one evaluation runs with, as one frozen record.

Built once at the edge - from `quantkit eval`'s options (made from these fields, cli/_options.py)
or from a recipe's `eval:` block for one of its engines (`from_recipe`, in `quantkit run`) - checked
there (one line, exit 2), then passed whole: evals/eval_runner.py's `prepare_eval`/`run_eval` and
`eval --plan` take it as it is. tests/test_settings_once.py checks that each option reaches the
settings, from the command line and from a recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.core.kv_cache import parse_llama_cache
from quantkit.core.option_fields import bound_error, option_fields, spec
from quantkit.errors import DataError
from quantkit.recipe.eval_options import DEFAULT_BUCKETS, EvalOptions, buckets_error


@dataclass(frozen=True)
class EvalSettings(EvalOptions):
    """EvalOptions' fields (recipe/eval_options.py: each one's default, help and bound), checked."""

    def __post_init__(self) -> None:
        error = bound_error(self) or buckets_error(self)  # each option's values and bound, as a recipe's
        if error:
            raise DataError(error)
        if self.max_tokens < self.seq_len:
            raise DataError(f"--max-tokens {self.max_tokens} is less than one window of --seq-len {self.seq_len}")
        if self.kv_cache is not None:
            object.__setattr__(self, "kv_cache", parse_llama_cache(self.kv_cache).label)
        if self.position_buckets == ():
            raise DataError("--position-buckets: give positive token positions, e.g. 512,2048,8192")

    @property
    def edges(self) -> tuple[int, ...]:
        """The position buckets' edges this evaluation cuts at (stats.bucket_ranges)."""
        return self.position_buckets or DEFAULT_BUCKETS

    @classmethod
    def from_recipe(cls, ev, engine: str, texts, tasks) -> "EvalSettings":
        """One engine's settings from a recipe's eval block (recipe/schema.py EvalConfig), whose
        fields carry these names; `texts` and `tasks` as the run resolved them."""
        own = {f.name for f in option_fields(EvalOptions) if spec(f).recipe} - {"texts", "tasks"}
        given = {k: getattr(ev, k) for k in own}
        return cls(**given, texts=tuple(texts), tasks=tuple(tasks), engine=engine)
