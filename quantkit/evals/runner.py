"""`quantkit eval`: the runner every scorer shares. It checks the options, the device, both
models' identities and every text before anything loads; makes (or reads from its cache) the
baseline's pass per text with the baseline scorer; scores the model under test with the scorer
`--engine` names (evals/scorers), and turns the per-token statistics into figures with their
confidence intervals, one result per text; then runs lm-eval tasks.

It asks the scorers' capabilities (`takes_gguf`, `runs_tasks`, ...), never their names, so a new
scorer is one module and one registry entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit import device as devices
from quantkit.core.distributed import together
from quantkit.data.calib import self_text
from quantkit.data.text import parse_spec, shortfall
from quantkit.errors import DataError
from quantkit.evals import gguf, splits
from quantkit.evals.checks import (
    SELF_SEED,
    artifact_meta,
    check_baseline,
    check_disjoint_from_fitted,
    check_same_vocab,
    fitted_texts,  # noqa: F401 - the fitted-text records, where callers have read them
)
from quantkit.evals.domains import labelled
from quantkit.evals.lmeval import TaskRun, check_backend, task_deltas
from quantkit.evals.perplexity import Windows, cached_baseline, score, self_score, text_windows
from quantkit.evals.placement import DTYPES, default_dtype
from quantkit.evals.scorers import BASELINE, scorer_named
from quantkit.evals.scorers.base import Scorer, ScorerSettings
from quantkit.evals.scorers.transformers import load
from quantkit.evals.splits import SPLITS
from quantkit.models.checkpoint import check_remote_code, checkpoint_hash, load_tokenizer, read_config
from quantkit.progress import bar, note
from quantkit.quantize.preflight import check_context


def _self_windows(base_path: Path, tok, o: "EvalOptions", base_hash: str, device) -> Windows:
    """`--text self`: windows the baseline generates (data.calib.self_text), in transformers."""

    model = load(base_path, ScorerSettings(device, "bfloat16", o.seq_len, trust_remote_code=o.trust_remote_code))
    n = max(1, o.max_tokens // o.seq_len)
    cs = self_text(model, tok, samples=n, seq_len=o.seq_len, seed=SELF_SEED, chat_template=False, model_hash=base_hash)
    prov = {
        "source": "self",
        "sha256": f"self:{base_hash}:{n}:{o.seq_len}",
        "seed": SELF_SEED,
        "duplicate_fraction": cs.manifest["duplicate_fraction"],
        "split": o.split,
    }
    return Windows([s[0] for s in cs.samples], list(range(len(cs.samples))), o.seq_len, prov)


@dataclass(frozen=True)
class EvalOptions:
    seq_len: int = 512
    max_tokens: int = 8192
    region: str = "first-half"
    split: str = "all"  # evals/splits.py: the region, its selection half or its confirmation half
    tasks: tuple[str, ...] = ()
    limit: int | None = None
    device: Any = None  # a --device spec or torch.device; None: auto
    dtype: str | None = None  # None: placement.default_dtype(device)
    batch_size: int | None = None  # windows per forward pass; None: placement.default_batch_size
    engine: str = "transformers"  # the scorer of the model under test (evals/scorers SCORERS)
    tasks_backend: str = "hf"
    tensor_parallel: int = 1  # lm-eval's vLLM backend
    data_parallel: int = 1
    allow_overlap: bool = False
    baseline_mismatch_ok: bool = False
    trust_remote_code: bool = False


def _check_options(o: EvalOptions) -> type[Scorer]:
    """Options no evaluation can run with, refused in one line; returns the model's scorer."""

    if o.seq_len < 8:
        raise DataError("--seq-len must be at least 8")
    if o.batch_size is not None and o.batch_size < 1:
        raise DataError(f"--batch-size {o.batch_size}: give at least 1 window per forward pass")
    if o.dtype is not None and o.dtype not in DTYPES:
        raise DataError(f"--dtype {o.dtype}: use one of {', '.join(DTYPES)}")
    if o.split not in SPLITS:
        raise DataError(f"--split {o.split}: use one of {', '.join(SPLITS)}")
    scorer = scorer_named(o.engine)
    if o.tasks and not scorer.runs_tasks:
        raise DataError(
            f"--tasks run through lm-eval (--tasks-backend hf|vllm), not {o.engine}; evaluate the model's texts "
            f"with --engine {o.engine} and its tasks on the checkpoint it was made from"
        )
    if o.tasks:
        check_backend(o.tasks_backend, o.tensor_parallel, o.data_parallel)
    return scorer


