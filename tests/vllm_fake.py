"""A fake vLLM environment: a `vllm` package with the calls quantkit's worker makes, behind a
`bin/python` that runs this test's Python with the package on its path. The worker script
(quantkit/external/vllm_worker.py) runs in it unchanged, as a separate process.

The fake model: after token t the next token is t + 1 (p 0.9), t + 2 (p 0.05), and the rest share
0.05; `logprob(prev, tok, vocab)` is that distribution. Behaviour switches (environment, read by
the worker's process): FAKE_VLLM_RECORD (a file the engine arguments are written to),
FAKE_VLLM_LOAD=raise|die (a load vLLM refuses / a worker that dies with the cause in its log),
FAKE_VLLM_TOKENS_PER_STEP, FAKE_VLLM_STEP_S (each engine step sleeps this long).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

FAKE_VLLM = r"""
import json, math, os, pathlib, sys, time
from types import SimpleNamespace

__version__ = "0-fake"
KERNEL_ERROR = ("Failed to find a kernel that can implement the WNA16 linear layer. Reasons:\n"
                "  CPUWNA16LinearKernel cannot implement due to: Quant type (uint8b128) not supported")


def logprob_row(prev, vocab):
    row = [math.log(0.05 / (vocab - 2))] * vocab
    row[(prev + 1) % vocab] = math.log(0.9)
    row[(prev + 2) % vocab] = math.log(0.05)
    return row


class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FlatLogprobs:
    def __init__(self):
        self.start_indices, self.end_indices, self.token_ids, self.logprobs = [], [], [], []


def _prompt_logprobs(ids, vocab, k, flat):
    out = FlatLogprobs() if flat else [None]
    if flat:
        out.start_indices.append(0)
        out.end_indices.append(0)
    for i in range(1, len(ids)):
        row = logprob_row(ids[i - 1], vocab)
        order = sorted(range(vocab), key=lambda t: -row[t])
        entries = [(ids[i], row[ids[i]])] + [(t, row[t]) for t in (order if k == -1 else order[:k])]
        if flat:
            out.start_indices.append(len(out.logprobs))
            out.token_ids += [t for t, _ in entries]
            out.logprobs += [lp for _, lp in entries]
            out.end_indices.append(len(out.logprobs))
        else:
            out.append({t: SimpleNamespace(logprob=lp) for t, lp in entries})
    return out


class _Engine:
    def __init__(self, vocab):
        self.vocab, self.reqs = vocab, {}
        self.model_config = SimpleNamespace(get_vocab_size=lambda: vocab)

    def add_request(self, rid, prompt, params):
        self.reqs[rid] = {"ids": list(prompt["prompt_token_ids"]), "left": params.max_tokens, "started": False}

    def step(self):
        time.sleep(float(os.environ.get("FAKE_VLLM_STEP_S", "0")))
        outs = []
        for rid, r in list(self.reqs.items()):
            n = min(int(os.environ.get("FAKE_VLLM_TOKENS_PER_STEP", "1")) if r["started"] else 1, r["left"])
            r["started"] = True
            new = []
            for _ in range(n):
                r["ids"].append((r["ids"][-1] + 1) % self.vocab)
                new.append(r["ids"][-1])
            r["left"] -= n
            outs.append(SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=new)]))
            if r["left"] == 0:
                del self.reqs[rid]
        return outs

    def abort_request(self, rids):
        for r in rids:
            self.reqs.pop(r, None)

    def has_unfinished_requests(self):
        return bool(self.reqs)


class LLM:
    def __init__(self, **kw):
        if os.environ.get("FAKE_VLLM_RECORD"):
            pathlib.Path(os.environ["FAKE_VLLM_RECORD"]).write_text(
                json.dumps({"args": kw, "omp": os.environ.get("OMP_NUM_THREADS")})
            )
        if os.environ.get("FAKE_VLLM_LOAD") == "raise":
            raise ValueError(KERNEL_ERROR)
        if os.environ.get("FAKE_VLLM_LOAD") == "die":
            print(
                "(EngineCore pid=1) ERROR [core.py:1] ValueError: Unknown quantization method: bitsandbytes",
                file=sys.stderr,
            )
            print("RuntimeError: Engine core initialization failed. See root cause above.", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        self.vocab = json.loads((pathlib.Path(kw["model"]) / "config.json").read_text())["vocab_size"]
        self.max_model_len = kw.get("max_model_len")
        self.llm_engine = _Engine(self.vocab)

    def generate(self, prompts, params, use_tqdm=True):
        outs = []
        for p in prompts:
            ids = p["prompt_token_ids"]
            if self.max_model_len and len(ids) + 1 > self.max_model_len:  # vLLM's own check, as its message words it
                raise ValueError(f"The decoder prompt (length {len(ids)}) plus the number of requested output tokens "
                                 f"(at least 1) is longer than the maximum model length of {self.max_model_len}.")
            pl = _prompt_logprobs(ids, self.vocab, params.prompt_logprobs, getattr(params, "flat_logprobs", False))
            row = logprob_row(ids[-1], self.vocab)
            top = sorted(range(self.vocab), key=lambda t: -row[t])[: max(1, getattr(params, "logprobs", 1) or 1)]
            sample = {t: SimpleNamespace(logprob=row[t]) for t in top}
            outs.append(
                SimpleNamespace(prompt_logprobs=pl, prompt_token_ids=ids, outputs=[SimpleNamespace(logprobs=[sample])])
            )
        return outs
"""

SAMPLING = "import enum\nclass RequestOutputKind(enum.Enum):\n    CUMULATIVE = 0\n    DELTA = 1\n    FINAL_ONLY = 2\n"
ARG_UTILS = "import dataclasses\n@dataclasses.dataclass\nclass EngineArgs:\n    model: str = ''\n"


def logprob(prev: int, tok: int, vocab: int) -> float:
    """The fake model's log-probability of `tok` after `prev` (FAKE_VLLM's logprob_row)."""
    if tok == (prev + 1) % vocab:
        return math.log(0.9)
    if tok == (prev + 2) % vocab:
        return math.log(0.05)
    return math.log(0.05 / (vocab - 2))


def make_env(root: Path) -> Path:
    """A fake vLLM environment under `root`: root/venv (bin/python) with the fake package."""
    pkg = root / "site" / "vllm"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    (pkg / "sampling_params.py").write_text(SAMPLING)
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "arg_utils.py").write_text(ARG_UTILS)
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{root / "site"}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return venv


def use(monkeypatch, root: Path, **switches: str) -> Path:
    """Point quantkit at a fresh fake environment (QUANTKIT_VLLM_VENV) with these FAKE_VLLM_* switches."""
    venv = make_env(root)
    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(venv))
    for name in ("FAKE_VLLM_RECORD", "FAKE_VLLM_LOAD", "FAKE_VLLM_TOKENS_PER_STEP", "FAKE_VLLM_STEP_S"):
        monkeypatch.delenv(name, raising=False)
    for key, value in switches.items():
        monkeypatch.setenv(f"FAKE_VLLM_{key.upper()}", value)
    return venv


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("FAKE_VLLM")}
