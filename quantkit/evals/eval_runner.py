"""`quantkit eval`: the runner every scorer shares. It checks the options, the device, both
models' identities and every text before anything loads; makes (or reads from its cache) the
baseline's pass per text with the baseline scorer; scores the model under test with the scorer
`--engine` names (evals/scorers), and turns the per-token statistics into figures with their
confidence intervals, one result per text (and per position bucket within the window); then
runs lm-eval tasks. It takes one EvalSettings (evals/eval_settings.py) and returns one EvalResult
(core/eval_results.py).

The KL is exact where the scorer gives whole-vocabulary rows (`exact_kl`): the baseline's rows are
recomputed from its cached pass by its output layer, a chunk of positions at a time
(evals/perplexity.py); elsewhere, or with --kl topk, it is the top-256 lower bound. Every result
says which (`kl_kind`).

It asks the scorers' capabilities (`takes_gguf`, `runs_tasks`, `exact_kl`, ...), never their
names, so a new scorer is one module and one registry entry.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quantkit import device as devices
from quantkit.bench.gguf_file import gguf_config
from quantkit.bench.probe import load_probe
from quantkit.core.distributed import ONE_PROCESS, Runtime
from quantkit.core.eval_results import (
    KL_EXACT,
    EvalResult,
    PositionBucket,
    TaskDelta,
    TextResult,
    WindowsInfo,
    figures_of,
    topk_kind,
)
from quantkit.core.kv_cache import head_dims, parse_llama_cache
from quantkit.data.calib import self_text
from quantkit.data.text import parse_spec, shortfall
from quantkit.errors import DataError
from quantkit.evals import gguf, splits
from quantkit.evals.accuracy_stats import TOPK, bucket_ranges
from quantkit.evals.checks import (
    SELF_SEED,
    artifact_meta,
    check_baseline,
    check_disjoint_from_fitted,
    check_same_vocab,
)
from quantkit.evals.domains import labelled
from quantkit.evals.eval_settings import EvalSettings
from quantkit.evals.lmeval import TaskRun, check_backend, task_deltas
from quantkit.evals.perplexity import (
    TokenStats,
    Windows,
    cached_baseline,
    exact_references,
    score,
    self_score,
    text_windows,
    topk_references,
)
from quantkit.evals.placement import default_dtype
from quantkit.evals.scorers import BASELINE, SCORERS, scorer_named
from quantkit.evals.scorers.scorer import Scorer, ScorerSettings
from quantkit.evals.scorers.transformers_scorer import load
from quantkit.models.checkpoint import check_remote_code, checkpoint_hash, load_tokenizer, read_config
from quantkit.progress import bar, note
from quantkit.quantize.preflight import check_context


def _self_windows(base_path: Path, tok, o: EvalSettings, base_hash: str, device, dtype: str) -> Windows:
    """`--text self`: windows the baseline generates (data.calib.self_text), in transformers, in the
    evaluation's dtype (float32 on every CPU: no emulated bf16, and the same text on each)."""

    model = load(base_path, ScorerSettings(device, dtype, o.seq_len, trust_remote_code=o.trust_remote_code))
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


def _check_options(o: EvalSettings) -> type[Scorer]:
    """What the scorer cannot do with these settings, refused in one line (the settings checked
    themselves when they were built); returns the model's scorer."""

    scorer = scorer_named(o.engine)
    if o.kl == "exact" and not scorer.exact_kl:
        raise DataError(
            f"--kl exact: --engine {o.engine} compares with the baseline's top-{TOPK} only (its rows do not come "
            "back whole); use --kl topk (a lower bound), or --engine transformers or llamacpp for the exact KL"
        )
    if o.tasks and not scorer.runs_tasks:
        raise DataError(
            f"--tasks run through lm-eval (--tasks-backend hf|vllm), not {o.engine}; evaluate the model's texts "
            f"with --engine {o.engine} and its tasks on the checkpoint it was made from"
        )
    if o.tasks:
        check_backend(o.tasks_backend, o.tensor_parallel, o.data_parallel)
    _check_cache(o, scorer)
    return scorer