def _device(o: EvalOptions, scorer: type[Scorer]):
    """The resolved device: --device auto as the scorer means it; one the scorer cannot use, refused."""

    dev = devices.resolve(o.device)
    if str(o.device or "auto") == "auto":
        dev = scorer.auto_device(dev)
    if dev.type not in scorer.devices:
        raise DataError(f"--engine {scorer.name} runs on {' or '.join(scorer.devices)}, not --device {dev}")
    return dev


@dataclass
class _Subject:
    """The model under test as the checks need it: its metadata, tokenizer, identity."""

    meta: dict
    tok: Any  # None for a GGUF file (its token list is checked instead)
    vocab: str
    baseline_check: dict
    gguf: bool


def _subject(
    model_path: Path, base_path: Path, o: EvalOptions, scorer: type[Scorer], dev, tok_b, base_hash: str
) -> _Subject:
    """Every identity check (the scorer can take the model, vocabularies, the baseline is the
    model's source) before any weights load."""
    scorer.check(model_path, dev)
    if scorer.takes_gguf and not model_path.is_dir():  # a GGUF file (a missing one: "no such GGUF file")
        return _gguf_subject(model_path, base_path, o, tok_b, base_hash)
    check_remote_code(model_path, read_config(model_path), o.trust_remote_code)
    meta = artifact_meta(model_path)
    tok_m = load_tokenizer(model_path, o.trust_remote_code)
    vocab = check_same_vocab(model_path, base_path, tok_m, tok_b)
    return _Subject(
        meta, tok_m, vocab, check_baseline(model_path, base_path, meta, base_hash, o.baseline_mismatch_ok), False
    )


def _gguf_subject(model_path: Path, base_path: Path, o: EvalOptions, tok_b, base_hash: str) -> _Subject:
    """A GGUF's identity: its token list against the baseline's, its origin from its export record
    or the provenance embedded in it (evals/gguf.py)."""

    vocab = gguf.check_same_vocab(model_path, base_path, tok_b)
    meta, exported_from, found = gguf.source_meta(model_path)
    if exported_from == base_hash:  # a GGUF of the baseline checkpoint itself
        check = {
            "artifact_source_sha256": base_hash,
            "baseline_sha256": base_hash,
            "match": True,
            "mismatch_ok": o.baseline_mismatch_ok,
        }
    else:
        check = check_baseline(model_path, base_path, meta, base_hash, o.baseline_mismatch_ok)
    return _Subject(meta, None, vocab, {**check, **found}, True)


def _windows(
    texts: list[str],
    model_path: Path,
    base_path: Path,
    tok_b,
    base_hash: str,
    subject: _Subject,
    o: EvalOptions,
    dev,
    planning: bool = False,
) -> list:
    """[(label, spec, Windows, overlap check)] for every text, in the order given; every text is read,
    cut and checked against what the model was fitted on before any model loads (`self` text, which
    the baseline generates, last; under `planning` not at all: its Windows is None)."""

    items = [
        (label, spec, parse_spec(spec)) for label, spec in labelled(texts)
    ]  # a bad SPEC fails before any text is read
    if o.split != "all" and any(parsed.kind == "self" for _, _, parsed in items):
        raise DataError(
            f"--split {o.split}: `self` text is generated anew (independent samples, no token positions to cut "
            "in two); use --split all for it, or another text"
        )
    out = {}
    for label, spec, parsed in sorted(items, key=lambda it: it[2].kind == "self"):
        if parsed.kind == "self" and planning:
            out[label] = (label, spec, None, None)
            continue
        if parsed.kind == "self":
            w = _self_windows(base_path, tok_b, o, base_hash, dev)
        else:
            w = text_windows(tok_b, parsed, seq_len=o.seq_len, max_tokens=o.max_tokens, region=o.region, split=o.split)
        overlap = {"allowed": True} if o.allow_overlap else check_disjoint_from_fitted(model_path, subject.meta, w)
        out[label] = (label, spec, w, overlap)
    _say_if_short(out.values(), o)
    return [out[label] for label, _, _ in items]


