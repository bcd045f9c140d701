"""`quantkit eval`: wire models, text windows, the baseline cache and lm-eval tasks together."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import DataError
from quantkit.models.checkpoint import check_remote_code, checkpoint_hash, load_model, load_tokenizer, read_config
from quantkit.progress import bar
from quantkit.data.text import overlaps, parse_spec
from quantkit.evals.perplexity import TorchScorer, Windows, cached_baseline, score, self_score, text_windows, vocab_fingerprint


def check_same_vocab(model_path: Path, base_path: Path, tok_model, tok_base) -> str:
    fp_m, fp_b = vocab_fingerprint(tok_model), vocab_fingerprint(tok_base)
    if fp_m != fp_b:
        raise DataError(f"tokenizer mismatch: {model_path} and {base_path} have different vocabularies; KL and agreement need identical tokens")
    v_m, v_b = read_config(model_path).get("vocab_size"), read_config(base_path).get("vocab_size")
    if v_m != v_b:
        raise DataError(f"vocabulary size mismatch: {model_path} has {v_m}, {base_path} has {v_b}")
    return fp_m


SELF_SEED = 1234  # the seed of `--text self` windows


def _texts_of(record) -> list:
    """A record itself, or each part of a calibration mix's record (calib_mix.py, gqa/mixed.py)."""
    if isinstance(record, dict) and isinstance(record.get("parts"), list):
        return [p for p in record["parts"] if isinstance(p, dict)]
    return [record]


def fitted_texts(meta: dict) -> list[dict]:
    """Every text an artifact was fitted on, from its quantkit.json: the calibration windows (used
    by GPTQ/AWQ/SmoothQuant and the GQA merge) and GQA recovery's training and held-out windows,
    each text of a calibration mix (`parts`) on its own.

    Each record: what, source, sha256, seq_len, starts (token offsets in the text's stream). A new
    step that fits on text records its windows in quantkit.json and is listed here."""
    out: list[dict] = []
    rec = ((meta.get("gqa") or {}).get("recover") or {}).get("windows")
    for what, record, keys in (("calibration", meta.get("calibration"), ("window_starts",)),
                               ("GQA recovery", rec, ("train_starts", "heldout_starts"))):
        for r in _with_parts(record):
            for key in keys:
                label = {"train_starts": f"{what} training", "heldout_starts": f"{what} held-out"}.get(key, what)
                out.append({"what": label, "source": r.get("source"), "sha256": r.get("sha256"), "seq_len": r.get("seq_len"),
                            "starts": r.get(key) or [], "seed": r.get("seed") if key == "window_starts" else None})
    return out


def _with_parts(record) -> list[dict]:
    """A window record and those of its parts (a calibration mix: one per text)."""
    records = record if isinstance(record, list) else [record]
    out = []
    for r in records:
        if isinstance(r, dict):
            out += [r, *_with_parts([p for p in r.get("parts") or [] if isinstance(p, dict)])]
    return out


def check_disjoint_from_fitted(model_path: Path, meta: dict, windows: Windows) -> dict:
    """Refuse to evaluate on text the artifact was fitted on: windows of the same text (same sha256)
    that overlap, or `self` text generated with the same seed. Returns what was checked."""
    records = fitted_texts(meta)
    ev = [(s, s + windows.seq_len) for s in windows.starts]
    for r in records:
        same_self = windows.provenance.get("source") == "self" and r["source"] == "self" and r["seed"] == SELF_SEED
        if r["sha256"] and r["sha256"] == windows.provenance.get("sha256") and isinstance(r["seq_len"], int):
            fitted = [(s, s + r["seq_len"]) for s in r["starts"] if isinstance(s, int)]
            hit = sum(overlaps(fitted, [w]) for w in ev)
        else:
            hit = len(ev) if same_self else 0
        if hit:
            raise DataError(
                f"{hit} of {len(ev)} evaluation windows overlap the {r['what']} windows of {model_path} (same text: "
                f"{r['source']}); evaluate on another region (--region first-half) or text, or pass --allow-overlap"
            )
    return {"fitted_texts": [{k: r[k] for k in ("what", "source", "sha256")} | {"windows": len(r["starts"])} for r in records],
            "overlap": False}


