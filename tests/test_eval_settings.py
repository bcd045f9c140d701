"""EvalSettings (evals/eval_settings.py): one record built from the command line or a recipe's eval
block, checked where it is built (one line, exit 2)."""

from dataclasses import fields

import pytest

from quantkit.errors import DataError
from quantkit.evals.eval_settings import DEFAULT_BUCKETS, EvalSettings
from quantkit.recipe.schema import EvalConfig


def test_every_recipe_eval_key_reaches_the_settings_of_each_engine():
    """An eval block's keys are settings fields under the same names (engines: one settings per engine)."""
    own = {f.name for f in fields(EvalSettings)}
    assert set(EvalConfig.model_fields) - {"engines"} <= own
    ev = EvalConfig.model_validate(
        {
            "texts": ["set:a"],
            "seq_len": 64,
            "max_tokens": 256,
            "region": "second-half",
            "split": "selection",
            "kl": "topk",
            "position_buckets": [16, 32],
            "tasks": ["qk_facts"],
            "limit": 5,
            "device": "cpu",
            "dtype": "bfloat16",
            "batch_size": 2,
            "tasks_backend": "vllm",
            "tensor_parallel": 2,
            "data_parallel": 2,
            "engines": ["transformers", "llamacpp"],
        }
    )
    s = EvalSettings.from_recipe(ev, "llamacpp", ("set:a", "set:b"), ())
    assert s.engine == "llamacpp" and s.texts == ("set:a", "set:b") and s.tasks == ()
    for name in set(EvalConfig.model_fields) - {"engines", "texts", "tasks"}:
        assert getattr(s, name) == getattr(ev, name) != getattr(EvalSettings(), name), name
    defaults = EvalSettings.from_recipe(EvalConfig(), "transformers", (), ())
    assert defaults == EvalSettings()  # the recipe's defaults are the command's


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"seq_len": 4}, "--seq-len must be at least 8, not 4"),
        ({"seq_len": 512, "max_tokens": 256}, "--max-tokens 256 is less than one window of --seq-len 512"),
        ({"kl": "full"}, "--kl full: use one of exact, topk"),
        ({"position_buckets": (2048, 512)}, "--position-buckets 2048,512: give each edge once, in increasing order"),
        ({"position_buckets": (0, 512)}, "--position-buckets 0,512: each must be at least 1"),
        ({"position_buckets": ()}, "give positive token positions"),
        ({"split": "half"}, "--split half: use one of all, selection, confirmation"),
        ({"region": "middle"}, "--region middle"),
        ({"batch_size": 0}, "--batch-size must be at least 1, not 0"),
        ({"limit": 0}, "--limit must be at least 1, not 0"),
    ],
)
def test_impossible_settings_are_one_line(kw, needle):
    with pytest.raises(DataError) as exc:
        EvalSettings(**kw)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_position_buckets_from_the_command_line():
    from quantkit.cli._options import settings_from_cli
    from quantkit.errors import QuantkitError

    assert settings_from_cli(EvalSettings, {"position_buckets": "16, 64,256"}).position_buckets == (16, 64, 256)
    assert settings_from_cli(EvalSettings, {"position_buckets": None}).edges == DEFAULT_BUCKETS == (512, 2048, 8192)
    with pytest.raises(QuantkitError, match="--position-buckets '1k,2k': expected comma-separated integers"):
        settings_from_cli(EvalSettings, {"position_buckets": "1k,2k"})