def _check_cache(o: EvalSettings, scorer: type[Scorer]) -> None:
    """--kv-cache and --flash-attn where the scorer has them, and a cache llama.cpp runs as asked."""
    takes = scorer.kv_caches
    if o.kv_cache is not None and takes != "any" and o.kv_cache not in takes:
        able = " | ".join(n for n, s in SCORERS.items() if s.kv_caches == "any")
        what = f"it takes {', '.join(takes)}" if takes else "it holds the model's cache as its engine does"
        raise DataError(
            f"--kv-cache {o.kv_cache}: --engine {o.engine} scores with its own KV cache ({what}); "
            f"llama.cpp's cache types: --engine {able}"
        )
    if o.flash_attn is not None and not scorer.flash_attn_lever:
        raise DataError(f"--flash-attn: --engine {o.engine} has no flash-attention setting")
    if o.kv_cache is not None and takes == "any":
        parse_llama_cache(o.kv_cache).check_flash_attn(o.flash_attn, f"--kv-cache {o.kv_cache} --flash-attn off")


def _kl_exact(o: EvalSettings, scorer: type[Scorer]) -> bool:
    """--kl, or (not given) exact where the scorer gives whole rows, the bound elsewhere."""
    return o.kl == "exact" or (o.kl is None and scorer.exact_kl)


def _device(o: EvalSettings, scorer: type[Scorer]):
    """The resolved device: --device auto as the scorer means it; one the scorer cannot use, refused."""

    dev = devices.resolve_device(o.device)
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
    model_path: Path, base_path: Path, o: EvalSettings, scorer: type[Scorer], dev, tok_b, base_hash: str
) -> _Subject:
    """Every identity check (the scorer can take the model, vocabularies, the baseline is the
    model's source) before any weights load."""
    scorer.check(model_path, dev)
    if o.kv_cache is not None and scorer.kv_caches == "any":  # llama.cpp's cache types hold these heads
        cfg = gguf_config(model_path) if not model_path.is_dir() else read_config(model_path)
        parse_llama_cache(o.kv_cache).check_heads(
            *head_dims(cfg), o.flash_attn, f"{model_path}: --kv-cache {o.kv_cache}"
        )
    if scorer.takes_gguf and not model_path.is_dir():  # a GGUF file (a missing one: "no such GGUF file")
        return _gguf_subject(model_path, base_path, o, tok_b, base_hash)
    check_remote_code(model_path, read_config(model_path), o.trust_remote_code)
    meta = artifact_meta(model_path)
    tok_m = load_tokenizer(model_path, o.trust_remote_code)
    vocab = check_same_vocab(model_path, base_path, tok_m, tok_b)
    return _Subject(
        meta, tok_m, vocab, check_baseline(model_path, base_path, meta, base_hash, o.baseline_mismatch_ok), False
    )


def _gguf_subject(model_path: Path, base_path: Path, o: EvalSettings, tok_b, base_hash: str) -> _Subject:
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
    o: EvalSettings,
    dev,
    dtype: str,
    planning: bool = False,
) -> list:
    """[(label, spec, Windows, overlap check)] for every text, in the order given; every text is read,
    cut and checked against what the model was fitted on before any model loads (`self` text, which
    the baseline generates, last; under `planning` not at all: its Windows is None)."""

    items = [
        (label, spec, parse_spec(spec)) for label, spec in labelled(texts)
    ]  # a bad SPEC fails before any text is read
    if o.split != "all" and any(parsed.source.generated for _, _, parsed in items):
        raise DataError(
            f"--split {o.split}: `self` text is generated anew (independent samples, no token positions to cut "
            "in two); use --split all for it, or another text"
        )
    out = {}
    for label, spec, parsed in sorted(items, key=lambda it: it[2].source.generated):
        if parsed.source.generated and planning:
            out[label] = (label, spec, None, None)
            continue
        if parsed.source.generated:
            w = _self_windows(base_path, tok_b, o, base_hash, dev, dtype)
        else:
            w = text_windows(tok_b, parsed, seq_len=o.seq_len, max_tokens=o.max_tokens, region=o.region, split=o.split)
        overlap = {"allowed": True} if o.allow_overlap else check_disjoint_from_fitted(model_path, subject.meta, w)
        out[label] = (label, spec, w, overlap)
    _say_if_short(out.values(), o)
    return [out[label] for label, _, _ in items]


def _say_dropped_buckets(o: EvalSettings) -> None:
    """--position-buckets edges no window reaches are dropped, and said (the default's, silently)."""
    if o.position_buckets is None:
        return
    kept = {lo for lo, _ in bucket_ranges(o.position_buckets, o.seq_len - 1)}
    dropped = [e for e in o.position_buckets if e not in kept]
    if dropped:
        note(
            f"note: --position-buckets {','.join(map(str, dropped))}: at or past the last position of a "
            f"{o.seq_len}-token window (row {o.seq_len - 2}); dropped (the last bucket ends with the window)"
        )


def _say_if_short(items, o: EvalSettings) -> None:
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


