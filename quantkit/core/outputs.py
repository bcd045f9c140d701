"""What a command may write, checked before it does any work: one rule for every output path
(`bench --out/--plot`, `compare --plot`, `load --out/--plot`, `pareto --out`).

- Never an input or inside one: the models a command reads (a checkpoint directory and the files
  its symlinks point at, a GGUF file), nor inside any quantkit artifact (a directory holding
  `quantkit.json`: `publish` refuses an artifact with a file its manifest does not name) or
  QUANTKIT_HOME (quantkit's cache, which it replaces and removes). Symlinks are resolved first,
  and an output may not itself be a symbolic link.
- Never over a file quantkit did not write: an existing output needs `--force`, and `--force`
  replaces only a file of the kind the command writes (a JSON object whose `kind` is the
  command's, a PNG carrying quantkit's mark).
- A plot is a PNG (`.png`); two outputs of one command are two different files.
- A directory output (`pareto --out`) is a directory of its own: not the root, home or current
  directory (nor a parent of it), not inside another artifact, run directory or front, and, when
  it exists, empty or one the same command made (`made`).

Files are written whole (core/atomic.py: a temp file beside, fsync, rename); a PNG through
`save_png`, which marks it as quantkit's.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from quantkit.core.atomic import write_bytes
from quantkit.errors import QuantkitError
from quantkit.home import home_path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_MARK = "quantkit"  # the PNG's `Software` text, written by save_png, read by written_png
ARTIFACT_META = "quantkit.json"
# files that make a directory quantkit's own: an artifact, a run directory, a front
MADE_BY_QUANTKIT = {"quantkit.json": "a quantkit artifact", "steps.json": "a run directory", "pareto.json": "a front"}
_MAX_JSON_BYTES = 1 << 30  # a file quantkit may replace is read whole to check its kind; none is larger


class OutputError(QuantkitError):
    """A result that was measured but could not be written (its JSON is kept where it was asked for)."""

    exit_code = 1


@dataclass(frozen=True)
class Output:
    """One file a command writes: its path, the option that named it, and what it holds:
    `json` (replaceable when it is a JSON object of one of `kinds`) or `png`."""

    path: Path
    option: str
    format: str = "json"
    kinds: tuple[str, ...] = ()


def resolved(p) -> Path:
    return Path(os.path.abspath(Path(p).expanduser())).resolve()


def model_inputs(sources: Iterable) -> list[tuple[Path, str]]:
    """(path, what it is) of each model a command reads: a directory and every file its symlinks
    point at (a hub cache's blobs), or a file (a GGUF)."""
    found: list[tuple[Path, str]] = []
    for src in sources:
        if not isinstance(src, (str, Path)) or not Path(src).exists():
            continue  # a synthetic shape: nothing on disk
        src = Path(src)
        found.append((resolved(src), "a model this command reads"))
        if src.is_dir():
            found += [
                (resolved(e), f"a file of the model {src} ({e.name} links to it)")
                for e in src.iterdir()
                if e.is_symlink()
            ]
    return found


def made_above(r: Path, markers=(ARTIFACT_META,)) -> tuple[Path, str] | None:
    """The nearest directory that quantkit made (by its marker file: an artifact's quantkit.json, a
    run's steps.json, a front's pareto.json) among `r` (resolved) and the directories above it."""
    for d in (r, *r.parents):
        for name in markers:
            if (d / name).is_file():
                return d, MADE_BY_QUANTKIT[name]
    return None


def _refuse_inputs(path: Path, option: str, inputs) -> Path:
    """The resolved path, after refusing an input, anything inside one, and quantkit's cache."""
    r = resolved(path)
    for p, what in [*inputs, (resolved(home_path()), "quantkit's cache (QUANTKIT_HOME)")]:
        if r == p or p in r.parents:
            verb = "is" if r == p else "lies inside"
            raise QuantkitError(f"{option} {path} {verb} {what} ({p}); choose another path (nothing was changed)")
    if path.is_symlink():
        raise QuantkitError(f"{option} {path} is a symbolic link; name a file, not a link (nothing was changed)")
    return r


def check_files(outputs: Iterable[Output], *, inputs=(), force: bool = False) -> None:
    """Every output file of one command, checked before any work (one line, exit 2, nothing written)."""
    seen: dict[Path, str] = {}
    for o in outputs:
        r = check_file(o, inputs=inputs, force=force)
        if r in seen:
            raise QuantkitError(f"{o.option} {o.path} is also {seen[r]}'s file; give each output its own path")
        seen[r] = o.option


def check_file(o: Output, *, inputs=(), force: bool = False) -> Path:
    path = Path(o.path)
    if o.format == "png" and path.suffix.lower() != ".png":
        raise QuantkitError(f"{o.option} {path}: a plot is written as PNG; name a .png file")
    r = _refuse_inputs(path, o.option, inputs)
    made = made_above(r.parent, (ARTIFACT_META,))
    if made:
        raise QuantkitError(
            f"{o.option} {path} lies inside {made[1]} ({made[0]}), which holds only what quantkit wrote "
            "there; choose another path (nothing was changed)"
        )
    if path.exists():
        _replaceable(path, o, force)
    _writable_parent(path, o.option)
    return r


def _replaceable(path: Path, o: Output, force: bool) -> None:
    if path.is_dir():
        raise QuantkitError(f"{o.option} {path} is a directory; name the file to write")
    if not path.is_file():
        raise QuantkitError(f"{o.option} {path} is not a regular file; choose another path")
    if not force:
        raise QuantkitError(f"{o.option} {path} already exists; pass --force to replace it")
    ours = written_png(path) if o.format == "png" else written_json(path, o.kinds)
    if not ours:
        what = "a PNG quantkit wrote" if o.format == "png" else f"a quantkit result of kind {' or '.join(o.kinds)}"
        raise QuantkitError(
            f"{o.option} {path} is not {what}; --force replaces only those: remove it yourself or "
            "choose another path (nothing was changed)"
        )


def _writable_parent(path: Path, option: str) -> None:
    """The nearest existing directory above `path` (its parents are made when it is written)."""
    p = Path(os.path.abspath(path)).parent
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise QuantkitError(f"{option} {path}: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise QuantkitError(f"{option} {path}: cannot write into {p}")


def written_json(path: Path, kinds: tuple[str, ...]) -> bool:
    """A JSON object whose `kind` is one of `kinds`: a result quantkit wrote."""
    try:
        if path.stat().st_size > _MAX_JSON_BYTES:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("kind") in kinds


def written_png(path: Path) -> bool:
    """A PNG whose `Software` text (before its image data) is quantkit's mark (save_png)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != PNG_SIGNATURE:
                return False
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return False
                size, kind = struct.unpack(">I4s", head)
                if kind == b"IDAT":
                    return False
                body = fh.read(size)
                fh.seek(4, io.SEEK_CUR)  # the chunk's CRC
                if kind == b"tEXt" and body == b"Software\x00" + PNG_MARK.encode():
                    return True
    except OSError:
        return False


def _lock_file(p: Path) -> bool:
    """A lock quantkit takes inside a directory it writes (core/atomic.py lock_path: `.NAME.lock`)."""
    return p.name.startswith(".") and p.name.endswith(".lock") and p.is_file()


def save_png(fig, path: Path, dpi: int) -> None:
    """A matplotlib figure as a PNG marked as quantkit's, written whole (temp file, fsync, rename)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": PNG_MARK})
    write_bytes(Path(path), buf.getvalue())


def check_dir(
    path: Path, option: str, *, inputs=(), made: Callable[[Path], bool], what: str, markers=tuple(MADE_BY_QUANTKIT)
) -> None:
    """A directory of its own for a command's results: refused, one line, when it is the root, home
    or current directory or a parent of it, an input or inside or around one, inside a directory
    quantkit made (`markers`: an artifact, a run directory, a front), or an existing directory that
    is neither empty nor `made` by this command."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise QuantkitError(f"{option} {path} exists and is not a directory; name the directory of {what}")
    r = _refuse_inputs(path, option, ())
    cwd = resolved(Path.cwd())
    if r == Path(r.anchor) or r == resolved(Path.home()) or r == cwd or r in cwd.parents:
        raise QuantkitError(
            f"{option} {path} is the root, home or current directory or holds it; {what} is a new "
            "directory of its own (nothing was changed)"
        )
    for p, whose in inputs:
        if r == p or p in r.parents or r in p.parents:
            verb = "is" if r == p else "lies inside" if p in r.parents else "contains"
            raise QuantkitError(f"{option} {path} {verb} {whose} ({p}); choose another directory (nothing was changed)")
    outer = made_above(r.parent, markers)
    if outer:
        raise QuantkitError(
            f"{option} {path} lies inside {outer[1]} ({outer[0]}); {what} is a directory of its own: "
            "choose another (nothing was changed)"
        )
    if path.is_dir() and not made(path) and any(not _lock_file(p) for p in path.iterdir()):
        raise QuantkitError(
            f"{option} {path} is not empty and is not {what} quantkit made; choose another directory, "
            "or empty it yourself (nothing was changed)"
        )
