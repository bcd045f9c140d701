"""lm-eval tasks on a model (lm-eval's HFLM in process, or its VLLM in vLLM's environment), with
deltas against the baseline.

Backends (`--tasks-backend`, recipe `eval.tasks_backend`), all lm-eval's own:
- `hf`, one process: the model quantkit loaded (on `--device`, in its dtype) is handed to lm-eval's
  HFLM in process, so an artifact is evaluated exactly as it loads.
- `hf` under `accelerate launch` (more than one process in eval's runtime, `TaskRun.processes`):
  HFLM loads the checkpoint by path and lm-eval's Accelerator runs data parallel, one model copy per
  process (lm-eval refuses a pre-loaded model there: "Please do not launch via accelerate ... if
  passing an existing model"); rank 0 gets the results, writes the cache and reports.
- `vllm`: lm-eval's VLLM wrapper with `tensor_parallel_size` / `data_parallel_size`; vLLM loads
  compressed-tensors artifacts natively. It runs in vLLM's own environment (`quantkit engines
  install vllm`, which puts quantkit's lm-eval there too), in a worker process (external/vllm_tasks.py)
  given the same task files, limit and seeds; checked installed before anything loads.

Local tasks live in `evals/` (lm-eval YAMLs reading JSONL); their relative data paths
are rewritten to absolute ones in a temp include dir, so any working directory works. The
baseline's per-item scores are cached; deltas use paired per-item differences.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from quantkit.core.atomic import write_json
from quantkit.errors import DataError
from quantkit.evals.scorers.vllm_scorer import run_dtype
from quantkit.external import vllm_env, vllm_tasks
from quantkit.home import subdir
from quantkit.resources import eval_tasks_dir

METRICS = ("acc", "acc_norm", "exact_match")
MAX_LENGTH = 2048  # the context lm-eval's backends get (a model's own, when shorter)


@dataclass(frozen=True)
class TaskFiles:
    """Where lm-eval's TaskManager reads tasks: the include directory (local tasks, data paths made
    absolute) and whether lm-eval's built-in tasks are indexed too."""

    include_path: str | None
    include_defaults: bool


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
    processes: int = 1  # launched together (the eval's runtime: torchrun, accelerate launch)


def check_backend(backend: str, tensor_parallel: int, data_parallel: int) -> None:
    """Before any model loads: a known backend, its parallel settings, and what it runs with installed."""
    if backend not in BACKENDS:
        raise DataError(f"--tasks-backend {backend}: use one of {', '.join(BACKENDS)}")
    b = BACKENDS[backend]
    if tensor_parallel < 1 or data_parallel < 1:
        raise DataError("--tensor-parallel and --data-parallel take a count of at least 1")
    if b.no_parallel_sizes and (tensor_parallel, data_parallel) != (1, 1):
        raise DataError(b.no_parallel_sizes)
    if b.check is not None:
        b.check()


def local_tasks_dir() -> Path | None:
    tasks = eval_tasks_dir()
    return tasks if tasks.is_dir() else None


def _rewrite_include(src: Path, dest: Path) -> None:
    """Copy task YAMLs, making relative data_files absolute (relative to the repo root, else the YAML)."""

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
    if run.processes > 1:
        return HFLM(pretrained=str(path), dtype=run.dtype, batch_size=batch, trust_remote_code=run.trust_remote_code)
    model = model()
    return HFLM(
        pretrained=model,
        tokenizer=tok,
        batch_size=batch,
        max_length=min(MAX_LENGTH, getattr(model.config, "max_position_embeddings", MAX_LENGTH)),
    )


def _hf_evaluate(run: TaskRun, path: Path, model, tok, manager, files: TaskFiles) -> dict | None:
    """simple_evaluate in this process, on lm-eval's HFLM."""
    from lm_eval import simple_evaluate

    lm = _hf_lm(run, path, model, tok)
    try:
        return simple_evaluate(model=lm, tasks=list(run.tasks), task_manager=manager, **evaluate_args(run))
    except ValueError as exc:  # e.g. a group together with one of its own tasks
        raise DataError(f"lm-eval rejected the task list: {str(exc).splitlines()[0][:160]}") from None
    except (ConnectionError, OSError) as exc:
        raise DataError(
            f"lm-eval could not load a task's data ({type(exc).__name__}: "
            f"{str(exc)[:120]}); offline, use the local tasks in evals/"
        ) from None


def _vllm_evaluate(run: TaskRun, path: Path, model, tok, manager, files: TaskFiles) -> dict:
    """simple_evaluate on lm-eval's VLLM, in a worker in vLLM's environment (external/vllm_tasks.py):
    the same task files, settings and seeds; the error of vLLM or lm-eval there is one line."""

    args, env = vllm_tasks.model_args(
        path,
        run_dtype(path, run.dtype),
        run.device,
        MAX_LENGTH,
        run.tensor_parallel,
        run.data_parallel,
        run.trust_remote_code,
    )
    return vllm_tasks.evaluate(
        args, env, run.tasks, files.include_path, files.include_defaults, evaluate_args(run), METRICS
    )


def _vllm_installed() -> None:
    vllm_env.require_lm_eval("--tasks-backend vllm")


