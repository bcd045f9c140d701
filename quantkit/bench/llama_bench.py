"""llama-bench, llama.cpp's own benchmark, on the GGUF quantkit's llama.cpp engine timed: the anchor
of its rows. Two runs with the same threads: pp = the prompt (prompt_len tokens into an empty
cache: what TTFT times), tg = gen_len single-token steps after prompt_len cached tokens (`-d`:
what TPOT's steps see). A row at a KV depth (--depth) gets the tg run alone, after that depth
(llama-bench prefills the depth once and restores it before each repetition, as quantkit does).
Batch sizes as llama-cpp-python's defaults (n_batch = n_ubatch = 512), flash attention and the K/V
cache types (`-ctk`/`-ctv`) as the row ran them (llama-cpp-python's defaults: off, f16), so a gap
is the build or the harness, not a setting.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantkit.bench.row_parts import Anchor, NoAnchor
from quantkit.gguf import tools

TOLERANCE = 0.10  # a ratio further than this from 1 is flagged: beyond the run-to-run spread of a quiet machine
SETTINGS = ["-b", "512", "-ub", "512", "-ngl", "0"]


def settings(flash_attn: bool, cache_k: str = "f16", cache_v: str = "f16") -> list[str]:
    return [*SETTINGS, "-fa", "1" if flash_attn else "0", "-ctk", cache_k, "-ctv", cache_v]


def _records(gguf: Path, test: list, threads: int, repeats: int, setting: list[str]) -> list[dict]:
    proc = tools.run(
        "llama-bench",
        ["-m", gguf, *test, "-t", threads, "-r", repeats, *setting, "-o", "json"],
        purpose="the llama-bench anchor",
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise tools.ToolError("llama-bench printed no JSON") from None


def parse_tg(tg: dict) -> dict:
    """One tg record of llama-bench's JSON -> TPOT in quantkit's units (ms per generated token)."""
    return {
        "tpot_ms": tg["avg_ns"] / 1e6 / tg["n_gen"],
        "tg_tokens_per_s": tg["avg_ts"],
        "tg_tokens": tg["n_gen"],
        "tg_depth": tg.get("n_depth", 0),
        "flash_attn": tg.get("flash_attn") == 1,  # llama_flash_attn_type: -1 auto, 0 off, 1 on
        "kv_cache": f"{tg.get('type_k', 'f16')}/{tg.get('type_v', 'f16')}",
        "repeats": len(tg.get("samples_ns") or []) or None,
        "build_commit": tg.get("build_commit"),
        "build_number": tg.get("build_number"),
        "cpu_info": tg.get("cpu_info"),
        "backends": tg.get("backends"),
        "threads": tg.get("n_threads"),
    }


def parse(pp: dict, tg: dict) -> dict:
    """One pp and one tg record of llama-bench's JSON -> TTFT/TPOT in quantkit's units (ms per
    prompt, ms per generated token) and tokens per second."""
    return {
        **parse_tg(tg),
        "ttft_ms": pp["avg_ns"] / 1e6,
        "pp_tokens_per_s": pp["avg_ts"],
        "pp_tokens": pp["n_prompt"],
        "repeats": len(pp.get("samples_ns") or []) or None,
    }


def compare(ttft_ms: float | None, tpot_ms: float, anchor: dict, tolerance: float = TOLERANCE) -> Anchor:
    """quantkit's figures over llama-bench's (`anchor`: measure()'s figures; TPOT alone where either
    side has no TTFT: a depth's row); `disagree` names each beyond `tolerance`."""
    ratios = {"tpot": tpot_ms / anchor["tpot_ms"]}
    if ttft_ms is not None and anchor.get("ttft_ms"):
        ratios = {"ttft": ttft_ms / anchor["ttft_ms"], **ratios}
    return Anchor(
        **anchor,
        ratio_ttft=ratios.get("ttft"),
        ratio_tpot=ratios["tpot"],
        disagree=tuple(k for k, r in ratios.items() if abs(r - 1) > tolerance),
        tolerance=tolerance,
    )


def failure(found: dict) -> str | None:
    """Why measure() found no anchor (its {"error": ...}), or None where it found one."""
    return found.get("error")


def anchor_lines(name: str, depth: int | None, a: Anchor | NoAnchor | None) -> list[str]:
    """A row's anchor as its note: llama-bench's figures, quantkit's ratio to them (none where it did not run)."""
    if not isinstance(a, Anchor):
        return []
    flag = "  (!)" if a.disagree else ""
    if depth is not None:
        return [
            f"anchor: {name} at depth {depth}: llama-bench TPOT {a.tpot_ms:.2f} ms "
            f"({a.tg_tokens_per_s:.1f} tok/s, -d {a.tg_depth}, flash attention "
            f"{'on' if a.flash_attn else 'off'}); quantkit/llama-bench {a.ratio_tpot:.2f}" + flag
        ]
    if a.ttft_ms is None or a.ratio_ttft is None:
        return []
    return [
        f"anchor: {name}: llama-bench TTFT {a.ttft_ms:.1f} ms ({a.pp_tokens_per_s:.0f} tok/s), "
        f"TPOT {a.tpot_ms:.2f} ms ({a.tg_tokens_per_s:.1f} tok/s); quantkit/llama-bench "
        f"{a.ratio_ttft:.2f} / {a.ratio_tpot:.2f}" + flag
    ]


def measure(
    gguf: Path,
    prompt_len: int,
    gen_len: int,
    threads: int,
    repeats: int,
    flash_attn: bool = False,
    depth: int | None = None,
    cache: tuple[str, str] = ("f16", "f16"),
) -> dict:
    """llama-bench's pp and tg on `gguf`; with `depth`, its tg alone after that many cached tokens;
    `cache`: the K and V cache types. {"error": one line} when it is not installed or fails."""
    setting = settings(flash_attn, *cache)
    fa = " ".join(setting)
    try:
        if depth is not None:
            tg = _records(gguf, ["-p", 0, "-n", gen_len, "-d", depth], threads, repeats, setting)
            return parse_tg(tg[0]) | {
                "command": f"llama-bench -m {gguf} -p 0 -n {gen_len} -d {depth} -t {threads} -r {repeats} {fa}"
            }
        pp = _records(gguf, ["-p", prompt_len, "-n", 0], threads, repeats, setting)
        tg = _records(gguf, ["-p", 0, "-n", gen_len, "-d", prompt_len], threads, repeats, setting)
        return parse(pp[0], tg[0]) | {
            "command": f"llama-bench -m {gguf} -p {prompt_len} -n 0 / -p 0 -n {gen_len} -d {prompt_len} "
            f"-t {threads} -r {repeats} {fa}"
        }
    except (tools.ToolError, IndexError, KeyError, TypeError) as exc:
        return {"error": str(exc) if isinstance(exc, tools.ToolError) else f"llama-bench's JSON lacks {exc}"}
