"""`quantkit eval`: wire models, text windows, the baseline cache and lm-eval tasks together."""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import DataError
from ..models import check_remote_code, checkpoint_hash, load_model, load_tokenizer, read_config
from ..progress import bar
from ..text import overlaps, parse_spec
from .perplexity import Windows, cached_baseline, score, self_score, text_windows, vocab_fingerprint


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
    from ..models import read_json

    f = model_path / "quantkit.json"
    return read_json(f) if f.is_file() else {}


def _self_windows(base_path: Path, tok, seq_len: int, max_tokens: int, base_hash: str, trust_remote_code: bool) -> Windows:
    from ..calib import self_text

    model = load_model(base_path, dtype="bfloat16", trust_remote_code=trust_remote_code)
    n = max(1, max_tokens // seq_len)
    cs = self_text(model, tok, samples=n, seq_len=seq_len, seed=SELF_SEED, chat_template=False, model_hash=base_hash)
    prov = {"source": "self", "sha256": f"self:{base_hash}:{n}:{seq_len}", "seed": SELF_SEED, "duplicate_fraction": cs.manifest["duplicate_fraction"]}
    return Windows([s[0] for s in cs.samples], list(range(len(cs.samples))), seq_len, prov)


def run_eval(
    model_path: Path,
    base_path: Path,
    text: str | None,
    *,
    seq_len: int = 512,
    max_tokens: int = 8192,
    region: str = "first-half",
    tasks: tuple[str, ...] = (),
    limit: int | None = None,
    dtype: str = "float32",
    allow_overlap: bool = False,
    baseline_mismatch_ok: bool = False,
    trust_remote_code: bool = False,
) -> dict:
    """Every check that can refuse (tokenizers, the baseline's identity, the text, its overlap with
    what the artifact was fitted on) runs before a model is loaded."""
    if seq_len < 8:
        raise DataError("--seq-len must be at least 8")
    t0 = time.perf_counter()
    for path in (model_path, base_path):  # before any tokenizer or model code is imported
        check_remote_code(path, read_config(path), trust_remote_code)
    meta = artifact_meta(model_path)
    tok_m, tok_b = load_tokenizer(model_path, trust_remote_code), load_tokenizer(base_path, trust_remote_code)
    vocab = check_same_vocab(model_path, base_path, tok_m, tok_b)
    base_hash = checkpoint_hash(base_path)
    result: dict = {"model": str(model_path), "baseline": str(base_path), "dtype": dtype,
                    "baseline_check": check_baseline(model_path, base_path, meta, base_hash, baseline_mismatch_ok)}
    load = lambda p: load_model(p, dtype=dtype, trust_remote_code=trust_remote_code)  # noqa: E731
    model = None
    if text:
        spec = parse_spec(text)
        if spec.kind == "self":
            windows = _self_windows(base_path, tok_b, seq_len, max_tokens, base_hash, trust_remote_code)
        else:
            windows = text_windows(tok_b, spec, seq_len=seq_len, max_tokens=max_tokens, region=region)
        result["overlap_check"] = {"allowed": True} if allow_overlap else check_disjoint_from_fitted(model_path, meta, windows)
        with bar("baseline pass", total=len(windows.tokens)) as update:
            base, hit = cached_baseline(lambda: load(base_path), base_hash, windows, vocab, dtype, update)
        t1 = time.perf_counter()
        if model_path.resolve() == base_path.resolve():
            result.update(self_score(base, windows))  # the same checkpoint in the same dtype: exact, no second pass
        else:
            model = load(model_path)
            with bar("scoring", total=len(windows.tokens)) as update:
                result.update(score(model, windows, base, update))
        result["score_seconds"] = time.perf_counter() - t1
        result["baseline_cached"] = hit
        result["windows"] = windows.describe()
    if tasks:
        from .lmeval import task_deltas

        if model is None:
            model = load(model_path)
        result["tasks"] = task_deltas(model, tok_m, lambda: load(base_path), tok_b, base_hash, tasks, limit, dtype)
    else:
        result["tasks"] = {}
    result["seconds"] = time.perf_counter() - t0
    return result
