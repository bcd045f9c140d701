"""Each artifact file's sha256 and size, recorded where the file is created (the conversion's
staging dir, before the rename) and checked where it is consumed (publish, a run's reuse).

The manifest lives in quantkit.json as `files: {relative/path: {sha256, bytes}}`; it covers every
file of the artifact except quantkit.json itself. `verify` refuses a changed, missing or extra
file and a symbolic link anywhere in the tree (an upload would follow it out of the artifact).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path, PurePosixPath

from quantkit.errors import QuantkitError

META = "quantkit.json"
_CHUNK = 1 << 22


def sha256_file(path: Path, fsync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
        if fsync:  # the bytes just hashed are the bytes on disk before the artifact is renamed into place
            os.fsync(fh.fileno())
    return h.hexdigest()


def _walk(root: Path):
    """(relative posix name, path, lstat) of every entry under root, symlinks not followed."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            yield p.relative_to(root).as_posix(), p, p.lstat()


def manifest(root: Path, fsync: bool = True) -> dict:
    """sha256 and size of every regular file under root except quantkit.json (fsynced as it goes)."""

    files = {}
    for name, p, st in sorted(_walk(Path(root))):
        if stat.S_ISREG(st.st_mode) and name != META:
            files[name] = {"sha256": sha256_file(p, fsync=fsync), "bytes": st.st_size}
    return files


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/"))


def problems(root: Path, files: dict, deep: bool = True) -> list[str]:
    """What differs between the artifact on disk and its manifest; [] when they agree.
    deep=False compares sizes only (cheap: a run's reuse check); publish hashes every byte."""

    root = Path(root)
    found: list[str] = []
    seen = set()
    for name, p, st in _walk(root):
        if stat.S_ISLNK(st.st_mode):
            found.append(f"{name} is a symbolic link (an artifact holds regular files only)")
        elif stat.S_ISREG(st.st_mode):
            seen.add(name)
            if name != META and name not in files and not _hidden(name):
                found.append(f"extra file {name} (not written by the conversion)")
        elif not stat.S_ISDIR(st.st_mode):
            found.append(f"{name} is not a regular file")
    for name, rec in files.items():
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or not isinstance(rec, dict):
            found.append(f"manifest entry {name!r} is not a file inside the artifact")
        elif name not in seen:
            found.append(f"missing file {name}")
        elif (root / name).stat().st_size != rec.get("bytes"):
            found.append(
                f"{name}: {(root / name).stat().st_size} bytes on disk, {rec.get('bytes')} "
                "recorded at conversion (changed or truncated)"
            )
        elif deep and sha256_file(root / name) != rec.get("sha256"):
            found.append(f"{name}: sha256 differs from the one recorded at conversion (changed or corrupt)")
    return found


def check(root: Path, meta: dict, deep: bool = True) -> dict:
    """The artifact's manifest (file -> sha256 and bytes) when the artifact matches it; else
    QuantkitError naming the first problem (and how many more)."""
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise QuantkitError(
            f"{root}: no integrity manifest (`files` in {META}); only artifacts written by "
            "`quantkit convert` can be checked: convert it again"
        )
    if not any(n.endswith(".safetensors") for n in files):
        raise QuantkitError(f"{root}: its manifest records no weight file (*.safetensors)")
    found = problems(root, files, deep)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise QuantkitError(f"{root}: {found[0]}{more}")
    return files


def record(root: Path, meta: dict, name: str) -> None:
    """Re-record one file after a deliberate rewrite (the model card's results table)."""
    files = meta.get("files")
    if isinstance(files, dict):
        p = Path(root) / name
        files[name] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
