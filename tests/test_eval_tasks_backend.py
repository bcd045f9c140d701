"""`--tasks-backend hf|vllm`: lm-eval's own parallel backends, passed through. The settings each
refuses, and HF data parallel (under `accelerate launch`) checked on a stand-in; the vLLM backend,
which runs in vLLM's own environment: test_vllm_tasks.py."""

import sys
import types

import pytest
import torch

from quantkit.errors import DataError
from quantkit.evals.lmeval import TaskRun, _hf_lm, check_backend


@pytest.mark.parametrize(
    "backend,tp,dp,needle",
    [
        ("hf", 2, 1, "vLLM's"),
        ("hf", 1, 4, "accelerate launch"),
        ("vllm", 0, 1, "at least 1"),
        ("tgi", 1, 1, "use one of hf, vllm"),
    ],
)
def test_bad_backend_settings(backend, tp, dp, needle):
    with pytest.raises(DataError, match=needle):
        check_backend(backend, tp, dp)


def _fake_module(monkeypatch, name: str, cls_name: str, seen: list):
    mod = types.ModuleType(name)
    setattr(mod, cls_name, lambda **kw: seen.append(kw) or "lm")
    monkeypatch.setitem(sys.modules, name, mod)


def test_hf_under_accelerate_launch_loads_by_path_for_data_parallel(monkeypatch, tmp_path):
    """lm-eval's HFLM runs data parallel only when it loads the model itself (by path)."""
    seen = []
    _fake_module(monkeypatch, "lm_eval.models.huggingface", "HFLM", seen)
    run = TaskRun(("qk_facts",), 8, "bfloat16", torch.device("cuda", 0), "hf", processes=2)
    _hf_lm(run, tmp_path / "artifact", lambda: pytest.fail("a pre-loaded model disables lm-eval's data parallel"), None)
    assert seen == [
        {
            "pretrained": str(tmp_path / "artifact"),
            "dtype": "bfloat16",
            "batch_size": "auto",
            "trust_remote_code": False,
        }
    ]
    seen.clear()
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=512))
    _hf_lm(TaskRun(("qk_facts",), 8, "float32", torch.device("cpu", 0), "hf"), tmp_path, lambda: model, "tok")
    assert seen == [
        {"pretrained": model, "tokenizer": "tok", "batch_size": 8, "max_length": 512}
    ]  # in process, as loaded


def test_only_rank_0_reports(cli, tiny_dir, monkeypatch):
    """A data-parallel rank other than 0 computes its share and prints nothing: eval asks its
    runtime (core/distributed.py), here a stand-in for rank 1 of 2."""
    from contextlib import contextmanager

    import quantkit.core.distributed as distributed
    import quantkit.evals.lmeval as lmeval

    class Rank1(distributed.OneProcess):
        rank, world_size = 1, 2

    @contextmanager
    def session(device_spec=None):
        yield Rank1()

    monkeypatch.setattr(lmeval, "_evaluate", lambda *a, **k: None)  # lm-eval returns no results off rank 0
    monkeypatch.setattr(distributed, "session", session)
    code, out, err, _ = cli(
        "eval",
        str(tiny_dir / "llama-mha"),
        "--baseline",
        str(tiny_dir / "llama-mha"),
        "--tasks",
        "qk_facts",
        "--limit",
        "2",
    )
    assert code == 0 and out == "", err
