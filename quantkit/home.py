"""Where quantkit keeps its cache: one place, overridable with QUANTKIT_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The cache root: $QUANTKIT_HOME, else ~/.cache/quantkit. Created on first use."""
    root = Path(os.environ.get("QUANTKIT_HOME") or Path.home() / ".cache" / "quantkit")
    root.mkdir(parents=True, exist_ok=True)
    return root


def subdir(name: str) -> Path:
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
