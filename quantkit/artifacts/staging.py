"""Writing artifacts safely: what `--out` may be, a lock on it, and a temp dir renamed into place.

- `guard_out`: --out never is, or contains, an input (the source checkpoint and the files its
  symlinks point at, the calibration or evaluation text, the recipe files), the current
  directory, $HOME or QUANTKIT_HOME; symlinks are resolved first.
- `claim_out`: an exclusive lock beside --out for the whole command (a second process gets one
  line, exit 2). Under it, what a dead process left beside --out is cleaned up:
  `.NAME.partial-*` (staging), `.NAME.offload-*` (offloaded weights), `.NAME.old-PID` (the old
  artifact of an interrupted --force swap, restored to --out when --out is missing)
  (core/atomic.py: recover_leftovers).
- `check_out`: an existing --out needs --force, and --force replaces only a directory that
  quantkit wrote (it holds quantkit.json) or an empty one.
- `staged_dir`: the artifact is written into `.NAME.partial-*`, given the user's umask, fsynced,
  then swapped in (core/atomic.py: swap_in): old aside, new in (with SIGINT/SIGTERM held between
  the two renames), old removed. Any failure removes the staging dir and leaves --out as it was.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import sys
import tempfile
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from quantkit.core.atomic import (
    DiskFullError,
    apply_umask,
    exclusive,
    fsync_dir,
    is_disk_full,
    recover_leftovers,
    remove,
    swap_in,
    write_json,
)
from quantkit.data.text import parse_spec
from quantkit.errors import QuantkitError
from quantkit.home import home
from quantkit.recipe.files import include_target
from quantkit.resources import find_recipe

META = "quantkit.json"


def _resolved(p) -> Path:
    return Path(os.path.abspath(Path(p).expanduser())).resolve()


def _protected() -> list[tuple[Path, str]]:
    out = [(_resolved(Path.cwd()), "the current directory"), (_resolved(Path.home()), "your home directory")]
    return out + [(_resolved(home()), "quantkit's cache (QUANTKIT_HOME)")]


def guard_out(out: Path, inputs=(), option: str = "--out") -> None:
    """Refuse an --out that is or contains an input or a directory nobody means to replace.
    `inputs`: (path, what it is) pairs, e.g. from `model_inputs` and `text_input`."""
    o = _resolved(out)
    if o == Path(o.anchor):
        raise QuantkitError(f"{option} {out} is the root directory; choose a new directory for the artifact")
    for p, what in [*_protected(), *inputs]:
        if o == p or o in p.parents:
            verb = "is" if o == p else "contains"
            raise QuantkitError(f"{option} {out} {verb} {what} ({p}); choose another directory (nothing was changed)")


def model_inputs(src) -> list[tuple[Path, str]]:
    """The checkpoint directory and every file its symlinks point at (a hub cache's blobs)."""
    if src is None or not Path(src).exists():
        return []
    src = Path(src)
    found = [(_resolved(src), "the source checkpoint")]
    if src.is_dir():
        for entry in src.iterdir():
            if entry.is_symlink():
                found.append((_resolved(entry), f"a file of the source checkpoint ({entry.name} links to it)"))
    return found


def text_input(spec: str | None, what: str) -> list[tuple[Path, str]]:
    """A `file:PATH` (or `set:NAME` resolving to one) text source; other kinds have no local file."""
    if not spec:
        return []

    try:
        parsed = parse_spec(str(spec))
    except QuantkitError:
        return []  # reported by the code that reads it
    return [(_resolved(parsed.path), what)] if parsed.source.local else []


def recipe_inputs(path) -> list[tuple[Path, str]]:
    """The recipe file and the recipe files its variants include (`variants[i].recipe`)."""

    p = find_recipe(path)
    found = [(_resolved(p), "the recipe file")]
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return found  # load_recipe reports it
    for v in (data.get("variants") or []) if isinstance(data, dict) else []:
        if isinstance(v, dict) and isinstance(v.get("recipe"), str):
            try:
                target = include_target(p, v["recipe"], "", ())
            except QuantkitError:
                target = p.parent / v["recipe"]  # load_recipe reports it
            found.append((_resolved(target), "a recipe file it includes"))
    return found


def check_out(out: Path, force: bool) -> None:
    """Checks alone (`convert --plan` makes them too); the lock on --out creates its parent."""
    out = Path(out)
    if os.path.lexists(out) and not out.exists():
        raise QuantkitError(f"{out} is a broken symbolic link; remove it or choose another --out")
    if out.exists() and not out.is_dir():
        raise QuantkitError(f"{out} exists and is not a directory; --out names the artifact directory to create")
    if out.exists() and not force:
        raise QuantkitError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not (out / META).is_file() and any(out.iterdir()):
        raise QuantkitError(
            f"{out} is not a quantkit artifact (no {META}) and is not empty; --force replaces only an "
            "artifact quantkit wrote: remove it yourself or choose another --out"
        )


@contextmanager
def claim_out(out: Path):
    """Lock --out for this process, clean what dead processes left, turn a full disk into one line."""
    guard_out(out)
    out = Path(out)
    with exclusive(out, what=str(out)):
        recover_leftovers(out)
        try:
            yield
        except (QuantkitError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if is_disk_full(exc):
                raise DiskFullError(
                    f"no space left on the device holding {out.parent} while writing {out}; "
                    f"nothing was written at {out} (free some space and run again)"
                ) from None
            raise


@contextmanager
def staged_dir(out: Path, prefix: str = "partial"):
    """Yield a fresh temp dir beside `out`; swap it in for `out` when the block succeeds."""
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{prefix}-", dir=out.parent))
    try:
        yield tmp
        apply_umask(tmp)
        fsync_dir(tmp)
    except BaseException:
        remove(tmp)
        raise
    swap_in(tmp, out)


@contextmanager
def temp_dir_beside(out: Path, prefix: str):
    """A scratch dir beside `out` (e.g. offloaded weights), always removed."""
    folder = Path(tempfile.mkdtemp(prefix=f".{Path(out).name}.{prefix}-", dir=Path(out).parent))
    try:
        yield folder
    finally:
        remove(folder)


def free_bytes(path: Path) -> int:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def check_free_space(out: Path, need: int) -> None:
    free = free_bytes(Path(out).parent)
    if free < need:
        raise DiskFullError(
            f"{Path(out).parent}: {free / 1e9:.2f} GB free, but the artifact needs about {need / 1e9:.2f} GB "
            "(estimated from the model's parameters and the method); free some space or choose another --out"
        )


def estimate_bytes(n_params: int, quantized: int, rows: int, bits: int, group_size: int, itemsize: int) -> int:
    """Artifact bytes: `quantized` weights at `bits` plus a 2-byte scale and zero point per group
    (per row when group_size is -1); every other parameter at the checkpoint's `itemsize`."""
    scales = 4 * (quantized // group_size if group_size > 0 else rows)
    return (n_params - quantized) * itemsize + quantized * bits // 8 + scales


def disk_needed(artifact_bytes: int, offloaded_bytes: int = 0) -> int:
    """Headroom: tokenizer and config files, and 5% for the estimate; an offloaded conversion
    also keeps its offloaded weights and the reload's on the same disk until it finishes."""
    extra = offloaded_bytes + artifact_bytes if offloaded_bytes else 0
    return int(artifact_bytes * 1.05) + (32 << 20) + extra


def peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def tool_versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for pkg in (
        "quantkit",
        "torch",
        "transformers",
        "llmcompressor",
        "compressed-tensors",
        "bitsandbytes",
        "torchao",
        "safetensors",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def write_meta(path: Path, meta: dict) -> None:
    write_json(Path(path) / META, meta, default=str)


def recorded_name(path: Path) -> str | None:
    """The name an artifact's quantkit.json records; None where it records none or is not JSON."""
    try:
        return json.loads((Path(path) / META).read_text()).get("name")
    except json.JSONDecodeError:
        return None


def read_meta(path: Path) -> dict:
    """An artifact's quantkit.json; {} when missing; QuantkitError when damaged."""
    f = Path(path) / META
    if not f.is_file():
        return {}
    try:
        meta = json.loads(f.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise QuantkitError(f"{f} is damaged (not valid JSON)") from None
    if not isinstance(meta, dict):
        raise QuantkitError(f"{f} is damaged (not a JSON object)")
    return meta


def verification_problem(meta: dict) -> str | None:
    """Why an artifact's quantkit.json does not show a passed reload check, or None: the status
    alone is not enough, its KL must be a finite number within its threshold (an artifact written
    before non-finite KLs failed holds `"mean_kl": NaN` with `"status": "passed"`)."""
    v = meta.get("verification") if isinstance(meta.get("verification"), dict) else {}
    status = v.get("status")
    if status != "passed":
        return f"verification {status or 'was skipped'}"
    kl, limit = v.get("mean_kl"), v.get("threshold_mean_kl")
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (kl, limit))
    if not numbers or not kl <= limit:
        return f"verification recorded mean KL {kl!r} against a threshold of {limit!r}, not a finite KL within it"
    return None
