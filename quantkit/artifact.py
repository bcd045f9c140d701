"""Writing artifacts safely: a temp dir beside --out, renamed into place only on success.

Ctrl-C, an exception or a failed verification removes the temp dir and leaves --out as it
was; a kill -9 can leave a `.NAME.partial-*` dir beside it (never at --out itself), which
the next convert to the same --out removes.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import QuantkitError


def check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise QuantkitError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise QuantkitError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)


@contextmanager
def staged_dir(out: Path):
    """Yield a fresh temp dir beside `out`; move it to `out` when the block succeeds."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def tool_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in ("quantkit", "torch", "transformers", "llmcompressor", "compressed-tensors", "bitsandbytes", "torchao", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def write_meta(path: Path, meta: dict) -> None:
    (path / "quantkit.json").write_text(json.dumps(meta, indent=2, default=str))


def read_meta(path: Path) -> dict:
    f = Path(path) / "quantkit.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
