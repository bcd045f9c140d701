"""Where quantkit keeps its cache: one place, overridable with QUANTKIT_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def home_path() -> Path:
    """The cache root: $QUANTKIT_HOME, else ~/.cache/quantkit (not created: a check that names it)."""
    return Path(os.environ.get("QUANTKIT_HOME") or Path.home() / ".cache" / "quantkit")


def home() -> Path:
    """The cache root (home_path), created on first use."""
    root = home_path()
    root.mkdir(parents=True, exist_ok=True)
    return root


def subdir(name: str) -> Path:
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
