"""`quantkit eval`: wire models, text windows, the baseline cache and lm-eval tasks together."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import DataError
from ..models import checkpoint_hash, load_model, load_tokenizer, read_config
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


def check_disjoint_from_calibration(model_path: Path, windows: Windows) -> None:
    """Refuse to evaluate on windows that the artifact was calibrated on (same file, same tokens)."""
    meta_file = model_path / "quantkit.json"
    if not meta_file.is_file():
        return
    calib = json.loads(meta_file.read_text()).get("calibration") or {}
    if not calib or calib.get("sha256") != windows.provenance.get("sha256"):
        return
    cal = [(s, s + calib["seq_len"]) for s in calib.get("window_starts", [])]
    ev = [(s, s + windows.seq_len) for s in windows.starts]
    if overlaps(cal, ev):
        raise DataError(
            f"evaluation windows overlap the calibration windows of {model_path} (same text file); "
            "evaluate on another region (--region first-half) or pass --allow-overlap"
        )


def _self_windows(base_path: Path, tok, seq_len: int, max_tokens: int, base_hash: str) -> Windows:
    from ..calib import self_text

    model = load_model(base_path, dtype="bfloat16")
    n = max(1, max_tokens // seq_len)
    cs = self_text(model, tok, samples=n, seq_len=seq_len, seed=1234, chat_template=False, model_hash=base_hash)
    prov = {"source": "self", "sha256": f"self:{base_hash}:{n}:{seq_len}", "seed": 1234, "duplicate_fraction": cs.manifest["duplicate_fraction"]}
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
) -> dict:
    if seq_len < 8:
        raise DataError("--seq-len must be at least 8")
    t0 = time.perf_counter()
    tok_m, tok_b = load_tokenizer(model_path), load_tokenizer(base_path)
    vocab = check_same_vocab(model_path, base_path, tok_m, tok_b)
    base_hash = checkpoint_hash(base_path)
    result: dict = {"model": str(model_path), "baseline": str(base_path), "dtype": dtype}
    model = None
    if text:
        spec = parse_spec(text)
        if spec.kind == "self":
            windows = _self_windows(base_path, tok_b, seq_len, max_tokens, base_hash)
        else:
            windows = text_windows(tok_b, spec, seq_len=seq_len, max_tokens=max_tokens, region=region)
        if not allow_overlap:
            check_disjoint_from_calibration(model_path, windows)
        with bar("baseline pass", total=len(windows.tokens)) as update:
            base, hit = cached_baseline(lambda: load_model(base_path, dtype=dtype), base_hash, windows, vocab, dtype, update)
        t1 = time.perf_counter()
        if model_path.resolve() == base_path.resolve():
            result.update(self_score(base, windows))  # the same checkpoint in the same dtype: exact, no second pass
        else:
            model = load_model(model_path, dtype=dtype)
            with bar("scoring", total=len(windows.tokens)) as update:
                result.update(score(model, windows, base, update))
        result["score_seconds"] = time.perf_counter() - t1
        result["baseline_cached"] = hit
        result["windows"] = windows.describe()
    if tasks:
        from .lmeval import task_deltas

        if model is None:
            model = load_model(model_path, dtype=dtype)
        result["tasks"] = task_deltas(model, tok_m, lambda: load_model(base_path, dtype=dtype), tok_b, base_hash, tasks, limit, dtype)
    else:
        result["tasks"] = {}
    result["seconds"] = time.perf_counter() - t0
    return result
