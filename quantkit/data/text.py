"""Reading text sources (their kinds: data/sources.py) and cutting fixed-length token windows.

Calibration and evaluation both cut one token stream into non-overlapping windows of
`seq_len` tokens; a region (first half / second half / all) keeps the two disjoint when they
read the same file. Window i covers tokens [start, start + seq_len) of the stream.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import torch
import yaml
from huggingface_hub import constants

from quantkit.data.mixconfig import load_mix
from quantkit.data.sources import TextSpec, one_of, parse_syntax
from quantkit.errors import DataError, OfflineError
from quantkit.progress import note
from quantkit.resources import calib_data_dir

REGIONS = ("all", "first-half", "second-half")


def _from_manifest(name: str) -> TextSpec:
    """`set:NAME` -> calib_data/NAME.yaml; a relative file: path is relative to the manifest's directory
    (or, where nothing lies there, to its parent: the older layout)."""

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise DataError(f"set:{name}: a set is named by a plain name (a manifest in {calib_data_dir()})")
    manifest = calib_data_dir() / f"{name}.yaml"
    if not manifest.is_file():
        known = sorted(p.stem for p in calib_data_dir().glob("*.yaml"))
        raise DataError(
            f"set:{name}: no manifest {manifest.name} in {calib_data_dir()} (known: {', '.join(known) or 'none'})"
        )
    try:
        data = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        raise DataError(f"set:{name}: {manifest} is not valid YAML") from None
    if not isinstance(data, dict) or not isinstance(data.get("source"), str):
        raise DataError(f"set:{name}: {manifest} needs a 'source: file:PATH' key")
    inner = parse_spec(local_source(name, data))
    if inner.source.local and not Path(inner.path).is_absolute():
        # relative to the manifest's directory; manifests written for the older layout named paths
        # relative to that directory's parent, which is still read when nothing lies beside it
        here, legacy = manifest.parent / inner.path, manifest.parent.parent / inner.path
        inner = replace(inner, path=str((here if here.exists() or not legacy.exists() else legacy).resolve()))
    return replace(inner, expect_sha256=data.get("sha256"), set_name=name)


def local_source(name: str, manifest: dict) -> str:
    """A manifest's source; `file:$VAR` names a text the user keeps where VAR says (a text quantkit
    may not ship, such as share-alike WikiText): unset, it is one line saying what to set."""

    source = manifest["source"]
    var = re.fullmatch(r"file:\$\{?([A-Z_][A-Z0-9_]*)\}?", source)
    if var is None:
        return source
    if not os.environ.get(var.group(1)):
        raise DataError(
            f"set:{name}: not shipped with quantkit ({manifest.get('license') or 'its licence'}); "
            f"set {var.group(1)} to the path of your copy ({manifest.get('description', '').strip()})"
        )
    return "file:" + os.environ[var.group(1)]


def configured(name: str) -> bool:
    """Whether `set:NAME` can be read here: shipped, or kept locally where its variable says."""
    try:
        _from_manifest(name)
    except DataError:
        return False
    return True


def parse_spec(spec: str) -> TextSpec:
    """A text SPEC (data/sources.py), checked as far as it can be without reading the text: a set
    resolved to the text its manifest names, a mix's file validated."""
    parsed = parse_syntax(spec)
    if parsed.kind == "set":
        return _from_manifest(parsed.set_name)
    if parsed.kind == "mix":
        load_mix(parsed.set_name)  # an unknown or invalid mix is one line here, before anything loads
    return parsed


@dataclass
class Text:
    """Raw text and where it came from."""

    text: str
    provenance: dict = field(default_factory=dict)


# Text that is not text: bytes that are not UTF-8 (decoded as U+FFFD) and control characters other
# than tab, newlines, vertical tab and form feed (NUL, escape codes, C1 controls from mis-decoded
# cp1252). Random bytes are mostly these; a real UTF-8 text has none, or a stray few from a bad copy.
# Up to one in ten thousand characters is tolerated with a warning and recorded in the provenance
# (`bad_characters`); more refuses the text, so binary files never become calibration or evaluation text.
MAX_BAD_FRACTION = 1e-4
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")


