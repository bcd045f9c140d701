"""The vLLM engine (GPU, when vLLM is installed): what a vLLM server does at batch 1.

vLLM runs its own scheduler, kernels (Marlin / Machete for compressed-tensors artifacts, loaded
unchanged) and CUDA graphs. Its `RequestOutput.metrics` (v1: `RequestStateStats`) holds only
arrival, queued, scheduled, first-token and last-token timestamps: no per-token times. So this
engine drives the engine loop itself: the prompt is added as a request, and each `step()` of
`LLM.llm_engine` runs one scheduler iteration, which at batch 1 yields one token. The harness then
times prefill (add_request until the first token: TTFT measured, not derived) and every decode
step like the other engines. The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
and async scheduling is off where vLLM has the option, so a step() returns its own token; if a
step still delivers more than one token (a vLLM that pipelines steps), `step_note` says so and
the report gives no per-step statistics (TPOT stays decode time / tokens).
Prefix caching is off, so every repeat really prefills; greedy sampling, EOS ignored.
"""

from __future__ import annotations

import gc
import itertools
import os
from pathlib import Path

from quantkit import device as devices
from quantkit.errors import QuantkitError
from quantkit.core.roofline import kv_bytes
from quantkit.bench import accounting
from quantkit.bench.engines.base import Engine as Base
from quantkit.bench.engines.base import EngineSettings

TOP_K = 20  # vLLM's default max_logprobs: the self-check compares these plus one tail bucket


def _engine_fields() -> set[str]:
    import dataclasses

    try:
        from vllm.engine.arg_utils import EngineArgs

        return {f.name for f in dataclasses.fields(EngineArgs)}
    except (ImportError, TypeError):
        return set()


class Engine(Base):
    name = "vllm"
    compiles = True  # CUDA-graph capture and warm caches: at least one warm-up
    full_logprobs = False  # top-TOP_K log-probabilities per position
    devices = ("cuda",)
    tensor_parallel = True
    sizes_own_memory = True  # gpu_memory_utilization: its pool, not the weights, is what must fit

    @classmethod
    def check(cls, device) -> None:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise QuantkitError("--engine vllm: vLLM is not installed (pip install vllm, on a CUDA machine)")

    def __init__(self, llm, path: Path, settings: EngineSettings):
        self.llm, self.path, self.settings = llm, path, settings
        self.engine = llm.llm_engine
        self.cfg = _text_config(path)
        self.capacity = 0
        self._rid: str | None = None
        self._pending: list[int] = []
        self._ids = itertools.count()

    @classmethod
    def load(cls, source, settings: EngineSettings):
        dev = settings.device
        if dev.type != "cuda":
            raise QuantkitError("--engine vllm needs a CUDA GPU (--device cuda)")
        if dev.index not in (None, 0):
            raise QuantkitError(f"--engine vllm --device {dev}: vLLM takes its GPUs from CUDA_VISIBLE_DEVICES; "
                                "set CUDA_VISIBLE_DEVICES and use --device cuda")
        if not isinstance(source, Path) or not (source / "config.json").is_file():
            label = getattr(source, "label", source)
            raise QuantkitError(f"{label}: --engine vllm benches checkpoint directories (not synthetic shapes or GGUF files)")
        try:
            import vllm
        except ImportError:
            raise QuantkitError("--engine vllm: vLLM is not installed (pip install vllm, on a CUDA machine)") from None
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: step() is one step
        kwargs = dict(model=str(source), dtype="bfloat16", max_model_len=settings.max_tokens, enable_prefix_caching=False,
                      gpu_memory_utilization=0.85, seed=settings.seed, tensor_parallel_size=settings.tensor_parallel,
                      max_logprobs=TOP_K)
        if "async_scheduling" in _engine_fields():
            kwargs["async_scheduling"] = False
        return cls(vllm.LLM(**kwargs), source, settings)

    def prepare(self, ids: list[int]):
        return [int(i) for i in ids]

    def _abort(self) -> None:
        if self._rid is not None:
            self.engine.abort_request([self._rid])
            while self.engine.has_unfinished_requests():  # drain what the abort left scheduled
                self.engine.step()
        self._rid, self._pending = None, []

    def reset(self, capacity: int) -> None:
        self._abort()
        self.capacity = capacity

    def prefill(self, prompt):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        n = self.capacity - len(prompt)
        if n < 1:
            raise QuantkitError(f"vllm: a {len(prompt)}-token prompt leaves no room in a {self.capacity}-token sequence")
        params = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        self._rid = f"quantkit-bench-{next(self._ids)}"
        self.engine.add_request(self._rid, {"prompt_token_ids": prompt}, params)
        return self._next()

    def decode(self, token, pos: int):
        return self._next()  # vLLM feeds back its own greedy token, which is `token`

    def _next(self) -> int:
        if self._pending:
            return self._pending.pop(0)
        while True:
            outs = self.engine.step()
            new = [t for o in outs if o.request_id == self._rid for c in o.outputs for t in c.token_ids]
            if new:
                break
            if not self.engine.has_unfinished_requests():
                raise QuantkitError("vllm: the request finished before the tokens the measurement asked for")
        if len(new) > 1:
            self.step_note = (f"vLLM delivered {len(new)} tokens from one engine step (pipelined scheduling): "
                              "per-step times are not per-token times")
        self._pending = new[1:]
        return new[0]

    def logprobs(self, ids: list[int], prompt_len: int, capacity: int):
        """vLLM's prompt_logprobs (its prefill path) at the positions, and its first sampled token's;
        top-TOP_K each, the rest NaN."""
        import torch
        from vllm import SamplingParams

        self.reset(capacity)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=TOP_K, logprobs=TOP_K)
        out = self.llm.generate([{"prompt_token_ids": self.prepare(ids)}], params, use_tqdm=False)[0]
        dicts = list(out.prompt_logprobs[prompt_len:]) + [out.outputs[0].logprobs[0]]
        rows = torch.full((len(dicts), self.cfg["vocab_size"]), float("nan"))
        for i, d in enumerate(dicts):
            for tok, lp in (d or {}).items():
                rows[i, tok] = float(getattr(lp, "logprob", lp))
        return rows

    def weight_bytes(self) -> dict:
        from quantkit.models.sizes import stored_read_bytes

        return {"weight_bytes_per_token": stored_read_bytes(self.path), "stored_weight_bytes": None, "tied_lm_head": None}

    def kv_bytes_per_token(self) -> float:
        c = self.cfg
        heads = c["num_attention_heads"]
        return kv_bytes(c["num_hidden_layers"], c.get("num_key_value_heads") or heads, c.get("head_dim") or c["hidden_size"] // heads, 2)

    def step_bytes(self, cached: int, capacity: int) -> float:
        # paged attention reads the live context only (accounting.kv_live)
        return self.weight_bytes()["weight_bytes_per_token"] + accounting.kv_live(self.kv_bytes_per_token(), cached)

    def describe(self) -> dict:
        import vllm

        return {"engine": self.name, "kind": "vllm", "kernel": f"vLLM {getattr(vllm, '__version__', '?')} kernels", "notes": [],
                "tensor_parallel": self.settings.tensor_parallel, **devices.describe(self.settings.device, "bfloat16")}

    def close(self) -> None:
        self._abort()
        self.llm = self.engine = None
        try:  # free the GPU for the next model in this process
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        except ImportError:
            pass
        gc.collect()


def _text_config(path: Path) -> dict:
    import json

    cfg = json.loads((path / "config.json").read_text())
    return cfg.get("text_config", cfg)