@dataclass(frozen=True)
class Backend:
    """An lm-eval backend: how it runs simple_evaluate, and what check_backend asks of it."""

    # (run, path, model loader, tokenizer, TaskManager, TaskFiles) -> simple_evaluate's results and samples
    # (None off rank 0)
    evaluate: Callable
    check: Callable[[], None] | None = None  # raises one line where the backend cannot run (before anything loads)
    no_parallel_sizes: str = ""  # the refusal of --tensor-parallel/--data-parallel, for a backend without them


BACKENDS: dict[str, Backend] = {
    "hf": Backend(
        _hf_evaluate,
        no_parallel_sizes="--tensor-parallel/--data-parallel are vLLM's (--tasks-backend vllm); the hf "
        "backend runs data parallel when launched with `accelerate launch --num_processes N -m quantkit eval ...`",
    ),
    "vllm": Backend(_vllm_evaluate, check=_vllm_installed),
}


def evaluate_args(run: TaskRun) -> dict:
    """simple_evaluate's settings, the same on every backend: the limit, per-sample logs (for the
    paired deltas), no bootstrap, every seed fixed."""
    return dict(
        limit=run.limit,
        log_samples=True,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )


def _task_manager(tasks: tuple[str, ...], include: str | None):
    """(lm-eval's TaskManager, the TaskFiles it reads) for `tasks`; an unknown task is one line."""
    from lm_eval.tasks import TaskManager

    files = TaskFiles(include, False)
    manager = (
        TaskManager(include_path=include, include_defaults=False, verbosity="ERROR") if include is not None else None
    )
    if manager is None or any(t not in manager.all_tasks for t in tasks):
        # indexing lm-eval's thousands of built-in task files is slow; only do it when needed
        files = TaskFiles(include, True)
        manager = TaskManager(include_path=include, verbosity="ERROR")
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise DataError(
            f"unknown lm-eval task {unknown[0]!r} (local tasks: "
            f"{', '.join(sorted(n for n in manager.all_tasks if n.startswith(('qk_', 'quantkit'))))}; "
            "standard tasks need their datasets from the Hub)"
        )
    return manager, files


def _evaluate(run: TaskRun, path: Path, model, tok) -> dict | None:
    """{task: {"metric", "value", "n", "items": [per-item scores]}} for every leaf task;
    None on a data-parallel rank other than 0 (lm-eval gathers the results on rank 0).
    `model`: a function returning the loaded transformers model (only the in-process hf backend calls it)."""
    src = local_tasks_dir()
    with tempfile.TemporaryDirectory(prefix="quantkit-tasks-") as tmp:
        if src is not None:
            _rewrite_include(src, Path(tmp))
        manager, files = _task_manager(run.tasks, tmp if src is not None else None)
        res = BACKENDS[run.backend].evaluate(run, path, model, tok, manager, files)
    return None if res is None else per_task(res)


def per_task(res: dict) -> dict:
    """simple_evaluate's results and samples as {task: {"metric", "value", "n", "items"}}: each leaf
    task's first metric of METRICS, and its per-item scores in doc_id order."""
    out = {}
    for name, metrics in res["results"].items():
        metric = next((m for m in METRICS if f"{m},none" in metrics), None)
        samples = res.get("samples", {}).get(name)
        if metric is None or not samples:
            continue  # a group row; its leaves are reported
        items = sorted(((s["doc_id"], float(s[metric])) for s in samples), key=lambda x: x[0])
        out[name] = {
            "metric": metric,
            "value": float(metrics[f"{metric},none"]),
            "n": len(items),
            "items": [v for _, v in items],
        }
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
    key = hashlib.sha256(
        json.dumps(
            [base_hash, sorted(run.tasks), run.limit, run.dtype, _files_hash(local_tasks_dir())]
            + ([] if (run.backend, run.device.type) == ("hf", "cpu") else [run.backend, run.device.type])
        ).encode()
    ).hexdigest()[:24]
    cache = subdir("lmeval-cache") / f"{key}.json"
    try:  # a damaged cache entry (a crash before atomic writes) is recomputed
        base = json.loads(cache.read_text()) if cache.is_file() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        base = None
    if not isinstance(base, dict):
        base = _evaluate(run, base_path, load_base, tok_base)
        if base is not None:  # rank 0 only
            write_json(cache, base)
    return base


def task_deltas(
    run: TaskRun, model_path: Path, base_path: Path, tok, tok_base, base_hash: str, model, load_model, load_base
) -> dict:
    """Each task's score and its paired delta against the baseline. `model`: the already loaded model
    under test or None; `load_model`/`load_base` load on demand (the in-process hf backend only)."""
    base = _baseline_items(run, base_path, load_base, tok_base, base_hash)
    if Path(model_path).resolve() == Path(base_path).resolve():
        # the baseline itself: the same scores, without a second load (vLLM alone takes ~30 s to start on 2 idle cores)
        mine = base
    else:
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
            "metric": m["metric"],
            "value": m["value"],
            "stderr": _stderr(m["items"]),
            "baseline": b["value"],
            "baseline_stderr": _stderr(b["items"]),
            "delta": m["value"] - b["value"],
            "delta_stderr": _stderr(diffs),
            "n": m["n"],
            "delta_stderr_kind": "paired per-item differences",
        }
    return out