def _say_if_short(items, o: EvalOptions) -> None:
    """A text with fewer windows than --max-tokens asks for (its region holds no more) is said,
    not hidden; once every text has passed its checks, so a refusal stays one line."""

    wanted = max(1, o.max_tokens // o.seq_len)
    for label, _, w, _ in items:
        if not w:
            continue
        if o.split == "all":
            line = shortfall(len(w.tokens), wanted, o.seq_len, o.region, w.provenance.get("stream_tokens"))
        else:
            line = splits.shortfall(len(w.tokens), wanted, o.seq_len, o.region, o.split, w.provenance["token_range"])
        if line:
            note(f"note: {label}: {line}")


def _settings(o: EvalOptions, dev, dtype: str, n_windows: int) -> ScorerSettings:
    return ScorerSettings(
        device=dev,
        dtype=dtype,
        seq_len=o.seq_len,
        n_windows=n_windows,
        batch_size=o.batch_size,
        trust_remote_code=o.trust_remote_code,
    )


def _baselines(items: list, base_path: Path, base_hash: str, vocab: str, o: EvalOptions, dev, dtype: str) -> list:
    """The baseline's cached pass per text; the baseline loads at most once, and only on a cache miss."""
    held: dict = {}
    settings = _settings(o, dev, dtype, max(len(w.tokens) for _, _, w, _ in items))

    def scorer():
        if "s" not in held:
            held["s"] = BASELINE.open(base_path, settings)
        return held["s"]

    out = []
    try:
        for label, _, w, _ in items:
            with bar(f"baseline pass ({label})", total=len(w.tokens)) as update:
                out.append(cached_baseline(scorer, base_hash, w, vocab, dtype, update, device_type=dev.type))
    finally:
        if "s" in held:
            held.pop("s").close()  # the baseline's weights go before the model under test loads
    return out


def _score_texts(
    items: list,
    bases: list,
    model_path: Path,
    base_path: Path,
    scorer_cls: type[Scorer],
    o: EvalOptions,
    dev,
    dtype: str,
):
    """One result per text (label, figures, windows, checks), what scored them (`scorer` in the
    result), and the loaded transformers model (lm-eval tasks reuse it) or None."""
    # the baseline's own scorer on the baseline's checkpoint: the baseline pass is its result, exactly
    same = scorer_cls is BASELINE and model_path.resolve() == base_path.resolve()
    scorer = (
        None
        if same
        else scorer_cls.open(model_path, _settings(o, dev, dtype, max(len(w.tokens) for _, _, w, _ in items)))
    )
    rows = []
    try:
        for (label, spec, w, overlap), (base, hit) in zip(items, bases):
            t = time.perf_counter()
            if same:
                figures = self_score(base, w)  # the same checkpoint in the same dtype: exact, no second pass
            else:
                with bar(f"scoring ({label})", total=len(w.tokens)) as update:
                    figures = score(scorer, w, base, update)
            rows.append(
                {
                    "label": label,
                    "text": spec,
                    **figures,
                    "score_seconds": time.perf_counter() - t,
                    "baseline_cached": hit,
                    "windows": {**w.describe(), "requested": max(1, o.max_tokens // o.seq_len)},
                    "overlap_check": overlap,
                }
            )
        described = {"engine": scorer_cls.name} if same else scorer.describe()
        model = scorer.model if scorer is not None else None
    finally:
        if scorer is not None:
            scorer.close()
    return rows, described, model


@dataclass
class Prepared:
    """An evaluation checked and ready to load models: what `quantkit eval` and `eval --plan` share."""

    options: EvalOptions
    device: Any  # torch.device
    dtype: str
    tok_b: Any
    base_hash: str
    subject: _Subject
    items: list  # _windows' [(label, spec, Windows, overlap)]; Windows None for `self` under planning
    scorer: type[Scorer] = BASELINE  # what scores the model under test (evals/scorers)


def prepare_eval(model_path: Path, base_path: Path, texts, planning: bool = False, **kw) -> Prepared:
    """Every check that can refuse (options, the device, the window length against both models'
    context, tokenizers, the baseline's identity, each text, its overlap with what the artifact was
    fitted on), before any model is loaded. `planning` (eval --plan): `self` text, which the
    baseline generates, is left for the evaluation itself."""

    o = EvalOptions(**kw)
    scorer = _check_options(o)
    texts = [texts] if isinstance(texts, str) else list(texts or [])
    dev = _device(o, scorer)
    dtype = o.dtype or default_dtype(dev)
    check_remote_code(
        base_path, read_config(base_path), o.trust_remote_code
    )  # before any tokenizer or model code is imported
    if texts:
        for path in (base_path, model_path):
            if path.is_dir():  # a GGUF file's context is its scorer's to enforce
                check_context(read_config(path), o.seq_len, "--seq-len")
    tok_b = load_tokenizer(base_path, o.trust_remote_code)
    base_hash = checkpoint_hash(base_path)
    subject = _subject(model_path, base_path, o, scorer, dev, tok_b, base_hash)
    items = _windows(texts, model_path, base_path, tok_b, base_hash, subject, o, dev, planning) if texts else []
    return Prepared(o, dev, dtype, tok_b, base_hash, subject, items, scorer)


def _task_loader(path: Path, o: EvalOptions, dev, dtype: str):
    """A transformers model of `path` for lm-eval's in-process backend, loaded when it asks."""

    return lambda: load(path, ScorerSettings(dev, dtype, o.seq_len, trust_remote_code=o.trust_remote_code))


def run_eval(model_path: Path, base_path: Path, texts, **kw) -> dict:
    """PPL, KL and top-1 of `model_path` against `base_path` on each text (a SPEC or a list of them;
    one result per text, in `texts`), and lm-eval task deltas. EvalOptions' fields are the keywords.

    prepare_eval's checks run first; under torchrun every rank makes them and rank 0 alone reports
    a refusal (distributed.together)."""

    t0 = time.perf_counter()
    with together("its checks"):
        p = prepare_eval(model_path, base_path, texts, **kw)
    o, dev, dtype, tok_b, base_hash, subject, items = (
        p.options,
        p.device,
        p.dtype,
        p.tok_b,
        p.base_hash,
        p.subject,
        p.items,
    )
    result: dict = {
        "model": str(model_path),
        "baseline": str(base_path),
        "engine": o.engine,
        "baseline_engine": BASELINE.name,
        "split": o.split,
        "dtype": dtype,
        "device": devices.describe(dev, dtype),
        "baseline_check": subject.baseline_check,
        "texts": [],
        "tasks": {},
    }
    model = None
    if items:
        bases = _baselines(items, base_path, base_hash, subject.vocab, o, dev, dtype)
        result["texts"], result["scorer"], model = _score_texts(
            items, bases, model_path, base_path, p.scorer, o, dev, dtype
        )
        result.update(
            {k: v for k, v in result["texts"][0].items() if k not in ("label", "text")}
        )  # the one-text format's keys
        result["primary_text"] = result["texts"][0]["label"]
    if o.tasks:
        run = TaskRun(
            o.tasks, o.limit, dtype, dev, o.tasks_backend, o.tensor_parallel, o.data_parallel, o.trust_remote_code
        )
        result["tasks"] = task_deltas(
            run,
            model_path,
            base_path,
            subject.tok,
            tok_b,
            base_hash,
            model,
            _task_loader(model_path, o, dev, dtype),
            _task_loader(base_path, o, dev, dtype),
        )
        result["tasks_backend"] = o.tasks_backend
    result["seconds"] = time.perf_counter() - t0
    return result
