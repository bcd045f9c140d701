"""Eval scorers: one registry keyed by --engine, capabilities as attributes, a runner that asks those
attributes and never a scorer's name, so a new scorer is one module plus one registry entry."""

import pytest

from quantkit.errors import DataError
from quantkit.evals.scorers import BASELINE, SCORERS, scorer_named
from quantkit.evals.scorers.scorer import Scorer
from quantkit.evals.scorers.transformers_scorer import TransformersScorer

CAPABILITIES = (
    "takes_checkpoint",
    "takes_gguf",
    "exports_on_the_fly",
    "scores_baseline",
    "runs_tasks",
    "exact_kl",
    "planned",
)


@pytest.mark.parametrize("key", list(SCORERS))
def test_every_registered_scorer_carries_its_capabilities(key):
    cls = SCORERS[key]
    assert issubclass(cls, Scorer) and cls.name == key
    assert all(isinstance(getattr(cls, c), bool) for c in CAPABILITIES)
    assert cls.devices and set(cls.devices) <= {"cpu", "cuda"}
    assert cls.takes_checkpoint or cls.takes_gguf
    assert not cls.exports_on_the_fly or (
        cls.takes_gguf and cls.takes_checkpoint
    )  # exports a checkpoint to what it reads


def test_the_baseline_scorer_is_registered_and_makes_baseline_passes():
    assert BASELINE.scores_baseline and SCORERS[BASELINE.name] is BASELINE and BASELINE.takes_checkpoint


@pytest.mark.parametrize("name", ["sglang", "", "Transformers", "llama.cpp", "eager"])
def test_an_unknown_engine_is_one_line_listing_the_valid_ones(name, tiny_llama, tiny_text):
    with pytest.raises(DataError) as exc:
        scorer_named(name)
    line = str(exc.value)
    assert "\n" not in line and all(k in line for k in SCORERS)
    from quantkit.evals.eval_runner import run_eval
    from quantkit.evals.eval_settings import EvalSettings

    with pytest.raises(DataError, match="unknown eval engine"):
        run_eval(
            tiny_llama, tiny_llama, EvalSettings(texts=(f"file:{tiny_text}",), engine=name, seq_len=16, max_tokens=32)
        )


def test_the_cli_offers_every_registered_engine(cli, tiny_llama):
    code, out, _, _ = cli("eval", "--help")
    assert code == 0 and all(k in out for k in SCORERS)
    code, _, err, _ = cli("eval", str(tiny_llama), "--baseline", str(tiny_llama), "--engine", "nope")
    assert code == 2 and all(k in err for k in SCORERS)


class Other(TransformersScorer):
    """A scorer registered under another name: transformers' numbers, its own identity."""

    name = "other"
    runs_tasks = False
    planned = False

    def describe(self) -> dict:
        return {**super().describe(), "kernel": "other kernels"}


class Partial(TransformersScorer):
    """A scorer whose library gives no full rows: it overrides compare() and makes no baseline."""

    name = "partial"
    scores_baseline = False
    exact_kl = False
    calls = 0

    def logps(self, windows):
        raise AssertionError("compare() is the scorer's own; logps() must not be called")

    def compare(self, windows, references):
        Partial.calls += 1
        yield from Scorer.compare(TransformersScorer(self.model, self.batch_size), windows, references)


class GpuOnly(TransformersScorer):
    name = "gpu-only"
    devices = ("cuda",)


@pytest.fixture
def registered(monkeypatch):
    import quantkit.evals.scorers as scorers

    for cls in (Other, Partial, GpuOnly):
        monkeypatch.setitem(scorers.SCORERS, cls.name, cls)


def _run(model, base, text, **kw):
    from quantkit.evals.eval_runner import run_eval
    from quantkit.evals.eval_settings import EvalSettings

    return run_eval(model, base, EvalSettings(texts=(f"file:{text}",), seq_len=32, max_tokens=128, device="cpu", **kw))


