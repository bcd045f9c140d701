"""lm-eval's tasks on vLLM: lm-eval's own VLLM model class, run in a worker in vLLM's environment.

lm-eval's VLLM wrapper imports vLLM, so it cannot run in quantkit's process (vLLM has an environment
of its own: vllm_env.py). The worker (vllm_worker.py, request `tasks`) builds lm-eval's VLLM from
the arguments made here and runs lm-eval's simple_evaluate on the task files quantkit hands it;
lm-eval is installed there at quantkit's own version (vllm_env.addons). What comes back is
simple_evaluate's results, with only doc_id and the metrics of each sample.

vLLM's settings are the worker's (vllm_start.device_setup): on the CPU eager mode and a KV cache
for KV_SEQUENCES sequences of the context length, OpenMP threads one short of the usable cores; on
a GPU 85% of its memory. The context is the model's, at most the caller's `max_length` (the one
quantkit gives lm-eval's hf backend too: evals/lmeval.py).
"""

from __future__ import annotations

from pathlib import Path

from quantkit.external import vllm_env, vllm_start
from quantkit.progress import note

# Full-length sequences the CPU KV cache holds: device_setup sizes it at 16-bit elements x 2, which
# in float32 is one sequence, and vLLM refused the demo's 2048 tokens in exactly that (it fit 1920:
# its blocks round down); lm-eval hands vLLM every request at once, so room for a few lets it batch.
KV_SEQUENCES = 4


def model_args(
    path: Path, dtype: str, device, max_length: int, tensor_parallel: int, data_parallel: int, trust_remote_code: bool
) -> tuple[dict, dict]:
    """(lm-eval's VLLM keyword arguments, additions to the worker's environment). Arguments lm-eval
    does not name itself (enforce_eager, the KV cache) go through to vLLM's LLM as its **kwargs."""

    cfg = vllm_start.text_config(path)
    length = min(max_length, int(cfg.get("max_position_embeddings") or max_length))
    device_args, env = vllm_start.device_setup(device, cfg, KV_SEQUENCES * length, None, tensor_parallel)
    # absolute: the worker runs in a directory of its own, where a relative path names nothing
    args = dict(
        pretrained=str(Path(path).resolve()),
        dtype=dtype,
        tensor_parallel_size=tensor_parallel,
        data_parallel_size=data_parallel,
        trust_remote_code=trust_remote_code,
        seed=0,
        max_model_len=length,
        **device_args,
    )
    return args, env


def evaluate(
    args: dict,
    env: dict,
    tasks: tuple[str, ...],
    include_path: str | None,
    include_defaults: bool,
    evaluate_args: dict,
    metrics: tuple[str, ...],
) -> dict:
    """simple_evaluate's {"results", "samples"} (samples trimmed to doc_id and `metrics`), from one
    worker that starts, evaluates and exits. `include_path`: a directory of task files (absolute);
    `include_defaults`: lm-eval's built-in tasks indexed too. vLLM's or lm-eval's refusal is one
    line (WorkerError)."""

    python = vllm_env.require_lm_eval()
    note(f"lm-eval on vLLM: {', '.join(tasks)} ({Path(args['pretrained']).name}, in vLLM's environment)")
    # tqdm enabled there: vLLM's offline progress bar divides by its elapsed time, which a disabled
    # bar keeps at 0 (ZeroDivisionError in LLM.generate, vLLM 0.32.0 entrypoints/common/offline.py);
    # quantkit's own process disables library bars (quiet.py), and the worker's go to its log
    with vllm_start.spawn(python, {**env, "TQDM_DISABLE": ""}) as worker:
        threads = int(env["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in env else None
        answer = worker.call(
            "tasks",
            model_args=args,
            tasks=list(tasks),
            include_path=include_path,
            include_defaults=include_defaults,
            evaluate_args=evaluate_args,
            metrics=list(metrics),
            threads=threads,
        )
    return {"results": answer["results"], "samples": answer["samples"]}