def check_baseline(model_path: Path, base_path: Path, meta: dict, base_hash: str, mismatch_ok: bool) -> dict:
    """The baseline must be the checkpoint the artifact was converted from (quantkit.json source.sha256)."""
    recorded = (meta.get("source") or {}).get("sha256") if isinstance(meta.get("source"), dict) else None
    same = model_path.resolve() == base_path.resolve()
    match = None if recorded is None or same else recorded == base_hash
    if match is False and not mismatch_ok:
        raise DataError(
            f"--baseline {base_path} (sha256 {base_hash[:12]}) is not the checkpoint {model_path} was converted from "
            f"({meta['source'].get('path')}, sha256 {recorded[:12]}); pass that one, or --baseline-mismatch-ok to compare anyway"
        )
    return {"artifact_source_sha256": recorded, "baseline_sha256": base_hash, "match": match, "mismatch_ok": mismatch_ok}


def artifact_meta(model_path: Path) -> dict:
    from quantkit.models.checkpoint import read_json

    f = model_path / "quantkit.json"
    return read_json(f) if f.is_file() else {}


def _self_windows(base_path: Path, tok, seq_len: int, max_tokens: int, base_hash: str, trust_remote_code: bool, device) -> Windows:
    from quantkit.data.calib import self_text

    model = load_model(base_path, dtype="bfloat16", device=device, trust_remote_code=trust_remote_code)
    n = max(1, max_tokens // seq_len)
    cs = self_text(model, tok, samples=n, seq_len=seq_len, seed=SELF_SEED, chat_template=False, model_hash=base_hash)
    prov = {"source": "self", "sha256": f"self:{base_hash}:{n}:{seq_len}", "seed": SELF_SEED, "duplicate_fraction": cs.manifest["duplicate_fraction"]}
    return Windows([s[0] for s in cs.samples], list(range(len(cs.samples))), seq_len, prov)


ENGINES = ("transformers", "llamacpp")  # what scores the model under test; the baseline is always transformers


@dataclass(frozen=True)
class EvalOptions:
    seq_len: int = 512
    max_tokens: int = 8192
    region: str = "first-half"
    tasks: tuple[str, ...] = ()
    limit: int | None = None
    device: Any = None  # a --device spec or torch.device; None: auto
    dtype: str | None = None  # None: placement.default_dtype(device)
    batch_size: int | None = None  # windows per forward pass; None: placement.default_batch_size
    engine: str = "transformers"
    tasks_backend: str = "hf"
    tensor_parallel: int = 1  # lm-eval's vLLM backend
    data_parallel: int = 1
    allow_overlap: bool = False
    baseline_mismatch_ok: bool = False
    trust_remote_code: bool = False


def _check_options(o: EvalOptions) -> None:
    from quantkit.evals.placement import DTYPES

    if o.seq_len < 8:
        raise DataError("--seq-len must be at least 8")
    if o.batch_size is not None and o.batch_size < 1:
        raise DataError(f"--batch-size {o.batch_size}: give at least 1 window per forward pass")
    if o.dtype is not None and o.dtype not in DTYPES:
        raise DataError(f"--dtype {o.dtype}: use one of {', '.join(DTYPES)}")
    if o.engine not in ENGINES:
        raise DataError(f"--engine {o.engine}: eval scores with {' or '.join(ENGINES)}")
    if o.engine == "llamacpp" and o.tasks:
        raise DataError("--tasks run through lm-eval (--tasks-backend hf|vllm), not llama.cpp; evaluate the GGUF's texts "
                        "with --engine llamacpp and its tasks on the artifact it was exported from")
    if o.tasks:
        from quantkit.evals.lmeval import check_backend

        check_backend(o.tasks_backend, o.tensor_parallel, o.data_parallel)


@dataclass
class _Subject:
    """The model under test as the checks need it: its metadata, tokenizer, identity."""

    meta: dict
    tok: Any  # None for a GGUF file (its token list is checked instead)
    vocab: str
    baseline_check: dict
    gguf: bool


def _subject(model_path: Path, base_path: Path, o: EvalOptions, dev, tok_b, base_hash: str) -> _Subject:
    """Every identity check (vocabularies, the baseline is the model's source) before any weights load."""
    if o.engine == "llamacpp" and not model_path.is_dir():  # a GGUF file (a missing one: "no such GGUF file")
        from quantkit.evals import gguf

        gguf.check_gguf(model_path, dev)
        vocab = gguf.check_same_vocab(model_path, base_path, tok_b)
        meta, exported_from, found = gguf.source_meta(model_path)
        if exported_from == base_hash:  # a GGUF of the baseline checkpoint itself
            check = {"artifact_source_sha256": base_hash, "baseline_sha256": base_hash, "match": True, "mismatch_ok": o.baseline_mismatch_ok}
        else:
            check = check_baseline(model_path, base_path, meta, base_hash, o.baseline_mismatch_ok)
        return _Subject(meta, None, vocab, {**check, **found}, True)
    if o.engine == "llamacpp":
        from quantkit.bench.engines.llamacpp import check_available

        check_available(dev)
    check_remote_code(model_path, read_config(model_path), o.trust_remote_code)
    meta = artifact_meta(model_path)
    tok_m = load_tokenizer(model_path, o.trust_remote_code)
    vocab = check_same_vocab(model_path, base_path, tok_m, tok_b)
    return _Subject(meta, tok_m, vocab, check_baseline(model_path, base_path, meta, base_hash, o.baseline_mismatch_ok), False)


def _windows(texts: list[str], model_path: Path, base_path: Path, tok_b, base_hash: str, subject: _Subject, o: EvalOptions, dev,
             planning: bool = False) -> list:
    """[(label, spec, Windows, overlap check)] for every text, in the order given; every text is read,
    cut and checked against what the model was fitted on before any model loads (`self` text, which
    the baseline generates, last; under `planning` not at all: its Windows is None)."""
    from quantkit.evals.domains import labelled

    items = [(label, spec, parse_spec(spec)) for label, spec in labelled(texts)]  # a bad SPEC fails before any text is read
    out = {}
    for label, spec, parsed in sorted(items, key=lambda it: it[2].kind == "self"):
        if parsed.kind == "self" and planning:
            out[label] = (label, spec, None, None)
            continue
        if parsed.kind == "self":
            w = _self_windows(base_path, tok_b, o.seq_len, o.max_tokens, base_hash, o.trust_remote_code, dev)
        else:
            w = text_windows(tok_b, parsed, seq_len=o.seq_len, max_tokens=o.max_tokens, region=o.region)
        overlap = {"allowed": True} if o.allow_overlap else check_disjoint_from_fitted(model_path, subject.meta, w)
        out[label] = (label, spec, w, overlap)
    _say_if_short(out.values(), o)
    return [out[label] for label, _, _ in items]


def _say_if_short(items, o: EvalOptions) -> None:
    """A text with fewer windows than --max-tokens asks for (its region holds no more) is said,
    not hidden; once every text has passed its checks, so a refusal stays one line."""
    from quantkit.progress import note
    from quantkit.data.text import shortfall

    for label, _, w, _ in items:
        line = w and shortfall(len(w.tokens), max(1, o.max_tokens // o.seq_len), o.seq_len, o.region, w.provenance.get("stream_tokens"))
        if line:
            note(f"note: {label}: {line}")


def _loader(path: Path, o: EvalOptions, dev, dtype: str):
    return lambda: load_model(path, dtype=dtype, device=dev, trust_remote_code=o.trust_remote_code)


def _torch_scorer(model, o: EvalOptions, dev, dtype: str, n_windows: int) -> TorchScorer:
    from quantkit.evals.placement import default_batch_size

    bs = o.batch_size or default_batch_size(dev, model.config.to_dict(), o.seq_len, n_windows, dtype)
    return TorchScorer(model, bs)


def _baselines(items: list, base_path: Path, base_hash: str, vocab: str, o: EvalOptions, dev, dtype: str) -> list:
    """The baseline's cached pass per text; the baseline loads at most once, and only on a cache miss."""
    held: dict = {}
    n = max(len(w.tokens) for _, _, w, _ in items)

    def scorer():
        if "s" not in held:
            held["s"] = _torch_scorer(_loader(base_path, o, dev, dtype)(), o, dev, dtype, n)
        return held["s"]

    out = []
    for label, _, w, _ in items:
        with bar(f"baseline pass ({label})", total=len(w.tokens)) as update:
            out.append(cached_baseline(scorer, base_hash, w, vocab, dtype, update, device_type=dev.type))
    held.clear()  # the baseline's weights go before the model under test loads
    return out


def _model_scorer(model_path: Path, subject: _Subject, o: EvalOptions, dev, dtype: str, n_windows: int):
    """(scorer, close, description): llama.cpp over the GGUF, or the transformers model on `dev`."""
    if o.engine == "llamacpp":
        from quantkit.evals import gguf

        engine = gguf.open_engine(model_path, dev, o.seq_len)
        return gguf.LlamaCppScorer(engine), engine.close, gguf.describe(engine)
    model = _loader(model_path, o, dev, dtype)()
    s = _torch_scorer(model, o, dev, dtype, n_windows)
    return s, (lambda: None), {"engine": "transformers", "batch_size": s.batch_size}


def _score_texts(items: list, bases: list, model_path: Path, base_path: Path, subject: _Subject, o: EvalOptions, dev, dtype: str):
    """One result per text (label, figures, windows, checks); and the loaded model (for lm-eval tasks) or None."""
    same = o.engine == "transformers" and model_path.resolve() == base_path.resolve()
    scorer, close, engine = (None, lambda: None, {"engine": "transformers"}) if same else \
        _model_scorer(model_path, subject, o, dev, dtype, max(len(w.tokens) for _, _, w, _ in items))
    rows = []
    try:
        for (label, spec, w, overlap), (base, hit) in zip(items, bases):
            t = time.perf_counter()
            if same:
                figures = self_score(base, w)  # the same checkpoint in the same dtype: exact, no second pass
            else:
                with bar(f"scoring ({label})", total=len(w.tokens)) as update:
                    figures = score(scorer, w, base, update)
            rows.append({"label": label, "text": spec, **figures, "score_seconds": time.perf_counter() - t,
                         "baseline_cached": hit, "windows": {**w.describe(), "requested": max(1, o.max_tokens // o.seq_len)},
                         "overlap_check": overlap})
    finally:
        close()
    model = getattr(scorer, "model", None)
    return rows, engine, model


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


def prepare_eval(model_path: Path, base_path: Path, texts, planning: bool = False, **kw) -> Prepared:
    """Every check that can refuse (options, the device, the window length against both models'
    context, tokenizers, the baseline's identity, each text, its overlap with what the artifact was
    fitted on), before any model is loaded. `planning` (eval --plan): `self` text, which the
    baseline generates, is left for the evaluation itself."""
    from quantkit import device as devices
    from quantkit.quantize.preflight import check_context
    from quantkit.evals.placement import default_dtype

    o = EvalOptions(**kw)
    _check_options(o)
    texts = [texts] if isinstance(texts, str) else list(texts or [])
    dev = devices.resolve(o.device)
    if o.engine == "llamacpp" and str(o.device or "auto") == "auto" and dev.type != "cpu":
        from quantkit.bench.engines.llamacpp import gpu_offload

        dev = dev if gpu_offload() else devices.resolve("cpu")  # auto: the CPU for a CPU-only llama.cpp build
    dtype = o.dtype or default_dtype(dev)
    check_remote_code(base_path, read_config(base_path), o.trust_remote_code)  # before any tokenizer or model code is imported
    if texts:
        for path in (base_path, model_path):
            if path.is_dir():  # a GGUF file's context is llama.cpp's to enforce
                check_context(read_config(path), o.seq_len, "--seq-len")
    tok_b = load_tokenizer(base_path, o.trust_remote_code)
    base_hash = checkpoint_hash(base_path)
    subject = _subject(model_path, base_path, o, dev, tok_b, base_hash)
    items = _windows(texts, model_path, base_path, tok_b, base_hash, subject, o, dev, planning) if texts else []
    return Prepared(o, dev, dtype, tok_b, base_hash, subject, items)


def run_eval(model_path: Path, base_path: Path, texts, **kw) -> dict:
    """PPL, KL and top-1 of `model_path` against `base_path` on each text (a SPEC or a list of them;
    one result per text, in `texts`), and lm-eval task deltas. EvalOptions' fields are the keywords.

    prepare_eval's checks run first; under torchrun every rank makes them and rank 0 alone reports
    a refusal (distributed.together)."""
    from quantkit import device as devices
    from quantkit.core.distributed import together

    t0 = time.perf_counter()
    with together("its checks"):
        p = prepare_eval(model_path, base_path, texts, **kw)
    o, dev, dtype, tok_b, base_hash, subject, items = p.options, p.device, p.dtype, p.tok_b, p.base_hash, p.subject, p.items
    result: dict = {"model": str(model_path), "baseline": str(base_path), "engine": o.engine, "dtype": dtype,
                    "device": devices.describe(dev, dtype), "baseline_check": subject.baseline_check, "texts": [], "tasks": {}}
    model = None
    if items:
        bases = _baselines(items, base_path, base_hash, subject.vocab, o, dev, dtype)
        result["texts"], result["scorer"], model = _score_texts(items, bases, model_path, base_path, subject, o, dev, dtype)
        result.update({k: v for k, v in result["texts"][0].items() if k not in ("label", "text")})  # the one-text format's keys
        result["primary_text"] = result["texts"][0]["label"]
    if o.tasks:
        from quantkit.evals.lmeval import TaskRun, task_deltas

        run = TaskRun(o.tasks, o.limit, dtype, dev, o.tasks_backend, o.tensor_parallel, o.data_parallel, o.trust_remote_code)
        result["tasks"] = task_deltas(run, model_path, base_path, subject.tok, tok_b, base_hash, model,
                                      lambda: _loader(model_path, o, dev, dtype)(), _loader(base_path, o, dev, dtype))
        result["tasks_backend"] = o.tasks_backend
    result["seconds"] = time.perf_counter() - t0
    return result