def test_a_scorer_added_to_the_registry_is_run_by_the_shared_runner(registered, tiny_dir, tiny_text):
    model, base = tiny_dir / "mistral", tiny_dir / "llama-gqa"
    ref = _run(model, base, tiny_text)
    got = _run(model, base, tiny_text, engine="other")
    assert got.engine == "other" and got.scorer == {"engine": "other", "batch_size": 1, "kernel": "other kernels"}
    assert (
        got.baseline_engine == BASELINE.name and got.texts[0].baseline_cached is True
    )  # one baseline for every scorer
    for key in ("ppl", "baseline_ppl", "top1_agreement", "tokens"):
        assert getattr(got.primary, key) == getattr(ref.primary, key)
    assert got.primary.kld.mean == pytest.approx(ref.primary.kld.mean, rel=1e-6)
    assert ref.kl_kind == got.kl_kind == "exact"
    Partial.calls = 0
    part = _run(model, base, tiny_text, engine="partial")
    assert Partial.calls == 1 and part.primary.ppl == ref.primary.ppl and part.scorer["engine"] == "partial"
    # a scorer without the exact_kl capability gets the bound, labelled as one; --kl exact is refused for it
    assert part.kl_kind == "topk-256 lower bound" and part.primary.kld.mean <= ref.primary.kld.mean
    with pytest.raises(DataError, match="--kl exact: --engine partial compares with the baseline's top-256 only"):
        _run(model, base, tiny_text, engine="partial", kl="exact")


def test_the_same_checkpoint_shortcut_belongs_to_the_baseline_s_scorer(registered, tiny_llama, tiny_text):
    """The baseline's own pass is the exact result only for the scorer that made it; another one scores."""
    same = _run(tiny_llama, tiny_llama, tiny_text)
    other = _run(tiny_llama, tiny_llama, tiny_text, engine="other")
    assert same.kl_kind == "exact" and same.primary.kld.max == 0.0 and same.scorer == {"engine": BASELINE.name}
    # scored for real, exactly (its rows against the baseline's recomputed ones): 0 to float rounding
    assert other.scorer["engine"] == "other" and other.kl_kind == "exact"
    assert other.primary.kld.max < 1e-5 and other.primary.top1_agreement == 1.0


def test_capabilities_refuse_what_a_scorer_cannot_do_before_anything_loads(
    registered, tiny_llama, tiny_text, monkeypatch
):
    import quantkit.evals.scorers.transformers_scorer as hf

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded a model before refusing"))
    with pytest.raises(DataError, match="--tasks run through lm-eval.*not other"):
        _run(tiny_llama, tiny_llama, tiny_text, engine="other", tasks=("qk_facts",))
    with pytest.raises(DataError, match="--engine gpu-only runs on cuda, not --device cpu"):
        _run(tiny_llama, tiny_llama, tiny_text, engine="gpu-only")


def test_the_runner_never_compares_scorer_names():
    """Engines are told apart by their capabilities: no `== "llamacpp"`, `!= "transformers"` or
    `in ("llamacpp", ...)` in the shared code (a default value may name one)."""
    import inspect
    import re

    import quantkit.cli.eval_cmd as cli_eval
    import quantkit.evals.eval_runner as runner
    import quantkit.evals.perplexity as perplexity

    names = "|".join(re.escape(n) for n in SCORERS)
    compare = re.compile(rf'(==|!=|\bin)\s*\(?\s*"({names})"|"({names})"\s*(==|!=)')
    for module in (runner, cli_eval, perplexity):
        assert not compare.search(inspect.getsource(module)), module.__name__


def test_the_output_layers_check_compares_a_chunk_of_positions_at_a_time(monkeypatch):
    """OutputHead.reproduces holds one chunk's comparison at a time (the whole window's held five
    vocabulary-sized arrays beside its logits: 11.4 GB at a 262,144 vocabulary and 2,048 positions),
    and still finds a mismatch in any chunk, the last included."""
    import torch

    from quantkit.evals.scorers import transformers_scorer as scorer

    monkeypatch.setattr(scorer, "KL_CHUNK", 3)
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(10, 8)
    out = scorer.OutputHead(head, None)
    logits = head(hidden).detach()
    assert out.reproduces(hidden, logits)
    for row in (0, 4, 9):
        bad = logits.clone()
        bad[row, 7] += 1.0
        assert not out.reproduces(hidden, bad), row
    assert not out.reproduces(hidden[:9], logits)  # positions that differ in number
