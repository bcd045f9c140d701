"""vLLM itself, from the environment scripts/_install.sh built: the bench engine and the eval scorer
on the demo model, on the CPU. Where the install script built vLLM (tests/installed.py), a vLLM that
does not start fails these tests; they skip only where vLLM was left out (QUANTKIT_SKIP_VLLM=1) or
never installed by the script. Few and slow: each starts vLLM (~30 s on 2 idle cores)."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def real_vllm(monkeypatch):
    from installed import vllm_venv

    monkeypatch.setenv("QUANTKIT_VLLM_VENV", str(vllm_venv()))


def test_bench_times_vllm_and_its_logits_pass_the_self_check(cli, demo_model, real_vllm):
    code, _, err, out = cli("bench", str(demo_model), "--engine", "vllm", "--device", "cpu", "--prompt-len", "32", "--gen-len", "8",
                            "--repeats", "2", "--min-seconds", "0", "--warmups", "1", "--json")
    assert code == 0, err
    row, = out["rows"]
    assert row["self_check"]["passed"] and row["self_check"]["mean_kl"] < 0.01, row["self_check"]
    assert row["engine"] == "vllm" and "vLLM" in row["kernel"] and row["tpot_ms"] > 0 and row["ttft_ms"] > 0
    assert row["stats"]["per_step"]["measured"] and all(len(rep) == 7 for rep in row["stats"]["step_times_ms"])


def test_eval_on_vllm_agrees_with_transformers_on_the_same_checkpoint(cli, demo_model, real_vllm):
    """The demo (16-bit) in float32 on both sides: vLLM's full-vocabulary log-probabilities are transformers'."""
    code, _, err, out = cli("eval", str(demo_model), "--baseline", str(demo_model), "--engine", "vllm", "--device", "cpu",
                            "--text", "set:world-factbook", "--seq-len", "128", "--max-tokens", "256", "--json")
    assert code == 0, err
    row, = out["texts"]
    assert out["scorer"]["engine"] == "vllm" and out["scorer"]["dtype"] == "float32" and row["tokens"] == 254
    assert row["kld"]["mean"] < 1e-3 and row["top1_agreement"] > 0.98 and abs(row["delta_ppl_pct"]) < 0.5, row