def check_text(text: str, replaced: int, where: str) -> dict:
    """Refuse binary or non-UTF-8 text; returns provenance notes (the count of bad characters, if any)."""
    return _verdict(text, replaced + _controls(text), replaced, where)


def _controls(text: str) -> int:
    return sum(1 for _ in _CONTROL.finditer(text))


def _verdict(text: str, bad: int, replaced: int, where: str) -> dict:
    if not text.strip():
        raise DataError(f"{where}: no text (the file is empty or only whitespace)")
    if bad == 0:
        return {}
    if bad > MAX_BAD_FRACTION * len(text):
        raise DataError(
            f"{where}: not UTF-8 text: {bad} of {len(text)} characters are invalid UTF-8 or control characters "
            f"(a binary file, or another encoding?); convert it to UTF-8"
        )

    note(
        f"warning: {where}: {bad} of {len(text)} characters are invalid UTF-8 or control characters "
        f"({replaced} replaced with U+FFFD); using the text, recorded as bad_characters"
    )
    return {"bad_characters": bad}


# A text is read whole and tokenized into one stream, which in memory takes several times its size
# (its str, then about 9 bytes per token); calibration and evaluation read a few MB of it. A larger
# file is refused before it is read rather than after minutes and gigabytes.
MAX_TEXT_BYTES = 256 << 20
CHUNK_BYTES = 1 << 20
_REPLACEMENT = "\ufffd".encode()


@dataclass
class _Reading:
    """A file read in chunks: its sha256, size and decoded text, and the bad characters counted."""

    digest: str = ""
    size: int = 0
    text: str = ""
    replaced: int = 0
    bad: int = 0
    chars: int = 0


def _read_decoded(path: Path, decode: bool = True) -> _Reading:
    """The file in CHUNK_BYTES chunks: hashed and (`decode`) decoded as UTF-8 (UTF-16 with its BOM),
    its bad characters counted as it goes. Stops with the refusal once the bad characters alone are
    more than the whole file could hold within MAX_BAD_FRACTION (it holds no more characters than
    bytes), so a binary file costs its first megabyte or so, whatever its size. A text larger than
    MAX_TEXT_BYTES is refused once that much of it is read, none of it kept."""
    size = path.stat().st_size  # a /proc file says 0
    keep = size <= MAX_TEXT_BYTES  # a larger file is only scanned: refused as binary, or for its size
    h, parts, r = hashlib.sha256(), [], _Reading()
    decoder, tail, utf16 = None, b"", False
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                r.size += len(chunk)
                if r.size > MAX_TEXT_BYTES:
                    raise DataError(_too_large(path, max(size, r.size)))
                h.update(chunk)
                if not decode:
                    continue
                if decoder is None:
                    utf16 = chunk.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
                    decoder = codecs.getincrementaldecoder("utf-16" if utf16 else "utf-8-sig")("replace")
                piece = _counted(r, decoder.decode(chunk), tail + chunk, utf16)
                parts.append(piece if keep else "")
                tail = chunk[-2:]
                if r.bad > MAX_BAD_FRACTION * max(size, r.size):
                    raise DataError(
                        f"{path}: not UTF-8 text: {r.bad} of {r.chars} characters in its first {r.size:,} bytes are "
                        f"invalid UTF-8 or control characters, more than one in {1 / MAX_BAD_FRACTION:,.0f} of all it "
                        "holds (a binary file, or another encoding?); convert it to UTF-8"
                    )
            if decoder is not None:
                parts.append(_counted(r, decoder.decode(b"", final=True), b"", utf16))
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    r.digest, r.text = h.hexdigest(), "".join(parts)
    return r


def _counted(r: _Reading, piece: str, raw: bytes, utf16: bool) -> str:
    """Count a decoded piece's bad characters: U+FFFD the decoder put in (not one the file holds:
    `raw` is the chunk with the previous one's last two bytes) and control characters."""
    replaced = max(piece.count("\ufffd") - (0 if utf16 else raw.count(_REPLACEMENT)), 0)
    r.replaced += replaced
    r.bad += replaced + _controls(piece)
    r.chars += len(piece)
    return piece


