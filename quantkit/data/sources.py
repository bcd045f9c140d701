"""The text sources: one registry of the kinds of text SPEC (`file:PATH`, `hf:...`, `set:NAME`,
`mix:NAME`, `self`), each with its syntax and what it can do.

Calibration, evaluation, GQA recovery and a GGUF export's KL all take a text SPEC. What a kind
needs and allows is an attribute of its entry (`network`, `shipped`, `generated`, `parts`, ...),
so callers ask `spec.source.generated` rather than compare names, the commands' help and the
unknown-source error list the kinds from here, and docs/EVALUATION.md's table is
`sources_table()` (tests/test_text.py checks it). Parsing here is syntax only (no file is read);
data/text.py resolves a set to its manifest's text and checks a mix's file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import DataError


@dataclass(frozen=True)
class TextSpec:
    kind: str  # a key of SOURCES; a set resolves to the kind its manifest names (with set_name)
    path: str = ""
    dataset: str = ""
    config: str | None = None
    split: str = ""
    expect_sha256: str | None = None  # from a calib_data/ manifest
    set_name: str | None = None  # `set:NAME` it was resolved from, or the mix's name

    @property
    def source(self) -> Source:
        return SOURCES[self.kind]

    def __str__(self) -> str:
        if self.kind == "file":
            return f"file:{self.path}"
        if self.kind == "hf":
            return f"hf:{self.dataset}:{self.config + ':' if self.config else ''}{self.split}"
        if self.kind in ("set", "mix"):
            return f"{self.kind}:{self.set_name}"
        return "self"


@dataclass(frozen=True)
class Source:
    """One kind of text SPEC: how it is written and what reading it needs and gives."""

    syntax: str  # how a SPEC of this kind is written
    what: str  # one line, for the help and the docs
    parse: Callable[[str | None], TextSpec]  # the SPEC after "KIND:" (None: no colon) -> its TextSpec
    label: Callable[[str], str]  # a short, stable name for a report row, from the SPEC after "KIND:"
    local: bool = False  # a file on this machine: its bytes are the text (hashed, compared by content)
    network: bool = False  # reads the Hugging Face Hub (only its cache with HF_HUB_OFFLINE=1)
    shipped: bool = False  # names package data (calib_data/: a set's manifest, a mix's file)
    generated: bool = False  # the source model writes it: no raw text, the loaded model needed
    parts: bool = False  # several texts by weight, not one: calibration reads it, evaluation scores one text
    mix_part: bool = False  # may be a part of a calibration mix


def _plain(kind: str, rest: str | None, what: str) -> str:
    if not rest:
        raise DataError(f"{kind}: needs {what}, e.g. {kind}:NAME")
    return rest


def _file(rest: str | None) -> TextSpec:
    if not rest:
        raise DataError("file: needs a path, e.g. file:data/eval.txt")
    return TextSpec("file", path=rest)


def _hf(rest: str | None) -> TextSpec:
    parts = (rest or "").split(":")
    if len(parts) == 2 and all(parts):
        return TextSpec("hf", dataset=parts[0], split=parts[1])
    if len(parts) == 3 and all(parts):
        return TextSpec("hf", dataset=parts[0], config=parts[1], split=parts[2])
    raise DataError(f"hf:{rest or ''}: expected hf:DATASET[:CONFIG]:SPLIT")


def _self(rest: str | None) -> TextSpec:
    if rest is not None:
        raise DataError(f"self:{rest}: `self` takes nothing after it")
    return TextSpec("self")


def _file_label(rest: str) -> str:
    return Path(rest).name.rsplit(".", 1)[0] or rest


SOURCES: dict[str, Source] = {
    "file": Source(
        "file:PATH",
        "a local .txt, .md, .jsonl (a `text` field per line) or .parquet (a `text` column) file",
        _file,
        _file_label,
        local=True,
        mix_part=True,
    ),
    "hf": Source(
        "hf:DATASET[:CONFIG]:SPLIT",
        "a Hugging Face dataset's `text` column",
        _hf,
        lambda rest: re.sub(r"[^A-Za-z0-9._-]+", "-", rest).strip("-"),
        network=True,
    ),
    "set": Source(
        "set:NAME",
        "a named text: one quantkit ships, or one kept where an environment variable says; its sha256 checked",
        lambda rest: TextSpec("set", set_name=_plain("set", rest, "a name")),
        lambda rest: rest,
        shipped=True,
        mix_part=True,
    ),
    "mix": Source(
        "mix:NAME",
        "a calibration mix: several texts (and the model's own chat replies) by weight",
        lambda rest: TextSpec("mix", set_name=rest if rest is not None else ""),
        lambda rest: rest,
        shipped=True,
        parts=True,
    ),
    "self": Source(
        "self",
        "the source model writes its own text, seeded (for sites where no data may be used)",
        _self,
        lambda rest: "self",
        generated=True,
    ),
}


def _split(spec: str) -> tuple[str, str | None]:
    kind, colon, rest = spec.strip().partition(":")
    return kind, (rest if colon else None)


def syntaxes(**capabilities: bool) -> list[str]:
    """Each source's syntax, those whose capabilities are as given (`parts=False`: one text)."""
    return [s.syntax for s in SOURCES.values() if all(getattr(s, k) == v for k, v in capabilities.items())]


def one_of(**capabilities: bool) -> str:
    """The syntaxes in words: `file:PATH, set:NAME or self`."""
    names = syntaxes(**capabilities)
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def parse_syntax(spec: str) -> TextSpec:
    """A SPEC's kind and fields, by its syntax alone; an unknown kind lists the known ones."""
    kind, rest = _split(spec)
    if kind not in SOURCES:
        raise DataError(f"{spec.strip()}: unknown text source; use {one_of()}")
    return SOURCES[kind].parse(rest)


def label_of(spec: str) -> str:
    """A short, stable name for a text SPEC: the set's name, the file's stem, the dataset, `self`."""
    kind, rest = _split(spec)
    return SOURCES[kind].label(rest or "") if kind in SOURCES else spec.strip()


def sources_table() -> str:
    """The registry as the Markdown table docs/EVALUATION.md shows."""
    yes = {True: "yes", False: ""}
    rows = [
        "| SPEC | what it is | network | shipped | eval scores it | a mix part |",
        "|---|---|---|---|---|---|",
    ]
    for s in SOURCES.values():
        cells = [f"`{s.syntax}`", s.what, yes[s.network], yes[s.shipped], yes[not s.parts], yes[s.mix_part]]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
