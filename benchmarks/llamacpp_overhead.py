#!/usr/bin/env python3
"""Does quantkit's llama.cpp harness add anything? Its figures against a bare timing loop over
llama-cpp-python, interleaved in one process, on the same GGUF with the same threads and lengths.

For each GGUF: quantkit's engine (quantkit.bench.engines.llamacpp_engine, timed by the shared harness
exactly as `quantkit bench --engine llamacpp` times it) and a separately loaded bare
`llama_cpp.Llama` (the same n_ctx and threads) each get warm-ups, then --rounds rounds of one
repeat each, the order alternating every round (ABBA) so that drift of a shared machine falls on
both. The bare loop is what a user would write: reset, eval(prompt), argmax, then eval([token]),
argmax per token, timed with perf_counter. llama.cpp's own counters (llama_perf_context:
t_p_eval / t_eval per token, no Python at all) are reported beside it.

Reported per GGUF: quantkit's TPOT against llama.cpp's own timing of the same decode calls
(the same steps, the same moment: no drift of the machine between the two), with every round's
ratio, and the median paired ratio quantkit / bare loop. Writes benchmarks/results/NAME.json.

  python benchmarks/llamacpp_overhead.py A.gguf B.gguf --prompt-len 256 --gen-len 64 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_result  # noqa: E402


def bare_repeat(llm, ids: list[int], gen_len: int) -> tuple[float, list[float], dict]:
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    llama_cpp = import_llama_cpp()

    n_vocab = llm.n_vocab()

    def argmax() -> int:
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(n_vocab,)).argmax())

    llama_cpp.llama_perf_context_reset(llm.ctx)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    tok = argmax()
    t1 = time.perf_counter()
    steps, last = [], t1
    for _ in range(gen_len - 1):
        llm.eval([tok])
        tok = argmax()
        now = time.perf_counter()
        steps.append(now - last)
        last = now
    return t1 - t0, steps, _internal(llm)


def quantkit_repeat(engine, ids: list[int], gen_len: int) -> tuple[float, list[float], dict]:
    """One repeat through the shared harness, with llama.cpp's own counters of the same calls."""
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    llama_cpp = import_llama_cpp()

    from quantkit.bench.harness import measure

    llama_cpp.llama_perf_context_reset(engine.llm.ctx)
    t = measure(engine, ids, gen_len, repeats=1, min_seconds=0, warmups=0)
    return t.ttft_s[0], t.step_s[0], _internal(engine.llm)


def _internal(llm) -> dict:
    """llama.cpp's own timing of the calls since the last reset (llama_perf_context): the prompt's
    decode, and each one-token decode from its start to the synchronisation that hands the logits
    over - what llama-bench's tg times per token, without a line of Python."""
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    llama_cpp = import_llama_cpp()

    perf = llama_cpp.llama_perf_context(llm.ctx)
    return {
        "ttft_ms": perf.t_p_eval_ms,
        "tpot_ms": perf.t_eval_ms / max(1, perf.n_eval),
        "n_eval": perf.n_eval,
        "n_p_eval": perf.n_p_eval,
    }


