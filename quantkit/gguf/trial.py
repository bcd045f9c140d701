"""A GGUF run once in a child process with the settings quantkit is about to run it with in its own
process (the cache types, flash attention, the device), so that a native abort of llama.cpp (a
`GGML_ASSERT`, a segmentation fault) ends that child, not quantkit: one line naming the signal and
llama.cpp's last words, exit 1 (core/signals.py), as for the tools quantkit starts (tools.py).

The child loads the file, makes a small context and prefills and decodes a few tokens: the graphs
llama.cpp builds at every depth (llama-context.cpp reserves the worst case when the context is
made). A run that passed is remembered under QUANTKIT_HOME (keyed by the file's path, size and
modification time, the library and the settings), so the same bench or eval does not pay twice. A
failure that is not a signal (llama.cpp refusing the file or the context) is left to the load in
quantkit's own process, which says it in its own line.

Run as `python -m quantkit.gguf.trial '{"model": ..., "type_k": ..., ...}'`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from quantkit.core.atomic import write_json
from quantkit.core.signals import EngineCrash, crash_line, signal_name
from quantkit.gguf.cpu_probe import LIB_ENV, open_library
from quantkit.home import subdir

TIMEOUT_S = 600.0
CTX, PROMPT, DECODE = 64, 8, 2


def _key(args: dict) -> str:
    st = Path(args["model"]).stat()
    ident = [args, st.st_size, st.st_mtime_ns, os.environ.get(LIB_ENV, "")]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def check_runs(gguf: Path, types: tuple[int, int], flash_attn: bool, gpu: bool, what: str) -> None:
    """EngineCrash (one line, exit 1) when llama.cpp dies of a signal running `gguf` so."""
    args = {"model": str(Path(gguf).resolve()), "type_k": types[0], "type_v": types[1]}
    args |= {"flash_attn": flash_attn, "gpu": gpu}
    record = subdir("llama-trials") / f"{_key(args)}.json"
    if record.is_file():
        return
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # ggml's abort attaches gdb otherwise (seconds, 170 lines)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "quantkit.gguf.trial", json.dumps(args)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise EngineCrash(
            f"llama.cpp on {gguf} ({what}) did not make its first tokens within {TIMEOUT_S:.0f} s"
        ) from None
    if signal_name(proc.returncode):
        said = _last_words(proc.stderr)
        raise EngineCrash(crash_line(f"llama.cpp on {gguf} ({what}{'; ' + said if said else ''})", proc.returncode))
    if proc.returncode == 0:
        write_json(record, {"ran": args})


def _last_words(stderr: str) -> str:
    """llama.cpp's own reason, the GGML_ASSERT line where there is one, shortened to one clause."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((ln for ln in reversed(lines) if "GGML_ASSERT" in ln or "error" in ln.lower()), "")
    return said.split("/")[-1][:200] if said else ""


def _run(args: dict) -> None:
    lib = os.environ.get(LIB_ENV)
    llama_cpp = open_library(Path(lib) if lib else None)
    llm = llama_cpp.Llama(
        model_path=args["model"],
        n_ctx=CTX,
        n_batch=CTX,
        n_threads=2,
        n_gpu_layers=-1 if args["gpu"] else 0,
        flash_attn=args["flash_attn"],
        type_k=args["type_k"],
        type_v=args["type_v"],
        logits_all=False,
        verbose=False,
    )
    n = llm.n_vocab()
    llm.eval([i % n for i in range(1, PROMPT + 1)])
    for t in range(DECODE):
        llm.eval([(PROMPT + 1 + t) % n])


if __name__ == "__main__":
    _run(json.loads(sys.argv[1]))
