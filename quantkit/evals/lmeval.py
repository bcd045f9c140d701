"""lm-eval tasks on the loaded model (its HFLM wrapper), with deltas against the baseline.

Backends (`--tasks-backend`, recipe `eval.tasks_backend`), all lm-eval's own:
- `hf`, one process: the model quantkit loaded (on `--device`, in its dtype) is handed to lm-eval's
  HFLM in process, so an artifact is evaluated exactly as it loads.
- `hf` under `accelerate launch` (WORLD_SIZE > 1): HFLM loads the checkpoint by path and lm-eval's
  Accelerator runs data parallel, one model copy per process (lm-eval refuses a pre-loaded model
  there: "Please do not launch via accelerate ... if passing an existing model"); rank 0 gets the
  results, writes the cache and reports.
- `vllm`: lm-eval's VLLM wrapper with `tensor_parallel_size` / `data_parallel_size`; vLLM loads
  compressed-tensors artifacts natively. Checked importable before anything loads.

Local tasks live in `evals/` (lm-eval YAMLs reading JSONL); their relative data paths
are rewritten to absolute ones in a temp include dir, so any working directory works. The
baseline's per-item scores are cached; deltas use paired per-item differences.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from quantkit.errors import DataError
from quantkit.home import subdir

METRICS = ("acc", "acc_norm", "exact_match")


@dataclass(frozen=True)
class TaskRun:
    tasks: tuple[str, ...]
    limit: int | None
    dtype: str
    device: Any  # torch.device
    backend: str = "hf"
    tensor_parallel: int = 1
    data_parallel: int = 1
    trust_remote_code: bool = False


def world_size() -> int:
    """Processes launched together (torchrun / accelerate launch set WORLD_SIZE)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") in ("0", "")


def check_backend(backend: str, tensor_parallel: int, data_parallel: int) -> None:
    """Before any model loads: a known backend, its parallel settings, and its library importable."""
    import importlib.util

    if backend not in BACKENDS:
        raise DataError(f"--tasks-backend {backend}: use one of {', '.join(BACKENDS)}")
    b = BACKENDS[backend]
    if tensor_parallel < 1 or data_parallel < 1:
        raise DataError("--tensor-parallel and --data-parallel take a count of at least 1")
    if b.no_parallel_sizes and (tensor_parallel, data_parallel) != (1, 1):
        raise DataError(b.no_parallel_sizes)
    if b.library and importlib.util.find_spec(b.library) is None:
        raise DataError(f"--tasks-backend {backend}: {b.missing}")


def local_tasks_dir() -> Path | None:
    from quantkit.resources import eval_tasks_dir

    tasks = eval_tasks_dir()
    return tasks if tasks.is_dir() else None


def _rewrite_include(src: Path, dest: Path) -> None:
    """Copy task YAMLs, making relative data_files absolute (relative to the repo root, else the YAML)."""
    import yaml

    for f in src.glob("*.yaml"):
        text = f.read_text()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            shutil.copy(f, dest / f.name)
            continue
        files = ((data or {}).get("dataset_kwargs") or {}).get("data_files")
        if isinstance(files, dict):
            for split, rel in files.items():
                cand = [src.parent / rel, src / rel, f.parent / rel]
                hit = next((c for c in cand if c.is_file()), None)
                if hit is not None and not Path(rel).is_absolute():
                    text = text.replace(str(rel), str(hit.resolve()))
        (dest / f.name).write_text(text)


def _files_hash(src: Path | None) -> str:
    if src is None:
        return "none"
    h = hashlib.sha256()
    for f in sorted(src.rglob("*")):
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _hf_lm(run: TaskRun, path: Path, model, tok):
    from lm_eval.models.huggingface import HFLM

    batch = 8 if run.device.type == "cpu" else "auto"  # lm-eval's own batch-size probe on a GPU
    if world_size() > 1:
        return HFLM(pretrained=str(path), dtype=run.dtype, batch_size=batch, trust_remote_code=run.trust_remote_code)
    model = model()
    return HFLM(pretrained=model, tokenizer=tok, batch_size=batch,
                max_length=min(2048, getattr(model.config, "max_position_embeddings", 2048)))


def _vllm_lm(run: TaskRun, path: Path, model, tok):
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM(pretrained=str(path), dtype=run.dtype, tensor_parallel_size=run.tensor_parallel,
                data_parallel_size=run.data_parallel, trust_remote_code=run.trust_remote_code, seed=0)


@dataclass(frozen=True)
class Backend:
    """An lm-eval backend: how its model object is built, and what check_backend asks of it."""

    lm: Callable  # (run, path, model loader, tokenizer) -> lm-eval's model object
    library: str | None = None  # a module that must be importable (checked before anything loads)
    missing: str = ""  # what to do when it is not
    no_parallel_sizes: str = ""  # the refusal of --tensor-parallel/--data-parallel, for a backend without them


