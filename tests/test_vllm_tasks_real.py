"""`--tasks-backend vllm` for real: lm-eval's VLLM class in the vLLM environment scripts/_install.sh
built, on the tiny model vLLM loads. Where the install script built vLLM (tests/installed.py), a
vLLM or lm-eval there that does not run fails this test; it skips only where vLLM was left out
(QUANTKIT_SKIP_VLLM=1) or never installed by the script. Slow: it starts vLLM (~30 s on 2 idle cores)."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def real_vllm(monkeypatch):
    from installed import vllm_venv

    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(vllm_venv()))


def test_a_local_task_on_vllm_scores_as_transformers_does(cli, tiny_llama, real_vllm):
    """The same checkpoint in float32 through lm-eval's VLLM and its HFLM: the same task, items and accuracy."""
    args = (
        "eval",
        str(tiny_llama),
        "--baseline",
        str(tiny_llama),
        "--tasks",
        "qk_facts",
        "--limit",
        "4",
        "--device",
        "cpu",
        "--json",
    )
    code, _, err, out = cli(*args, "--tasks-backend", "vllm")
    assert code == 0, err
    row = out["tasks"]["qk_facts"]
    assert out["tasks_backend"] == "vllm" and row["metric"] == "acc" and row["n"] == 4 and row["delta"] == 0, row
    code, _, err, hf = cli(*args)
    assert code == 0, err
    assert hf["tasks"]["qk_facts"]["n"] == 4 and row["value"] == hf["tasks"]["qk_facts"]["value"], (row, hf["tasks"])
