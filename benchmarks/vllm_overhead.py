#!/usr/bin/env python3
"""Does `quantkit bench --engine vllm` add anything? Its TTFT and TPOT against a bare vLLM loop
(`LLM.generate`, benchmarks/vllm_bare.py) on the same checkpoint, prompt and lengths, in one run.

Both sides load the model in vLLM's environment with the same engine arguments and threads
(quantkit's: bench/engines/vllm_engine.py and external/vllm_start.py; eager, bfloat16, no prefix caching,
the engine core in the loading process) and stay loaded; after warm-ups, --rounds rounds of one
repeat each alternate the order every round (ABBA), so drift of a shared machine falls on both.
quantkit's side is the bench harness itself (harness.measure: the worker steps the engine and
times each step); the bare side is what a user would write: wall clock around
`LLM.generate(max_tokens=1)` (TTFT) and `LLM.generate(max_tokens=N)`, TPOT = the difference over
N - 1 tokens.

Reported per checkpoint: median TTFT and TPOT of each side and the median of the per-round paired
ratios quantkit / bare (the figure that must be within 10% of 1).

  python benchmarks/vllm_overhead.py demo --prompt-len 128 --gen-len 64 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import QUANTKIT, write_result  # noqa: E402


class Bare:
    """benchmarks/vllm_bare.py in vLLM's environment: one repeat per `run`."""

    def __init__(self, python: Path, cfg: dict, env: dict):
        import os

        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-bare-", suffix=".log", delete=False)  # vLLM's logs
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "vllm_bare.py"), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **env},
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = Path(self.log.name).read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"the bare vLLM loop exited (code {self.proc.wait()}; log {self.log.name}): " + " | ".join(tail)
            )
        return json.loads(line)

    def repeat(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def quantkit_repeat(engine, ids: list[int], gen_len: int) -> tuple[float, float]:
    from quantkit.bench.harness import measure

    t = measure(engine, ids, gen_len, repeats=1, min_seconds=0, warmups=0)
    steps = t.step_s[0]
    return t.ttft_s[0], sum(steps) / len(steps)


def compare(path: Path, prompt_len: int, gen_len: int, rounds: int, warmups: int) -> dict:
    import torch

    from quantkit.bench.engines.engine import EngineSettings
    from quantkit.bench.engines.vllm_engine import TOP_K, Engine
    from quantkit.external import vllm_env, vllm_start

    cpu = torch.device("cpu")
    n_ctx = prompt_len + gen_len
    engine = Engine.load(path, EngineSettings(device=cpu, max_tokens=n_ctx))
    ids = [
        int(i)
        for i in torch.randint(0, engine.cfg["vocab_size"], (prompt_len,), generator=torch.Generator().manual_seed(0))
    ]
    # the bare loop gets the engine arguments and environment quantkit's engine ran with
    device_args, env = vllm_start.device_setup(cpu, engine.cfg, n_ctx, None)
    args = dict(
        model=str(path.resolve()),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=n_ctx,
        enable_prefix_caching=False,
        seed=0,
        max_logprobs=TOP_K,
        async_scheduling=False,
        **device_args,
    )
    bare = Bare(
        vllm_env.require(),
        {"engine_args": args, "threads": engine.threads, "prompt": ids, "gen_len": gen_len},
        {**vllm_env.worker_env(), **env},
    )
    q, b = [], []
    try:
        for _ in range(warmups):
            quantkit_repeat(engine, ids, gen_len)
            bare.repeat()
        for r in range(rounds):
            order = ("q", "b") if r % 2 == 0 else ("b", "q")
            for side in order:
                if side == "q":
                    q.append(quantkit_repeat(engine, ids, gen_len))
                else:
                    b.append(bare.repeat())
    finally:
        engine.close()
        bare.close()
    med = statistics.median
    ratio_tpot = med(qq[1] / bb["tpot_s"] for qq, bb in zip(q, b))
    ratio_ttft = med(qq[0] / bb["ttft_s"] for qq, bb in zip(q, b))
    return {
        "model": path.name,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "rounds": rounds,
        "threads": engine.threads,
        "quantkit_ttft_ms": med(x[0] for x in q) * 1e3,
        "bare_ttft_ms": med(x["ttft_s"] for x in b) * 1e3,
        "quantkit_tpot_ms": med(x[1] for x in q) * 1e3,
        "bare_tpot_ms": med(x["tpot_s"] for x in b) * 1e3,
        "tpot_ratio": ratio_tpot,
        "ttft_ratio": ratio_ttft,
        "within_10pct": abs(ratio_tpot - 1) <= 0.10,
        "raw": {"quantkit": q, "bare": b},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="checkpoint directories, or 'demo'")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warmups", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for m in args.models:
        path = (
            Path(
                subprocess.run(
                    QUANTKIT + ["models", "path", m], capture_output=True, text=True, check=True
                ).stdout.strip()
            )
            if not Path(m).exists()
            else Path(m)
        )
        rows.append(compare(path, args.prompt_len, args.gen_len, args.rounds, args.warmups))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "raw"}), file=sys.stderr)
    cols = [
        ("model", "checkpoint", "{}"),
        ("quantkit_tpot_ms", "quantkit TPOT ms", "{:.1f}"),
        ("bare_tpot_ms", "bare loop TPOT ms", "{:.1f}"),
        ("tpot_ratio", "TPOT quantkit / bare", "{:.3f}"),
        ("quantkit_ttft_ms", "quantkit TTFT ms", "{:.0f}"),
        ("bare_ttft_ms", "bare TTFT ms", "{:.0f}"),
        ("ttft_ratio", "TTFT ratio", "{:.3f}"),
    ]
    note = (
        f"{args.prompt_len}-token prompt, {args.gen_len} tokens, {args.rounds} rounds in "
        f"ABBA order after {args.warmups} warm-up(s); "
        "medians; the ratio is the median of per-round paired ratios. Both sides: vLLM's CPU "
        "build, the same engine arguments and threads."
    )
    path = write_result(
        "vllm_overhead",
        {
            "rows": rows,
            "tables": {
                "main": {"columns": [{"key": k, "header": h, "fmt": f} for k, h, f in cols], "rows": rows, "note": note}
            },
        },
    )
    print(path)


if __name__ == "__main__":
    main()
