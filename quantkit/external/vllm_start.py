"""Starting a vLLM worker (vllm_worker.py, in vLLM's environment) with a model loaded on a device:
what the bench engine (bench/engines/vllm_engine.py) and the eval scorer (evals/scorers/vllm_scorer.py) share.

On the CPU: eager mode (no torch.compile), a KV cache sized to the run (`kv_cache_memory_bytes`;
vLLM's default would take 4 GiB or a share of RAM), and OpenMP threads, by default every usable
core but one, as vLLM's server keeps one core for its scheduler process. The worker runs the
engine core in its own process, so nothing binds threads for it: with 2 threads on a 2-core box
shared with other work, OpenMP's spin-waits made a decode step 7x slower than with 1 (measured on
the demo: ~750 vs ~100 ms at load average 8). On a GPU: CUDA graphs and 85% of its memory, as a
server would; a GPU other than the first becomes the worker's only one (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from quantkit.core.roofline import kv_bytes
from quantkit.errors import QuantkitError
from quantkit.external import vllm_env, vllm_worker
from quantkit.external.worker import Worker

KV_MIN_BYTES = 64 << 20  # the CPU KV cache's floor: vLLM needs whole blocks for max_model_len


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    return max(1, usable_cores() - 1)


def text_config(path: Path) -> dict:
    cfg = json.loads((Path(path) / "config.json").read_text())
    return cfg.get("text_config", cfg)


def kv_bytes_per_token(cfg: dict, elem: float = 2) -> float:
    """Bytes one token takes in vLLM's KV cache: `elem` bytes a value (16-bit; 1 for a checkpoint's
    FP8 cache) (core.roofline.kv_bytes)."""
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return kv_bytes(cfg["num_hidden_layers"], cfg.get("num_key_value_heads") or heads, head_dim, elem)


def device_setup(
    device, cfg: dict, max_tokens: int, threads: int | None, tensor_parallel: int = 1
) -> tuple[dict, dict]:
    """(engine arguments that depend on the device, additions to the worker's environment)."""
    if device.type == "cpu":
        kv = max(KV_MIN_BYTES, int(2 * kv_bytes_per_token(cfg) * max_tokens))
        return {"enforce_eager": True, "kv_cache_memory_bytes": kv}, {
            "OMP_NUM_THREADS": str(threads or default_threads())
        }
    if device.type != "cuda":
        raise QuantkitError(f"vLLM runs on the CPU or a CUDA GPU, not --device {device}")
    if device.index not in (None, 0) and tensor_parallel > 1:
        raise QuantkitError(
            f"--device {device} --tensor-parallel {tensor_parallel}: vLLM takes its GPUs from "
            "CUDA_VISIBLE_DEVICES; set it and use --device cuda"
        )
    env = {}
    if device.index not in (None, 0):
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[device.index] if device.index < len(visible) else str(device.index)
    return {"gpu_memory_utilization": 0.85}, env


def spawn(python: Path, env: dict):
    """A worker in vLLM's environment (`python`), nothing loaded yet, with quantkit's settings for it
    (vllm_env.worker_env) plus `env`."""

    return Worker.start(python, Path(vllm_worker.__file__), env={**vllm_env.worker_env(), **env}, what="vllm")


def start(source: Path, engine_args: dict, env: dict, what: str = "--engine vllm"):
    """A worker in vLLM's environment with `source` loaded (token ids in, no tokenizer); returns
    (worker, its load answer). A model vLLM cannot load is one line: vLLM's own error."""

    worker = spawn(vllm_env.require(what), env)
    try:
        # absolute: the worker runs in a directory of its own, where a relative path names nothing
        info = worker.call(
            "load",
            engine_args={"model": str(Path(source).resolve()), "skip_tokenizer_init": True, **engine_args},
            optional=["async_scheduling"],
            threads=int(env["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in env else None,
        )
    except BaseException:
        worker.close()
        raise
    return worker, info