def _settings(o: EvalSettings, dev, dtype: str, n_windows: int, model: bool = False) -> ScorerSettings:
    """What a scorer opens a model with; `model`: the model under test (its KV cache as asked)."""
    return ScorerSettings(
        device=dev,
        dtype=dtype,
        seq_len=o.seq_len,
        n_windows=n_windows,
        batch_size=o.batch_size,
        trust_remote_code=o.trust_remote_code,
        kv_cache=o.kv_cache if model else None,
        flash_attn=o.flash_attn if model else None,
    )


def _baselines(
    items: list,
    base_path: Path,
    base_hash: str,
    vocab: str,
    o: EvalSettings,
    dev,
    dtype: str,
    exact: bool,
    want_head: bool,
    runtime: Runtime,
) -> tuple[list, Any]:
    """The baseline's cached pass per text (with `exact`, one that kept what the exact KL needs), and
    with `want_head` its output layer (what recomputes its whole rows from the pass; None where the
    pass kept no `hidden`). The baseline loads at most once: on a cache miss, or for its output
    layer; its other weights go before the model loads."""
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
                out.append(
                    cached_baseline(
                        scorer, base_hash, w, vocab, dtype, update, device_type=dev.type, exact=exact, runtime=runtime
                    )
                )
        if exact and want_head and all("hidden" in base for base, _ in out):
            head = scorer().head()
        else:
            head = None
    finally:
        if "s" in held:
            held.pop("s").close()  # the baseline's weights (all but its output layer) go before the model loads
            gc.collect()
    return out, head


def _check_head(o: EvalSettings, exact: bool, head, base_path: Path) -> None:
    """The exact KL was asked for (or is the default) but the baseline's pass kept no `hidden`: its
    output layer does not reproduce its logits alone (an architecture that changes them after it
    in a way OutputHead does not know). --kl exact is refused; the default falls back to the
    bound, and says so."""
    if not exact or head is not None:
        return
    why = f"{base_path}'s output layer does not reproduce its logits from its inputs (its architecture changes them)"
    if o.kl == "exact":
        raise DataError(f"--kl exact: {why}; use --kl topk (a lower bound of the exact KL)")
    note(f"note: the KL is the top-{TOPK} lower bound: {why}")