def _too_large(path, size: int) -> str:
    return (
        f"{path}: {size:,} bytes, over the {MAX_TEXT_BYTES >> 20} MiB a text may have (quantkit reads a text whole "
        "and tokenizes it, several times its size in memory); use a part of it"
    )


def _read_jsonl(path: Path, text: str) -> str:
    rows = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 may sit inside a JSON string
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise DataError(f"{path}:{n}: not valid JSON") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DataError(f"{path}:{n}: each JSONL line needs a string 'text' field")
        rows.append(obj["text"])
    return "\n\n".join(rows)


def _read_parquet(path: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({' '.join(str(exc).split())[:160]})") from None
    if "text" not in table.column_names:
        raise DataError(
            f"{path}: parquet file has no 'text' column (columns: {', '.join(table.column_names) or 'none'})"
        )
    kind = table.schema.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: the parquet 'text' column holds {kind}, not strings")
    return "\n\n".join(t for t in table.column("text").to_pylist() if t)


def _read_file(path: Path) -> tuple[str, dict]:
    """The text of a .txt/.md/.jsonl/.parquet file and its provenance (sha256, bytes, bad characters)."""
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".md", ".text", "", ".jsonl", ".parquet"):
        raise DataError(f"{path}: unsupported text file type {suffix!r}; use .txt, .jsonl or .parquet")
    r = _read_decoded(path, decode=suffix != ".parquet")
    prov = {"sha256": r.digest, "bytes": r.size}
    if suffix == ".parquet":
        text = _read_parquet(path)
        return text, {**prov, **check_text(text, 0, str(path))}
    prov.update(_verdict(r.text, r.bad, r.replaced, str(path)))
    return (_read_jsonl(path, r.text) if suffix == ".jsonl" else r.text), prov


# One request to the Hub, with a short timeout and no retries, before `datasets` tries: without a
# network it retries for about 25 s (measured here: 5 retries with back-off) and only then fails.
HUB_TIMEOUT_S = 5.0


def check_hub_reachable(spec: TextSpec, timeout: float = HUB_TIMEOUT_S) -> None:
    """An `hf:` source needs the Hub unless HF_HUB_OFFLINE=1 (then `datasets` reads its cache, or fails at once)."""

    if constants.is_offline_mode():
        return
    url = f"{constants.ENDPOINT}/api/datasets/{spec.dataset}"
    try:
        httpx.head(url, timeout=timeout)  # any HTTP answer, even 404, means the Hub is there
    except httpx.HTTPError as exc:
        raise OfflineError(
            f"{spec}: the Hugging Face Hub ({constants.ENDPOINT}) is "
            f"unreachable ({type(exc).__name__}); use file:PATH, "
            "or set HF_HUB_OFFLINE=1 to read a copy from the local datasets cache"
        ) from None


def _read_hub(spec: TextSpec) -> Text:
    check_hub_reachable(spec)
    try:
        import datasets

        ds = datasets.load_dataset(spec.dataset, spec.config, split=spec.split)
    except (ConnectionError, OSError) as exc:
        raise OfflineError(
            f"{spec}: cannot load from the Hugging Face Hub ({type(exc).__name__}); use file:PATH offline"
        ) from None
    except ValueError as exc:
        raise DataError(
            f"{spec}: {str(exc).splitlines()[0][:160] if str(exc).strip() else type(exc).__name__}"
        ) from None
    if "text" not in ds.column_names:
        raise DataError(f"{spec}: dataset has no 'text' column")
    rows = [t for t in ds["text"] if t]
    if not all(isinstance(t, str) for t in rows):
        raise DataError(f"{spec}: the dataset's 'text' column does not hold strings")
    text = "\n\n".join(rows)
    if len(text) > MAX_TEXT_BYTES:
        raise DataError(_too_large(spec, len(text)).replace(" bytes,", " characters,", 1))
    prov = {"source": str(spec), "sha256": hashlib.sha256(text.encode()).hexdigest(), "fingerprint": ds._fingerprint}
    prov.update(check_text(text, 0, str(spec)))
    return Text(text, prov)


