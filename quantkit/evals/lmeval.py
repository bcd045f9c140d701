"""lm-eval tasks on the loaded model (its HFLM wrapper), with deltas against the baseline.

The model under test is handed to lm-eval in process, so an artifact is evaluated exactly as it
loads. Local tasks live in `evals/` (lm-eval YAMLs reading JSONL); their relative data paths
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
from pathlib import Path

from ..errors import DataError
from ..home import subdir

METRICS = ("acc", "acc_norm", "exact_match")


def local_tasks_dir() -> Path | None:
    env = os.environ.get("QUANTKIT_EVALS_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / "evals"
    return repo if repo.is_dir() else None


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


def _evaluate(model, tok, tasks: tuple[str, ...], limit: int | None) -> dict:
    """{task: {"metric", "value", "stderr", "n", "items": [per-item scores]}} for every leaf task."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

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
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=8, max_length=min(2048, getattr(model.config, "max_position_embeddings", 2048)))
        try:
            res = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit, log_samples=True,
                                  bootstrap_iters=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
        except ValueError as exc:  # e.g. a group together with one of its own tasks
            raise DataError(f"lm-eval rejected the task list: {str(exc).splitlines()[0][:160]}") from None
        except (ConnectionError, OSError) as exc:
            raise DataError(f"lm-eval could not load a task's data ({type(exc).__name__}: {str(exc)[:120]}); offline, use the local tasks in evals/") from None
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


def task_deltas(model, tok, load_base, tok_base, base_hash: str, tasks: tuple[str, ...], limit: int | None, dtype: str) -> dict:
    key = hashlib.sha256(json.dumps([base_hash, sorted(tasks), limit, dtype, _files_hash(local_tasks_dir())]).encode()).hexdigest()[:24]
    cache = subdir("lmeval-cache") / f"{key}.json"
    try:  # a damaged cache entry (a crash before atomic writes) is recomputed
        base = json.loads(cache.read_text()) if cache.is_file() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        base = None
    if not isinstance(base, dict):
        from ..atomic import write_json

        base = _evaluate(load_base(), tok_base, tasks, limit)
        write_json(cache, base)
    mine = _evaluate(model, tok, tasks, limit)
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