def compare(path: Path, prompt_len: int, gen_len: int, rounds: int, warmups: int, threads: int) -> dict:
    from quantkit.bench.engines.llamacpp_engine import import_llama_cpp

    llama_cpp = import_llama_cpp()
    import torch

    from quantkit.bench.engines.engine import EngineSettings
    from quantkit.bench.engines.llamacpp_engine import Engine

    n_ctx = prompt_len + gen_len
    engine = Engine.load(path, EngineSettings(device=torch.device("cpu"), max_tokens=n_ctx, threads=threads))
    bare = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    ids = [int(i) for i in torch.randint(0, engine.n_vocab, (prompt_len,), generator=torch.Generator().manual_seed(0))]
    try:
        for _ in range(warmups):
            quantkit_repeat(engine, ids, gen_len)
            bare_repeat(bare, ids, gen_len)
        q, b, internal, q_internal = [], [], [], []
        for r in range(rounds):
            order = ("q", "b") if r % 2 == 0 else ("b", "q")
            for side in order:
                if side == "q":
                    ttft, steps, perf = quantkit_repeat(engine, ids, gen_len)
                    q.append((ttft, float(np.mean(steps))))
                    q_internal.append(perf)
                else:
                    ttft, steps, perf = bare_repeat(bare, ids, gen_len)
                    b.append((ttft, float(np.mean(steps))))
                    internal.append(perf)
    finally:
        engine.close()
        bare.close()
    q_a, b_a = np.asarray(q) * 1e3, np.asarray(b) * 1e3
    ratio = q_a / b_a
    own = q_a[:, 1] / np.asarray(
        [p["tpot_ms"] for p in q_internal]
    )  # the same steps, timed by quantkit and by llama.cpp
    return {
        "gguf": path.name,
        "threads": threads,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "rounds": rounds,
        "quantkit_tpot_ms": float(np.median(q_a[:, 1])),
        "own_tpot_ms": float(np.median([p["tpot_ms"] for p in q_internal])),
        "ratio_own": float(np.median(own)),
        "ratio_own_range": f"{own.min():.3f}–{own.max():.3f}",
        "ratio_bare": float(np.median(ratio[:, 1])),
        "per_round_ratio_own": own.round(4).tolist(),
        "quantkit": {"ttft_ms": float(np.median(q_a[:, 0]))},  # its TPOT: quantkit_tpot_ms
        "bare": {"ttft_ms": float(np.median(b_a[:, 0])), "tpot_ms": float(np.median(b_a[:, 1]))},
        "llama_cpp_internal": {
            "ttft_ms": float(np.median([p["ttft_ms"] for p in internal])),
            "tpot_ms": float(np.median([p["tpot_ms"] for p in internal])),
        },
        "ratio_quantkit_over_bare": {
            "ttft": float(np.median(ratio[:, 0])),  # TPOT's median: ratio_bare
            "tpot_p10_p90": [float(np.percentile(ratio[:, 1], 10)), float(np.percentile(ratio[:, 1], 90))],
        },
        "per_round_ms": {"quantkit": q_a.round(3).tolist(), "bare": b_a.round(3).tolist()},
    }


def main() -> None:
    from quantkit.gguf.tools import available_cores

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ggufs", nargs="+", type=Path)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument(
        "--threads", type=int, default=None, help="default: every core this process may use (as quantkit bench)"
    )
    ap.add_argument("--name", default="llamacpp-overhead", help="the result file: benchmarks/results/NAME.json")
    a = ap.parse_args()
    threads = a.threads or available_cores()
    load = os.getloadavg()[0]
    results = [compare(p, a.prompt_len, a.gen_len, a.rounds, a.warmups, threads) for p in a.ggufs]
    for r in results:
        print(
            f"{r['gguf']}: quantkit TPOT {r['quantkit_tpot_ms']:.2f} ms, llama.cpp's own {r['own_tpot_ms']:.2f} ms "
            f"(ratio {r['ratio_own']:.3f}, {r['ratio_own_range']}); over the bare loop {r['ratio_bare']:.3f}",
            file=sys.stderr,
        )
    columns = [
        ("gguf", "GGUF", "{}"),
        ("threads", "threads", "{}"),
        ("quantkit_tpot_ms", "quantkit TPOT ms", "{:.2f}"),
        ("own_tpot_ms", "llama.cpp's own ms per decode", "{:.2f}"),
        ("ratio_own", "median ratio", "{:.3f}"),
        ("ratio_own_range", "ratio, every round", "{}"),
        ("ratio_bare", "quantkit / bare loop", "{:.3f}"),
    ]
    note = (
        f"batch 1, prompt {a.prompt_len}, {a.gen_len} generated tokens, {a.rounds} "
        "rounds of one repeat each beside a bare "
        f"llama-cpp-python loop (ABBA order), after {a.warmups} warm-ups; "
        "llama.cpp's own: llama_perf_context's t_eval per "
        "one-token decode of quantkit's own steps (decode to synchronisation, as llama-bench's tg times a token); load "
        f"average {load:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(
        write_result(
            a.name,
            {
                "results": results,
                "tables": {
                    "main": {
                        "columns": [{"key": k, "header": h, "fmt": f} for k, h, f in columns],
                        "rows": results,
                        "note": note,
                    }
                },
            },
        )
    )


if __name__ == "__main__":
    main()
