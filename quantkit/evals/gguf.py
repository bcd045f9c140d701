"""The identity of a GGUF under evaluation (`quantkit eval --engine llamacpp FILE.gguf`): its
vocabulary against the baseline's, id for id, and where it came from (the checkpoint it was
exported from, the texts its artifact was fitted on), read from its export record or from the
provenance quantkit export embedded in it. The scoring itself: scorers/llamacpp_scorer.py.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.bench.gguf_file import export_record, reference_source
from quantkit.errors import DataError
from quantkit.evals.checks import artifact_meta
from quantkit.evals.perplexity import vocab_fingerprint
from quantkit.gguf.gguf_records import KquantRecord
from quantkit.gguf.read import field_value, open_reader, origin
from quantkit.models.checkpoint import read_config
from quantkit.progress import note


def gguf_tokens(path: Path) -> list[str]:
    tokens = field_value(open_reader(path), "tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise DataError(
            f"{path}: the GGUF holds no tokenizer.ggml.tokens; its vocabulary cannot be checked against the baseline's"
        )
    return [str(t) for t in tokens]


def check_same_vocab(path: Path, base_path: Path, tok_base) -> str:
    """The GGUF's token list must be the baseline tokenizer's, id for id (llama.cpp pads unused
    embedding rows with [PADn] placeholders; those ids are never fed). Returns the baseline's
    vocabulary fingerprint (the baseline cache's key)."""

    tokens = gguf_tokens(path)
    rows = read_config(base_path).get("vocab_size")
    if isinstance(rows, int) and rows != len(tokens):  # the baseline's log-probabilities index its own rows
        raise DataError(f"vocabulary size mismatch: {path} has {len(tokens)} tokens, {base_path} has {rows}")
    vocab = tok_base.get_vocab()
    wrong = next(
        (t for t, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= len(tokens) or tokens[i] != t), None
    )
    if wrong is not None:
        i = vocab[wrong]
        got = tokens[i] if i < len(tokens) else "nothing"
        raise DataError(
            f"tokenizer mismatch: {path} has {got!r} at id {i} where {base_path} has {wrong!r}; "
            "KL and agreement need identical tokens"
        )
    return vocab_fingerprint(tok_base)


def _fitted_in_export(path: Path) -> dict:
    """What a K-quant export fitted on text itself, from its record beside the GGUF: the importance
    matrix's calibration windows and the `--mixed` selection's (evals/checks.py reads
    `gguf_export`). llama-quantize copies the F16 file's header, so the GGUF itself cannot carry them."""
    rec = export_record(path)
    if not isinstance(rec, KquantRecord):  # the exact export fits on nothing itself
        return {}
    fitted = {"imatrix": rec.imatrix.to_json() if rec.imatrix else None, "mixed": rec.mixed}
    fitted = {k: v for k, v in fitted.items() if v is not None}
    return {"gguf_export": fitted} if fitted else {}


def source_meta(path: Path) -> tuple[dict, str | None, dict]:
    """What the baseline and overlap checks read for a GGUF: (quantkit.json-shaped metadata; the sha256
    of the checkpoint it came from, or None; how that was found: {"found_via"[, "warning"]}).

    The metadata is the quantkit.json of the artifact it was exported from when its export record
    beside it still names that artifact unchanged, else the provenance quantkit export embedded in the
    file (`quantkit.provenance`: the conversion's source and fitted texts), so a GGUF moved away from
    its record is checked the same way. A GGUF without quantkit's keys (or from a quantkit too old to
    name the checkpoint converted from) has an unknown origin: a warning on stderr and in `warning`,
    and only the vocabulary check applies, as for a checkpoint without quantkit.json."""

    emb = origin(open_reader(path))
    art, why = reference_source(path)
    if art is not None:
        return artifact_meta(art), emb.source_sha256, {"found_via": f"the artifact it was exported from ({art})"}
    if emb.known and emb.provenance is not None:
        return (
            {**emb.provenance, **_fitted_in_export(path)},
            emb.source_sha256,
            {"found_via": "the provenance quantkit export embedded in the GGUF (quantkit.provenance)"},
        )
    if emb.known:  # exported from a checkpoint that records no conversion: that checkpoint is its origin
        return (
            {},
            emb.source_sha256,
            {"found_via": "the checkpoint hash quantkit export embedded in the GGUF (quantkit.source.sha256)"},
        )
    what = (
        "written by an older quantkit export, whose quantkit.source.sha256 names the artifact, not the checkpoint "
        "it was converted from"
        if emb.source_sha256
        else "no quantkit metadata in the GGUF and no export record beside it"
    )
    warning = (
        f"warning: {path} has an unknown origin ({what}); the baseline cannot be checked to be the model it "
        "was made from, nor the texts for overlap with its calibration"
    )
    note(warning)
    return {}, emb.source_sha256, {"found_via": "unknown origin", "warning": warning.removeprefix("warning: ")}
