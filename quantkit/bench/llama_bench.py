"""llama-bench, llama.cpp's own benchmark, on the GGUF quantkit's llama.cpp engine timed: the anchor
of its rows. Two runs with the same threads: pp = the prompt (prompt_len tokens into an empty
cache: what TTFT times), tg = gen_len single-token steps after prompt_len cached tokens (`-d`:
what TPOT's steps see). Batch sizes and flash attention as llama-cpp-python's defaults
(n_batch = n_ubatch = 512, flash attention off), so a gap is the build or the harness, not a setting.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.gguf import tools

TOLERANCE = 0.10  # a ratio further than this from 1 is flagged: beyond the run-to-run spread of a quiet machine
SETTINGS = ["-b", "512", "-ub", "512", "-fa", "0", "-ngl", "0"]


def _records(gguf: Path, test: list, threads: int, repeats: int) -> list[dict]:
    proc = tools.run(
        "llama-bench",
        ["-m", gguf, *test, "-t", threads, "-r", repeats, *SETTINGS, "-o", "json"],
        purpose="the llama-bench anchor",
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise tools.ToolError("llama-bench printed no JSON") from None


def parse(pp: dict, tg: dict) -> dict:
    """One pp and one tg record of llama-bench's JSON -> TTFT/TPOT in quantkit's units (ms per
    prompt, ms per generated token) and tokens per second."""
    return {
        "ttft_ms": pp["avg_ns"] / 1e6,
        "pp_tokens_per_s": pp["avg_ts"],
        "pp_tokens": pp["n_prompt"],
        "tpot_ms": tg["avg_ns"] / 1e6 / tg["n_gen"],
        "tg_tokens_per_s": tg["avg_ts"],
        "tg_tokens": tg["n_gen"],
        "tg_depth": tg.get("n_depth", 0),
        "repeats": len(pp.get("samples_ns") or []) or None,
        "build_commit": pp.get("build_commit"),
        "build_number": pp.get("build_number"),
        "cpu_info": pp.get("cpu_info"),
        "backends": pp.get("backends"),
        "threads": pp.get("n_threads"),
    }


def compare(ttft_ms: float, tpot_ms: float, anchor: dict, tolerance: float = TOLERANCE) -> dict:
    """quantkit's figures over llama-bench's; `disagree` names each beyond `tolerance`."""
    ratios = {"ttft": ttft_ms / anchor["ttft_ms"], "tpot": tpot_ms / anchor["tpot_ms"]}
    return {
        **anchor,
        "ratio_ttft": ratios["ttft"],
        "ratio_tpot": ratios["tpot"],
        "disagree": [k for k, r in ratios.items() if abs(r - 1) > tolerance],
        "tolerance": tolerance,
    }


def measure(gguf: Path, prompt_len: int, gen_len: int, threads: int, repeats: int) -> dict:
    """llama-bench's pp and tg on `gguf`; {"error": one line} when it is not installed or fails."""
    try:
        pp = _records(gguf, ["-p", prompt_len, "-n", 0], threads, repeats)
        tg = _records(gguf, ["-p", 0, "-n", gen_len, "-d", prompt_len], threads, repeats)
        return parse(pp[0], tg[0]) | {
            "command": f"llama-bench -m {gguf} -p {prompt_len} -n 0 / -p 0 -n {gen_len} -d {prompt_len} "
            f"-t {threads} -r {repeats} {' '.join(SETTINGS)}"
        }
    except (tools.ToolError, IndexError, KeyError, TypeError) as exc:
        return {"error": str(exc) if isinstance(exc, tools.ToolError) else f"llama-bench's JSON lacks {exc}"}
