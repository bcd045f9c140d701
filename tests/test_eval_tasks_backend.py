"""`--tasks-backend hf|vllm`: lm-eval's own parallel backends, passed through. vLLM is not installed
here: its refusal is tested, and the arguments quantkit hands lm-eval's VLLM wrapper are checked on
a stand-in; HF data parallel (under `accelerate launch`) is checked the same way."""

import sys
import types

import pytest
import torch

from quantkit.errors import DataError
from quantkit.evals.lmeval import TaskRun, _lm, check_backend


def test_vllm_missing_is_one_line_before_anything_loads(cli, tiny_dir, monkeypatch):
    import importlib.util

    import quantkit.evals.scorers.transformers as hf

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded a model before checking the backend"))
    code, _, err, _ = cli("eval", str(tiny_dir / "llama-mha"), "--baseline", str(tiny_dir / "llama-mha"), "--tasks", "qk_facts",
                          "--tasks-backend", "vllm", "--tensor-parallel", "2")
    assert code == 2 and "vLLM is not installed" in err and "pip install vllm" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("backend,tp,dp,needle", [("hf", 2, 1, "vLLM's"), ("hf", 1, 4, "accelerate launch"),
                                                  ("vllm", 0, 1, "at least 1"), ("tgi", 1, 1, "use one of hf, vllm")])
def test_bad_backend_settings(backend, tp, dp, needle, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())  # as if vLLM were installed
    with pytest.raises(DataError, match=needle):
        check_backend(backend, tp, dp)


def _fake_module(monkeypatch, name: str, cls_name: str, seen: list):
    mod = types.ModuleType(name)
    setattr(mod, cls_name, lambda **kw: seen.append(kw) or "lm")
    monkeypatch.setitem(sys.modules, name, mod)


def test_vllm_gets_the_checkpoint_path_and_its_parallel_sizes(monkeypatch, tmp_path):
    seen = []
    _fake_module(monkeypatch, "lm_eval.models.vllm_causallms", "VLLM", seen)
    run = TaskRun(("qk_facts",), 8, "bfloat16", torch.device("cuda", 0), "vllm", tensor_parallel=2, data_parallel=4)
    assert _lm(run, tmp_path / "artifact", lambda: pytest.fail("vLLM loads the checkpoint itself"), None) == "lm"
    assert seen == [{"pretrained": str(tmp_path / "artifact"), "dtype": "bfloat16", "tensor_parallel_size": 2,
                     "data_parallel_size": 4, "trust_remote_code": False, "seed": 0}]


def test_hf_under_accelerate_launch_loads_by_path_for_data_parallel(monkeypatch, tmp_path):
    """lm-eval's HFLM runs data parallel only when it loads the model itself (by path)."""
    seen = []
    _fake_module(monkeypatch, "lm_eval.models.huggingface", "HFLM", seen)
    monkeypatch.setenv("WORLD_SIZE", "2")
    run = TaskRun(("qk_facts",), 8, "bfloat16", torch.device("cuda", 0), "hf")
    _lm(run, tmp_path / "artifact", lambda: pytest.fail("a pre-loaded model disables lm-eval's data parallel"), None)
    assert seen == [{"pretrained": str(tmp_path / "artifact"), "dtype": "bfloat16", "batch_size": "auto", "trust_remote_code": False}]
    monkeypatch.setenv("WORLD_SIZE", "1")
    seen.clear()
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=512))
    _lm(TaskRun(("qk_facts",), 8, "float32", torch.device("cpu", 0), "hf"), tmp_path, lambda: model, "tok")
    assert seen == [{"pretrained": model, "tokenizer": "tok", "batch_size": 8, "max_length": 512}]  # in process, as loaded


def test_only_rank_0_reports(cli, tiny_dir, monkeypatch):
    """A data-parallel rank other than 0 computes its share and prints nothing."""
    import quantkit.evals.lmeval as lmeval

    monkeypatch.setattr(lmeval, "_evaluate", lambda *a, **k: None)  # lm-eval returns no results off rank 0
    monkeypatch.setenv("RANK", "1")
    code, out, err, _ = cli("eval", str(tiny_dir / "llama-mha"), "--baseline", str(tiny_dir / "llama-mha"), "--tasks", "qk_facts",
                            "--limit", "2")
    assert code == 0 and out == "", err