def read_text(spec: TextSpec) -> Text:
    """Load the raw text of a file or hub source (`self` is generated by calib.self_text)."""
    if spec.source.local:
        path = Path(spec.path).expanduser()
        if not path.exists():
            raise DataError(f"{spec.path}: no such text file")
        if not path.is_file():
            raise DataError(f"{spec.path}: not a regular file")
        text, read = _read_file(path)
        if spec.expect_sha256 and read["sha256"] != spec.expect_sha256:
            raise DataError(
                f"set:{spec.set_name}: {path} has sha256 {read['sha256'][:12]}…, the manifest says "
                f"{spec.expect_sha256[:12]}…"
            )
        prov = {"source": str(spec), **read}
        if spec.set_name:
            prov["set"] = spec.set_name
        return Text(text, prov)
    if spec.source.network:
        return _read_hub(spec)
    if spec.source.parts:
        raise DataError(
            f"{spec}: a calibration mix of several texts, not one text; use one of its parts ({one_of(mix_part=True)})"
        )
    raise DataError("the 'self' source is generated by the model; it has no raw text")


def check_readable(spec_str: str) -> None:
    """Read a file: or hf: source now (it exists, it is text, the Hub answers), so that a bad one
    fails before any model is loaded rather than after."""
    spec = parse_spec(spec_str)
    if not (spec.source.generated or spec.source.parts):
        read_text(spec)


def content_key(spec_str: str) -> str | None:
    """What makes two text SPECs the same text: a local file's (a set's) bytes, by sha256, whatever
    path, symlink or copy names it; an hf: source's dataset, config and split; `self`. None when
    the source cannot be read (its reader reports that, in one line)."""
    spec = parse_spec(spec_str)
    if not spec.source.local:
        return str(spec)
    path = Path(spec.path).expanduser()
    if not path.is_file():
        return None
    st = path.stat()
    if st.st_size > MAX_TEXT_BYTES:  # refused when it is read; the same file is the same inode, unhashed
        return f"file:{st.st_dev}:{st.st_ino}"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    except OSError:
        return None
    return f"sha256:{h.hexdigest()}"


def shortfall(got: int, wanted: int, seq_len: int, region: str, stream_tokens: int | None) -> str | None:
    """One sentence when a text yields fewer windows than were asked for (None when it yields them
    all): how many, and why (its region holds no more)."""
    if got >= wanted:
        return None
    where = "the text" if region == "all" else f"the {region.replace('-', ' ')} of the text"
    size = (
        f" ({stream_tokens // (1 if region == 'all' else 2):,} of its {stream_tokens:,} tokens)"
        if stream_tokens
        else ""
    )
    return f"{got} of the {wanted} windows asked for: {where}{size} holds only {got} windows of {seq_len} tokens"


def tokenize_stream(tokenizer, text: str, chunk_chars: int = 1 << 16):
    """The whole text as one 1-D token tensor (no special tokens), tokenized in line-aligned chunks."""

    ids: list[int] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + chunk_chars)
        if end < len(text):
            nl = text.rfind("\n", start, end)
            end = nl + 1 if nl > start else end
        ids.extend(tokenizer(text[start:end], add_special_tokens=False)["input_ids"])
        start = end
    return torch.tensor(ids, dtype=torch.long)


def region_windows(n_tokens: int, seq_len: int, region: str) -> list[tuple[int, int]]:
    """Non-overlapping [start, end) windows of seq_len tokens lying wholly inside the region."""
    if region not in REGIONS:
        raise DataError(f"unknown region {region!r}; use one of {', '.join(REGIONS)}")
    lo, hi = 0, n_tokens
    if region == "first-half":
        hi = n_tokens // 2
    elif region == "second-half":
        lo = n_tokens // 2
    return [(s, s + seq_len) for s in range(lo, hi - seq_len + 1, seq_len)]


def overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Whether any window of a intersects any window of b (both lists of [start, end))."""
    if not a or not b:
        return False
    a_sorted, b_sorted = sorted(a), sorted(b)
    i = j = 0
    while i < len(a_sorted) and j < len(b_sorted):
        (s1, e1), (s2, e2) = a_sorted[i], b_sorted[j]
        if s1 < e2 and s2 < e1:
            return True
        if e1 <= e2:
            i += 1
        else:
            j += 1
    return False
