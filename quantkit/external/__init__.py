"""Engines quantkit installs into virtual environments of their own and drives as separate processes.

vLLM pins its own torch build and compressed-tensors (vLLM CPU 0.32: compressed-tensors 0.17;
quantkit reads and writes 0.19), so it cannot live in quantkit's environment. `quantkit engines
install vllm` builds its environment once under QUANTKIT_HOME (vllm_env.py); bench and eval start
a worker script in it (vllm_worker.py, which imports vLLM and never quantkit) and talk to it in
JSON lines (worker.py); lever studies start vLLM's own server from the same environment.

    vllm_env.py     where the environment is, how it is built (pins, workarounds), whether it works
    worker.py       a worker process in another Python: requests, answers, errors as one line
    vllm_worker.py  the script that runs inside vLLM's environment
"""

from __future__ import annotations

import importlib

from quantkit.errors import QuantkitError

# The engines `quantkit engines install NAME` builds: each module has install(flavor, force) and status().
INSTALLABLE: dict[str, str] = {
    "vllm": "quantkit.external.vllm_env",
}


def environment(name: str):
    """The module that installs and reports the engine `name`; an unknown name is one line."""
    if name not in INSTALLABLE:
        raise QuantkitError(f"unknown engine {name!r}; quantkit installs: {', '.join(INSTALLABLE)}")
    return importlib.import_module(INSTALLABLE[name])
