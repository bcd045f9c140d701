"""Bench engines by name: one module each, one `Engine` class per module (interface: engine.py),
registered in core/engine_registry.py `ENGINES` (the module of each name).

Modules are imported when their engine is asked for, so an optional engine's library is only
needed by those who use it. What an engine can do is a class attribute of its `Engine`
(engine.py: compiles, takes_gguf, devices, tensor_parallel, sizes_own_memory...): callers ask
`engine_class(name).takes_gguf`, never compare names.
"""

from __future__ import annotations

import importlib

from quantkit.core.engine_registry import ENGINES
from quantkit.errors import QuantkitError


def check_engine(name: str) -> None:
    if name not in ENGINES:
        raise QuantkitError(f"unknown engine {name!r}; valid: {', '.join(ENGINES)}")


def engine_class(name: str):
    """The Engine class registered as `name` (its module imported now)."""
    check_engine(name)
    return importlib.import_module(ENGINES[name].module).Engine