BACKENDS: dict[str, Backend] = {
    "hf": Backend(_hf_lm, no_parallel_sizes="--tensor-parallel/--data-parallel are vLLM's (--tasks-backend vllm); the hf "
                  "backend runs data parallel when launched with `accelerate launch --num_processes N -m quantkit eval ...`"),
    "vllm": Backend(_vllm_lm, library="vllm", missing="vLLM is not installed (pip install vllm, on a machine with a CUDA GPU); "
                    "or use --tasks-backend hf"),
}


def _lm(run: TaskRun, path: Path, model, tok):
    """The lm-eval model object of `run.backend` (module docstring)."""
    return BACKENDS[run.backend].lm(run, path, model, tok)


def _evaluate(run: TaskRun, path: Path, model, tok) -> dict | None:
    """{task: {"metric", "value", "stderr", "n", "items": [per-item scores]}} for every leaf task;
    None on a data-parallel rank other than 0 (lm-eval gathers the results on rank 0).
    `model`: a function returning the loaded transformers model (only the in-process hf backend calls it)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tasks, limit = run.tasks, run.limit

    src = local_tasks_dir()
    with tempfile.TemporaryDirectory(prefix="quantkit-tasks-") as tmp:
        if src is not None:
            _rewrite_include(src, Path(tmp))
        manager = TaskManager(include_path=tmp, include_defaults=False, verbosity="ERROR") if src is not None else None
        if manager is None or any(t not in manager.all_tasks for t in tasks):
            # indexing lm-eval's thousands of built-in task files is slow; only do it when needed
            manager = TaskManager(include_path=tmp if src is not None else None, verbosity="ERROR")
        unknown = [t for t in tasks if t not in manager.all_tasks]
        if unknown:
            raise DataError(f"unknown lm-eval task {unknown[0]!r} (local tasks: {', '.join(sorted(n for n in manager.all_tasks if n.startswith(('qk_', 'quantkit'))))}; "
                            "standard tasks need their datasets from the Hub)")
        lm = _lm(run, path, model, tok)
        try:
            res = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit, log_samples=True,
                                  bootstrap_iters=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
        except ValueError as exc:  # e.g. a group together with one of its own tasks
            raise DataError(f"lm-eval rejected the task list: {str(exc).splitlines()[0][:160]}") from None
        except (ConnectionError, OSError) as exc:
            raise DataError(f"lm-eval could not load a task's data ({type(exc).__name__}: {str(exc)[:120]}); offline, use the local tasks in evals/") from None
    if res is None:
        return None
    out = {}
    for name, metrics in res["results"].items():
        metric = next((m for m in METRICS if f"{m},none" in metrics), None)
        samples = res.get("samples", {}).get(name)
        if metric is None or not samples:
            continue  # a group row; its leaves are reported
        items = sorted(((s["doc_id"], float(s[metric])) for s in samples), key=lambda x: x[0])
        out[name] = {"metric": metric, "value": float(metrics[f"{metric},none"]), "n": len(items), "items": [v for _, v in items]}
    return out


def _stderr(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _baseline_items(run: TaskRun, base_path: Path, load_base, tok_base, base_hash: str) -> dict | None:
    """The baseline's per-item scores, cached by everything that changes them (the backend and the
    device type included: vLLM's and a GPU's kernels round differently)."""
    key = hashlib.sha256(json.dumps([base_hash, sorted(run.tasks), run.limit, run.dtype, _files_hash(local_tasks_dir())]
                                    + ([] if (run.backend, run.device.type) == ("hf", "cpu") else [run.backend, run.device.type])
                                    ).encode()).hexdigest()[:24]
    cache = subdir("lmeval-cache") / f"{key}.json"
    try:  # a damaged cache entry (a crash before atomic writes) is recomputed
        base = json.loads(cache.read_text()) if cache.is_file() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        base = None
    if not isinstance(base, dict):
        from quantkit.core.atomic import write_json

        base = _evaluate(run, base_path, load_base, tok_base)
        if base is not None:  # rank 0 only
            write_json(cache, base)
    return base


def task_deltas(run: TaskRun, model_path: Path, base_path: Path, tok, tok_base, base_hash: str, model, load_model, load_base) -> dict:
    """Each task's score and its paired delta against the baseline. `model`: the already loaded model
    under test or None; `load_model`/`load_base` load on demand (the in-process hf backend only)."""
    base = _baseline_items(run, base_path, load_base, tok_base, base_hash)
    mine = _evaluate(run, model_path, (lambda: model) if model is not None else load_model, tok)
    if mine is None or base is None:
        return {}  # a data-parallel rank other than 0
    out = {}
    for name, m in mine.items():
        b = base.get(name)
        if b is None or len(b["items"]) != len(m["items"]):
            continue
        diffs = [x - y for x, y in zip(m["items"], b["items"])]
        out[name] = {
            "metric": m["metric"], "value": m["value"], "stderr": _stderr(m["items"]), "baseline": b["value"],
            "baseline_stderr": _stderr(b["items"]), "delta": m["value"] - b["value"], "delta_stderr": _stderr(diffs),
            "n": m["n"], "delta_stderr_kind": "paired per-item differences",
        }
    return out
