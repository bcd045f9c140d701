"""The identity checks of an evaluation, made before any weights load: the two models share one
vocabulary, the baseline is the checkpoint the artifact was converted from, and no evaluation
window overlaps text the artifact was fitted on.

They read a model's metadata (quantkit.json, or what a GGUF carries: evals/gguf.py) and the
windows' provenance, never weights, so every scorer shares them.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.data.text import overlaps
from quantkit.errors import DataError
from quantkit.evals.perplexity import vocab_fingerprint
from quantkit.models.checkpoint import read_config, read_json

SELF_SEED = 1234  # the seed of `--text self` windows


def check_same_vocab(model_path: Path, base_path: Path, tok_model, tok_base) -> str:
    fp_m, fp_b = vocab_fingerprint(tok_model), vocab_fingerprint(tok_base)
    if fp_m != fp_b:
        raise DataError(
            f"tokenizer mismatch: {model_path} and {base_path} have different "
            "vocabularies; KL and agreement need identical tokens"
        )
    v_m, v_b = read_config(model_path).get("vocab_size"), read_config(base_path).get("vocab_size")
    if v_m != v_b:
        raise DataError(f"vocabulary size mismatch: {model_path} has {v_m}, {base_path} has {v_b}")
    return fp_m


def artifact_meta(model_path: Path) -> dict:
    """A checkpoint's quantkit.json ({} when it has none)."""
    f = model_path / "quantkit.json"
    return read_json(f) if f.is_file() else {}


def fitted_texts(meta: dict) -> list[dict]:
    """Every text an artifact was fitted on, from its quantkit.json (or what a GGUF carries): the
    calibration windows (GPTQ/AWQ/SmoothQuant, the GQA merge), GQA recovery's training and
    held-out windows, the windows an `auto:` step chose its units on, the windows `quantkit
    sensitivity` chose a step's overrides on (`chosen_on`, which it prints beside them), and a
    K-quant GGUF's importance matrix and `--mixed` selection (its export record); each text of a
    calibration mix (`parts`) on its own. Rotations are fixed Hadamard matrices, fitted on no text.

    Each record: what, source, sha256, seq_len, starts (token offsets in the text's stream). A new
    step that fits on text records its windows in quantkit.json and is listed here."""
    out: list[dict] = []
    for what, record, keys in _fitted_records(meta):
        for r in _with_parts(record):
            for key in keys:
                label = {"train_starts": f"{what} training", "heldout_starts": f"{what} held-out"}.get(key, what)
                out.append(
                    {
                        "what": label,
                        "source": r.get("source"),
                        "sha256": r.get("sha256"),
                        "seq_len": r.get("seq_len"),
                        "starts": r.get(key) or [],
                        "seed": r.get("seed") if key == "window_starts" else None,
                    }
                )
    return out


def _fitted_records(meta: dict) -> list[tuple[str, object, tuple[str, ...]]]:
    """(what, its window record(s), the keys of their window starts) for each kind of fitted text."""
    starts = ("window_starts",)
    steps = _at(meta, "recipe", "steps")
    chosen = [_at(s, "quantize", "chosen_on") for s in steps] if isinstance(steps, list) else []
    return [
        ("calibration", meta.get("calibration"), starts),
        ("GQA recovery", _at(meta, "gqa", "recover", "windows"), ("train_starts", "heldout_starts")),
        ("auto mixed precision", _at(meta, "mixed_precision", "windows", "text"), starts),
        ("sensitivity (the overrides' choice)", [c for c in chosen if isinstance(c, dict)], starts),
        ("importance matrix", _at(meta, "gguf_export", "imatrix", "calibration"), starts),
        ("--mixed selection", _at(meta, "gguf_export", "mixed", "windows"), starts),
    ]


def _at(record, *keys):
    """record[k1][k2]... where each level is a dict, else None (a damaged or older record)."""
    for key in keys:
        record = record.get(key) if isinstance(record, dict) else None
    return record


def _with_parts(record) -> list[dict]:
    """A window record and those of its parts (a calibration mix: one per text)."""
    records = record if isinstance(record, list) else [record]
    out = []
    for r in records:
        if isinstance(r, dict):
            out += [r, *_with_parts([p for p in r.get("parts") or [] if isinstance(p, dict)])]
    return out


def check_disjoint_from_fitted(model_path: Path, meta: dict, windows) -> dict:
    """Refuse to evaluate on text the artifact was fitted on: windows of the same text (same sha256)
    that overlap, or `self` text generated with the same seed. `windows`: perplexity.Windows.
    Returns what was checked."""
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
    return {
        "fitted_texts": [
            {k: r[k] for k in ("what", "source", "sha256")} | {"windows": len(r["starts"])} for r in records
        ],
        "overlap": False,
    }


def check_baseline(model_path: Path, base_path: Path, meta: dict, base_hash: str, mismatch_ok: bool) -> dict:
    """The baseline must be the checkpoint the artifact was converted from (quantkit.json source.sha256)."""
    recorded = (meta.get("source") or {}).get("sha256") if isinstance(meta.get("source"), dict) else None
    same = model_path.resolve() == base_path.resolve()
    match = None if recorded is None or same else recorded == base_hash
    if match is False and not mismatch_ok:
        raise DataError(
            f"--baseline {base_path} (sha256 {base_hash[:12]}) is not the checkpoint {model_path} was converted from "
            f"({meta['source'].get('path')}, sha256 {recorded[:12]}); pass that one, or "
            "--baseline-mismatch-ok to compare anyway"
        )
    return {
        "artifact_source_sha256": recorded,
        "baseline_sha256": base_hash,
        "match": match,
        "mismatch_ok": mismatch_ok,
    }
