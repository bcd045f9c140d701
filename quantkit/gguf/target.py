"""What `quantkit export --out` may be, checked before anything is written and again under the lock.

Never: inside the artifact being exported (`publish` would then refuse it for the extra file) or
inside the checkpoint it was converted from (quantkit.json `source.path`), nor a file either one's
symlinks point at (a hub cache's blobs); nor an input `guard_out` knows (the KL text, the current
directory, $HOME, QUANTKIT_HOME). Symlinks are resolved first, and --out itself may not be one.
An existing --out, or its NAME.quantkit.json record, needs --force, and --force replaces only what
quantkit export wrote: a GGUF whose header carries quantkit's keys (or whose export record beside
it names its sha256), and a record of quantkit's kind.

`read_record` reads that record (gguf/gguf_records.py) for its other readers too: the bench's GGUF
source and self-check, eval's provenance of a GGUF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from quantkit.artifacts.staging import guard_out, text_input
from quantkit.core.integrity import sha256_file
from quantkit.core.record_checks import RecordError
from quantkit.errors import QuantkitError
from quantkit.gguf.artifact_provenance import recorded_source
from quantkit.gguf.gguf_records import GgufRecord, KquantRecord, gguf_record, of_record_kind
from quantkit.gguf.read import written_by_quantkit


def record_path(out: Path) -> Path:
    out = Path(out)
    return out.with_name((out.name[: -len(".gguf")] if out.name.endswith(".gguf") else out.name) + ".quantkit.json")


def _resolved(p) -> Path:
    return Path(os.path.abspath(Path(p).expanduser())).resolve()


def _tree(root: Path, what: str) -> list[tuple[Path, str]]:
    """A directory and every path its files link to (a checkpoint's files sit at its top level, as
    artifact.model_inputs reads them; quantkit.json's `source.path` is not covered by the manifest,
    so it is not walked deeper), resolved."""
    root = Path(root)
    found = [(_resolved(root), what)]
    if root.is_dir():
        found += [(_resolved(p), f"a file {what} links to ({p.name})") for p in root.iterdir() if p.is_symlink()]
    return found


def protected(artifact: Path, meta: dict) -> list[tuple[Path, str]]:
    """(path, what it is) that --out may neither be nor lie inside."""
    found = _tree(artifact, "the artifact being exported")
    src = recorded_source(meta)
    if src is not None:
        found += _tree(src, "the checkpoint the artifact was converted from")
    return found


def check(out: Path, artifact: Path, meta: dict, force: bool, kl_text: str | None) -> None:
    """QuantkitError (one line, nothing changed) unless export may write `out` and its record."""

    keep = protected(artifact, meta)
    guard_out(out, [*keep, *text_input(kl_text, "the KL text")])
    o = _resolved(out)
    for p, what in keep:
        if p in o.parents:
            raise QuantkitError(
                f"--out {out} is inside {what} ({p}); export writes beside it, never into it: "
                "choose another --out (nothing was changed)"
            )
    _replaceable(Path(out), force, written_gguf, "a GGUF that quantkit export wrote")
    _replaceable(record_path(out), force, written_record, "an export record that quantkit export wrote")


def _replaceable(path: Path, force: bool, ours, what: str) -> None:
    if path.is_symlink():
        raise QuantkitError(f"{path} is a symbolic link; name a file, not a link (nothing was changed)")
    if not path.exists():
        return
    if path.is_dir():
        raise QuantkitError(f"{path} is a directory; --out names the .gguf file to write (and its record beside it)")
    if not path.is_file():
        raise QuantkitError(f"{path} is not a regular file; choose another --out")
    if not force:
        raise QuantkitError(f"{path} already exists; pass --force to replace it")
    if not ours(path):
        raise QuantkitError(
            f"{path} is not {what}; --force replaces only those: remove it yourself or choose "
            "another --out (nothing was changed)"
        )


def _json(path: Path):
    """The JSON in `path`, or None when it holds none."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None


def read_record(path: Path) -> GgufRecord | KquantRecord | None:
    """The export record in `path` (NAME.quantkit.json), or None when there is none, it is not
    quantkit export's, or it does not read (gguf_records.py): then nothing trusts it."""
    try:
        return gguf_record(_json(path))
    except RecordError:
        return None


def written_record(path: Path) -> bool:
    """quantkit export wrote `path`: a record of its kind, read or not (a newer schema, a damaged value)."""
    return of_record_kind(_json(path))


def written_gguf(path: Path) -> bool:
    """quantkit's keys in the GGUF's header; failing that (a header that does not parse), the export
    record beside it naming this file's size and sha256."""

    if written_by_quantkit(path):
        return True
    rec = read_record(record_path(path))
    return rec is not None and rec.bytes == path.stat().st_size and rec.sha256 == sha256_file(path)


def make_parent(out: Path) -> None:
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise QuantkitError(
            f"{Path(out).parent}: cannot create the output directory ({exc.strerror or type(exc).__name__})"
        ) from None
