"""The vLLM scorer: an artifact's PPL, KL and top-1 as vLLM computes them, against the cached
baseline pass, on the CPU or a GPU.

vLLM lives in its own environment (`quantkit engines install vllm`; quantkit.external), so the model
loads in a worker process there (external/vllm_worker.py). The worker scores each window of token
ids offline, with the full vocabulary's prompt log-probabilities (`LLM(max_logprobs=-1,
skip_tokenizer_init=True)`, `SamplingParams(prompt_logprobs=-1, flat_logprobs=True)`: vLLM's
log_softmax of its logits in float32), and reduces them there to the statistics every scorer gives
(evals/accuracy_stats.py window_stats: each true token's NLL, KL(base || model), argmax agreement). For the
exact KL the baseline's whole rows of the call's windows go in (recomputed here from its cached
pass, evals/perplexity.py), written to a request .npz in the worker's temporary directory that
holds only the call's windows (its budget, below, bounds them) and is replaced by the next call's;
for the bound (--kl topk), its top-k ids and log-probabilities. Per window only (seq_len - 1) x 3
numbers come back.

Cost, measured on the demo (SmolLM2-135M, 49152-token vocabulary, 2-core CPU): the whole vocabulary
per position is ~7x a plain prefill (28.6 vs 4.1 ms per token) and ~150 bytes per vocabulary entry
in the worker while vLLM hands it over as Python lists, so a generate call takes as many windows as
fit WORKER_BYTES (one 512-token window of that model is ~3.7 GB).

Precision: a quantized checkpoint runs with bfloat16 activations (vLLM's CPU INT4 kernel has no
float32 path: `"cpu_gemm_wna16" not implemented for 'Float'`), a 16-bit one in the evaluation's
dtype (float32 on the CPU, as the baseline).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from quantkit.errors import ModelError
from quantkit.evals.scorers.scorer import Scorer, ScorerSettings
from quantkit.external import vllm_env, vllm_start

WORKER_BYTES = 4 << 30  # what the worker's Python lists of one generate call may take
BYTES_PER_ENTRY = 150  # measured: 7.2 GB peak for 1024 positions x 49153 entries


def windows_per_call(vocab: int, seq_len: int, budget: int | None = None) -> int:
    """Windows one generate call scores: as many as fit `budget` (WORKER_BYTES), at least one."""
    return max(1, (budget or WORKER_BYTES) // (BYTES_PER_ENTRY * (vocab + 1) * max(1, seq_len - 1)))


def run_dtype(source: Path, dtype: str) -> str:
    """bfloat16 for a quantized checkpoint, else the evaluation's dtype."""
    cfg = json.loads((source / "config.json").read_text())
    return (
        "bfloat16" if cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config") else dtype
    )


class VllmScorer(Scorer):
    name = "vllm"
    takes_checkpoint = True
    exact_kl = True  # the worker holds the whole vocabulary's rows (prompt_logprobs=-1)
    devices = ("cpu", "cuda")

    def __init__(self, worker, info: dict, dtype: str, settings: ScorerSettings):
        self.worker, self.info, self.dtype, self.settings = worker, info, dtype, settings
        self.per_call = min(windows_per_call(info["vocab_size"], settings.seq_len), max(1, settings.n_windows))

    @classmethod
    def check(cls, source: Path, device) -> None:
        vllm_env.require()
        if not (source / "config.json").is_file():
            raise ModelError(f"{source}: --engine vllm scores checkpoint directories (a config.json), not GGUF files")

    @classmethod
    def open(cls, source: Path, settings: ScorerSettings) -> "VllmScorer":
        dtype = run_dtype(source, settings.dtype)
        # a window is the prompt, and vLLM generates at least one token after it: seq_len + 1
        device_args, env = vllm_start.device_setup(
            settings.device, vllm_start.text_config(source), settings.seq_len + 1, None
        )
        args = dict(
            dtype=dtype,
            max_model_len=settings.seq_len + 1,
            enable_prefix_caching=False,
            seed=0,
            max_logprobs=-1,
            trust_remote_code=settings.trust_remote_code,
            **device_args,
        )
        worker, info = vllm_start.start(source, args, env)
        return cls(worker, info, dtype, settings)

    def compare(self, windows: list, references):
        """Per window: {"nll", "kl", "agree"} numpy arrays, computed in the worker (module doc)."""

        refs = iter(references)
        request, out = self.worker.tmp / "request.npz", self.worker.tmp / "scores.npz"
        for lo in range(0, len(windows), self.per_call):
            chunk = windows[lo : lo + self.per_call]
            ref = [next(refs) for _ in chunk]
            exact = {}
            if all("base_rows" in r for r in ref):  # the baseline's whole rows: the exact KL
                rows = [r["base_rows"](0, len(w) - 1) for w, r in zip(chunk, ref)]
                exact["base_logp"] = np.stack([x.float().cpu().numpy() for x in rows])
            np.savez(
                request,
                windows=np.stack([w.numpy() for w in chunk]).astype(np.int64),
                topk_logp=np.stack([r["topk_logp"].float().numpy() for r in ref]),
                topk_idx=np.stack([r["topk_idx"].numpy() for r in ref]).astype(np.int32),
                argmax=np.stack([r["argmax"].numpy() for r in ref]).astype(np.int64),
                **exact,
            )
            exact.clear()
            self.worker.call("score", request=str(request), out=str(out), windows_per_call=self.per_call)
            with np.load(out) as got:
                nll, kl, agree = got["nll"], got["kl"], got["agree"]
            for i in range(len(chunk)):
                yield {"nll": nll[i], "kl": kl[i], "agree": agree[i]}

    def describe(self) -> dict:
        return {
            "engine": self.name,
            "kernel": f"vLLM {self.info.get('vllm_version', '?')}, in its own process",
            "dtype": self.dtype,
            "device": str(self.settings.device),
            "threads": self.info.get("threads"),
            "logprobs": "whole vocabulary per position (prompt_logprobs=-1)",
            "windows_per_call": self.per_call,
        }

    def close(self) -> None:
        self.worker.close()