def _text_result(
    label: str, spec: str, w: Windows, stats: TokenStats, kind: str, o: EvalSettings, **extra
) -> TextResult:
    """One text's record: its figures, the same per position bucket, its windows."""
    return TextResult(
        label=label,
        text=spec,
        **figures_of(stats.figures()),
        kl_kind=kind,
        positions=tuple(PositionBucket.from_figures(b) for b in stats.buckets(o.edges)),
        windows=WindowsInfo(
            seq_len=w.seq_len,
            count=len(w.starts),
            requested=max(1, o.max_tokens // o.seq_len),
            window_starts=tuple(w.starts),
            provenance=dict(w.provenance),
        ),
        **extra,
    )


def _same(scorer_cls: type[Scorer], model_path: Path, base_path: Path) -> bool:
    """The baseline's own scorer on the baseline's checkpoint: the baseline pass is its result, exactly."""
    return scorer_cls is BASELINE and model_path.resolve() == base_path.resolve()


def _score_texts(
    items: list,
    bases: list,
    head,
    model_path: Path,
    scorer_cls: type[Scorer],
    same: bool,
    o: EvalSettings,
    dev,
    dtype: str,
    runtime: Runtime,
):
    """One TextResult per text, what scored them (the scorer's describe()), and the loaded
    transformers model (lm-eval tasks reuse it) or None. `head`: the baseline's output layer for
    the exact KL, None for the bound; `same` (_same): no second pass, KL 0 exactly."""
    scorer = (
        None
        if same
        else scorer_cls.open(
            model_path, _settings(o, dev, dtype, max(len(w.tokens) for _, _, w, _ in items), model=True)
        )
    )
    kind = KL_EXACT if same or head is not None else topk_kind(TOPK)
    rows = []
    try:
        for (label, spec, w, overlap), (base, hit) in zip(items, bases):
            t = time.perf_counter()
            if same:
                stats = self_score(base, w)  # the same checkpoint in the same dtype: exact, no second pass
            else:
                reference = exact_references(base, head) if head is not None else topk_references(base)
                with bar(f"scoring ({label})", total=len(w.tokens)) as update:
                    stats = score(scorer, w, reference, update, runtime=runtime)
            rows.append(
                _text_result(
                    label,
                    spec,
                    w,
                    stats,
                    kind,
                    o,
                    score_seconds=time.perf_counter() - t,
                    baseline_cached=hit,
                    overlap_check=overlap,
                )
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

    settings: EvalSettings
    device: Any  # torch.device
    dtype: str
    tok_b: Any
    base_hash: str
    subject: _Subject
    items: list  # _windows' [(label, spec, Windows, overlap)]; Windows None for `self` under planning
    scorer: type[Scorer] = BASELINE  # what scores the model under test (evals/scorers)
    exact: bool = True  # the KL asked for is the exact one (--kl, or the default where the scorer gives it)


def prepare_eval(model_path: Path, base_path: Path, settings: EvalSettings, planning: bool = False) -> Prepared:
    """Every check that can refuse (the settings against the scorer, the device, the window length
    against both models' context, tokenizers, the baseline's identity, each text, its overlap with
    what the artifact was fitted on), before any model is loaded. `planning` (eval --plan): `self`
    text, which the baseline generates, is left for the evaluation itself."""

    o = settings
    scorer = _check_options(o)
    texts = list(o.texts)
    dev = _device(o, scorer)
    dtype = o.dtype or default_dtype(dev, None if dev.type == "cpu" else load_probe(dev).get("matmul_tflops"))
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
    items = _windows(texts, model_path, base_path, tok_b, base_hash, subject, o, dev, dtype, planning) if texts else []
    if items:
        _say_dropped_buckets(o)
    return Prepared(o, dev, dtype, tok_b, base_hash, subject, items, scorer, _kl_exact(o, scorer))


def _task_loader(path: Path, o: EvalSettings, dev, dtype: str):
    """A transformers model of `path` for lm-eval's in-process backend, loaded when it asks."""

    return lambda: load(path, ScorerSettings(dev, dtype, o.seq_len, trust_remote_code=o.trust_remote_code))


def run_eval(model_path: Path, base_path: Path, settings: EvalSettings, runtime: Runtime = ONE_PROCESS) -> EvalResult:
    """PPL, KL and top-1 of `model_path` against `base_path` on each of the settings' texts (one
    result per text, in order, each with its position buckets), and lm-eval task deltas.

    `runtime`: where it runs (core/distributed.py). prepare_eval's checks run first; under torchrun
    every rank makes them on its own device and rank 0 alone reports a refusal (Runtime.together),
    then each rank scores its share of the windows."""

    t0 = time.perf_counter()
    with runtime.together("its checks"):
        p = prepare_eval(model_path, base_path, replace(settings, device=runtime.device_spec(settings.device)))
    o, dev, dtype, subject, items = p.settings, p.device, p.dtype, p.subject, p.items
    texts, described, model = (), None, None
    if items:
        same = _same(p.scorer, model_path, base_path)
        exact = p.exact and not same  # the baseline against itself: KL 0, exactly, from its pass
        # --kl exact asked of the baseline itself still makes (and caches) a pass the exact KL can use
        refresh = exact or (same and o.kl == "exact")
        bases, head = _baselines(
            items, base_path, p.base_hash, subject.vocab, o, dev, dtype, refresh, want_head=exact, runtime=runtime
        )
        _check_head(o, exact, head, base_path)
        found, described, model = _score_texts(items, bases, head, model_path, p.scorer, same, o, dev, dtype, runtime)
        texts = tuple(found)
    tasks = {}
    if o.tasks:
        run = TaskRun(
            o.tasks,
            o.limit,
            dtype,
            dev,
            o.tasks_backend,
            o.tensor_parallel,
            o.data_parallel,
            o.trust_remote_code,
            processes=runtime.world_size,
        )
        deltas = task_deltas(
            run,
            model_path,
            base_path,
            subject.tok,
            p.tok_b,
            p.base_hash,
            model,
            _task_loader(model_path, o, dev, dtype),
            _task_loader(base_path, o, dev, dtype),
        )
        tasks = {name: TaskDelta(**t) for name, t in deltas.items()}
    return EvalResult(
        model=str(model_path),
        baseline=str(base_path),
        engine=o.engine,
        baseline_engine=BASELINE.name,
        split=o.split,
        dtype=dtype,
        device=devices.describe(dev, dtype),
        baseline_check=subject.baseline_check,
        kl_kind=texts[0].kl_kind if texts else None,
        texts=texts,
        tasks=tasks,
        tasks_backend=o.tasks_backend if o.tasks else None,
        scorer=described,
        primary_text=texts[0].label if texts else None,
        seconds=time.perf_counter() - t0,
        world_size=runtime.world_size,
    )
