"""The vLLM engine: what a vLLM server does at batch 1, on the CPU or a GPU, in vLLM's own process.

vLLM lives in its own environment (`quantkit engines install vllm`; quantkit.external): its pins
clash with quantkit's. So the model loads in a worker process there (external/vllm_worker.py),
and the timing happens there too: `RequestOutput.metrics` holds only arrival, first-token and
last-token timestamps, so the worker drives the engine loop itself (the prompt added as a request,
then `LLMEngine.step()`, one scheduler iteration, which at batch 1 yields one token) and reads the
clock around each step; the harness gets TTFT (add_request until the first token) and every decode
step as the worker measured them (`times_itself`), so no pipe is timed. The engine core runs in
the worker's process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with async scheduling off where vLLM has
it, so a step returns its own token; if a step still delivers more than one token, `step_note`
says so and the report gives no per-step statistics (TPOT stays decode time / tokens).

Decode at depth (--depth): vLLM cannot hand a request's cache back to an earlier length, so the
engine loads with prefix caching on (EngineSettings.reuse_prefix) and each repeat is a request with
the same prompt of `depth` tokens: the first prefills it (its TTFT), the later ones find its blocks
in vLLM's prefix cache and compute only the last, partly filled block before their decode steps.
A request needs a prompt, so the fewest cached tokens is one (min_depth).

Settings: prefix caching off (every repeat really prefills) but at --depth, greedy, EOS ignored, bfloat16
activations (vLLM's CPU kernels for INT4 run only in 16-bit; fp16 has no oneDNN path on CPUs
without AVX512-FP16); per device (eager and `threads` on the CPU, graphs on a GPU) as
external/vllm_start.py says.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit import device as devices
from quantkit.bench import accounting
from quantkit.bench.engines.engine import Engine as Base
from quantkit.bench.engines.engine import EngineSettings
from quantkit.errors import QuantkitError
from quantkit.external import vllm_env, vllm_start
from quantkit.models import kv_scheme
from quantkit.models.sizes import stored_read_bytes

TOP_K = 20  # vLLM's default max_logprobs: the self-check compares these plus one tail bucket


class Engine(Base):
    name = "vllm"
    compiles = True  # first calls allocate and pick kernels (CUDA-graph capture on a GPU): at least one warm-up
    full_logprobs = False  # top-TOP_K log-probabilities per position
    devices = ("cpu", "cuda")
    tensor_parallel = True
    sizes_own_memory = True  # its KV pool (gpu_memory_utilization / kv_cache_memory_bytes), not the weights, must fit
    times_itself = True
    applies_kv_scheme = True  # kv_cache_dtype "auto": FP8 with the checkpoint's scales where it declares them
    min_depth = 1
    min_depth_reason = "a vLLM request holds at least one prompt token"
    attribution_missing = (
        "vLLM runs its kernels in its own process, which quantkit does not time apart: its rows split TPOT "
        "into the bytes' share and the rest"
    )

    @classmethod
    def check(cls, device) -> None:
        vllm_env.require()

    @classmethod
    def default_threads(cls) -> int:
        return vllm_start.default_threads()  # vLLM's server keeps one core for its scheduler process

    def __init__(self, worker, info: dict, path: Path, settings: EngineSettings, threads: int | None):
        self.worker, self.info, self.path, self.settings, self.threads = worker, info, path, settings, threads
        self.cfg = vllm_start.text_config(path)
        self.kv = kv_scheme.of_checkpoint(path)
        self.capacity = 0

    @classmethod
    def load(cls, source, settings: EngineSettings):
        dev = settings.device
        if dev.type not in cls.devices:
            raise QuantkitError(f"--engine vllm runs on the CPU or a CUDA GPU, not --device {dev}")
        if not isinstance(source, Path) or not (source / "config.json").is_file():
            label = getattr(source, "label", source)
            raise QuantkitError(
                f"{label}: --engine vllm benches checkpoint directories (not synthetic shapes or GGUF files)"
            )
        cfg = vllm_start.text_config(source)
        device_args, env = vllm_start.device_setup(
            dev, cfg, settings.max_tokens, settings.threads, settings.tensor_parallel
        )
        args = dict(
            dtype="bfloat16",
            max_model_len=settings.max_tokens,
            enable_prefix_caching=settings.reuse_prefix,  # on only at --depth: the repeats share a prefill
            seed=settings.seed,
            tensor_parallel_size=settings.tensor_parallel,
            max_logprobs=TOP_K,
            async_scheduling=False,
            **device_args,
        )
        worker, info = vllm_start.start(source, args, env)
        return cls(worker, info, source, settings, info.get("threads") if dev.type == "cpu" else None)

    # ---------------------------------------------------------------- the timed paths

    def prepare(self, ids: list[int]):
        return [int(i) for i in ids]

    def reset(self, capacity: int) -> None:
        self.capacity = capacity

    def timed_run(self, prompt, capacity: int, gen_len: int) -> tuple[float, list[float]]:
        """One repeat, timed in the worker: TTFT and gen_len - 1 per-token step times. A step that
        delivered several tokens counts as that many equal steps (and sets step_note)."""
        if capacity < len(prompt) + gen_len:
            raise QuantkitError(
                f"vllm: a {len(prompt)}-token prompt and {gen_len} tokens exceed a {capacity}-token sequence"
            )
        r = self.worker.call("timed", prompt=prompt, gen_len=gen_len)
        steps = [0.0] * (r["first_tokens"] - 1)  # tokens that came with the first one took no step of their own
        for t, n in zip(r["steps_s"], r["tokens_per_step"]):
            steps += [t / n] * n
        if r["first_tokens"] > 1 or any(n > 1 for n in r["tokens_per_step"]):
            self._pipelined(max([r["first_tokens"], *r["tokens_per_step"]]))
        return r["ttft_s"], steps[: gen_len - 1]

    def prefill(self, prompt):
        n = self.capacity - len(prompt)
        if n < 1:
            raise QuantkitError(
                f"vllm: a {len(prompt)}-token prompt leaves no room in a {self.capacity}-token sequence"
            )
        return self._token(self.worker.call("begin", prompt=prompt, gen_len=n))

    def decode(self, token, pos: int):
        return self._token(self.worker.call("step"))  # vLLM feeds back its own greedy token, which is `token`

    def _token(self, answer: dict) -> int:
        if answer["left"]:
            self._pipelined(answer["left"] + 1)
        return answer["token"]

    def _pipelined(self, n: int) -> None:
        self.step_note = (
            f"vLLM delivered {n} tokens from one engine step (pipelined scheduling): "
            "per-step times are not per-token times"
        )

    def logprobs(self, ids: list[int], prompt_len: int, capacity: int):
        """vLLM's prompt_logprobs (its prefill path) at the positions, and its first sampled token's;
        top-TOP_K each, the rest NaN."""

        rows = self.worker.call("logprobs", ids=self.prepare(ids), prompt_len=prompt_len, k=TOP_K)["rows"]
        out = torch.full((len(rows), self.cfg["vocab_size"]), float("nan"))
        for i, row in enumerate(rows):
            for tok, lp in row:
                out[i, tok] = lp
        return out

    # ---------------------------------------------------------------- accounting and description

    def weight_bytes(self) -> dict:
        return {
            "weight_bytes_per_token": stored_read_bytes(self.path),
            "stored_weight_bytes": None,
            "tied_lm_head": None,
        }

    def kv_bytes_per_token(self) -> float:
        return vllm_start.kv_bytes_per_token(self.cfg, self.kv.value_bytes if self.kv else 2)

    def kv_cache_type(self) -> str:
        """vLLM's kv_cache_dtype "auto" takes FP8 for a checkpoint with an FP8 kv_cache_scheme
        (model_executor/layers/attention/attention.py), else the activations' bfloat16."""
        return "fp8_e4m3" if self.kv else "bfloat16"

    def step_bytes(self, cached: int, capacity: int) -> float:
        # paged attention reads the live context only (accounting.kv_live)
        return self.weight_bytes()["weight_bytes_per_token"] + accounting.kv_live(self.kv_bytes_per_token(), cached)

    def describe(self) -> dict:
        dev = self.settings.device
        where = "CPU kernels, eager" if dev.type == "cpu" else "CUDA kernels and graphs"
        out = {
            "engine": self.name,
            "kind": "vllm",
            "kernel": f"vLLM {self.info.get('vllm_version', '?')} ({where}), in its own process",
            "notes": [],
            "tensor_parallel": self.settings.tensor_parallel,
            **devices.describe(dev, "bfloat16"),
        }
        if self.threads is not None:
            out["threads"] = self.threads
        return out

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self.worker = None
