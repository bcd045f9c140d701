"""What quantkit ships besides code: built-in recipes, lever studies, calibration and evaluation
texts, and lm-eval task definitions. They live at the top of the source tree, beside the package:

  recipes/     built-in recipes (`quantkit recipe list`; a RECIPE argument may name one)
  studies/     lever studies (`quantkit levers NAME`)
  calib_data/  named texts (`set:NAME`) and calibration mixes (`mix:NAME`); QUANTKIT_CALIB_DATA overrides
  evals/       quantkit's offline lm-eval tasks; QUANTKIT_EVALS_DIR overrides

A wheel carries them as package data, quantkit/_data/NAME (setup.py maps each top-level directory
there), found through importlib.resources, so a wheel installed anywhere (pip, pipx) finds them
outside the checkout. An editable install's package is the checkout's quantkit/, beside which they
lie: setuptools' editable finder maps only importable packages, not a data directory below one.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from quantkit.errors import QuantkitError

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def shipped_dir(name: str) -> Path:
    """The directory of one kind of shipped data: the wheel's quantkit/_data/NAME, or in a checkout
    (an editable install) the top-level NAME/ beside the package."""
    # quantkit is installed as plain files (setuptools' package data, no zip), so the traversable
    # is a real directory: files beside it (includes, texts) resolve as they do in a checkout.
    installed = Path(str(resources.files("quantkit").joinpath("_data", name)))
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / name


def recipes_dir() -> Path:
    return shipped_dir("recipes")


def studies_dir() -> Path:
    return shipped_dir("studies")


def calib_data_dir() -> Path:
    return Path(os.environ.get("QUANTKIT_CALIB_DATA") or shipped_dir("calib_data"))


def eval_tasks_dir() -> Path:
    return Path(os.environ.get("QUANTKIT_EVALS_DIR") or shipped_dir("evals"))


def builtin(directory: Path) -> dict[str, Path]:
    """name -> file of each YAML file in a built-in directory."""
    return {p.stem: p for p in sorted(directory.glob("*.yaml"))}


def find(ref: str | Path, directory: Path, what: str, prefix: str = "") -> Path:
    """A path as given when it exists; else a built-in by name (with or without .yaml, and without the
    file names' common prefix); else one line."""
    p = Path(ref).expanduser()
    if p.exists() or not _PLAIN.fullmatch(str(ref)):
        return p  # a path: the reader reports what is wrong with it
    known = builtin(directory)
    name = str(ref)[:-5] if str(ref).endswith(".yaml") else str(ref)
    for candidate in (name, prefix + name):
        if candidate in known:
            return known[candidate]
    raise QuantkitError(
        f"{ref}: no such file, and no built-in {what} of that name (built-in: {', '.join(known) or 'none'})"
    )


def find_recipe(ref: str | Path) -> Path:
    return find(ref, recipes_dir(), "recipe")


def find_study(ref: str | Path) -> Path:
    return find(ref, studies_dir(), "lever study", prefix="levers-")
