"""quantkit bench on tiny fixtures: engines, kernels, accounting, bad input. Timings are not asserted."""

import json

import pytest
import torch

from quantkit.bench import kernels
from quantkit.bench.accounting import mean_step_bytes, weight_read_bytes
from quantkit.bench.harness import summarize_ms

FAST = ["--prompt-len", "16", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "1"]


@pytest.mark.parametrize("group,asym", [(32, False), (64, True), (128, False)])
def test_int4_kernel_matches_dense_reference(group, asym):
    torch.manual_seed(0)
    n, k = 64, 256
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8)
    s = torch.rand(n, k // group) * 0.05
    zp = torch.randint(-3, 3, (n, k // group), dtype=torch.int8) if asym else None
    x = torch.randn(3, k, dtype=torch.bfloat16)
    ref = x.float() @ kernels.dense_from_int(q, s, zp, group).t()
    out = kernels.Int4WeightOnlyLinear(q, s, zp, group, None, "cpu")(x).float()
    assert torch.allclose(out, ref, atol=0.05 * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("asym", [False, True])
def test_int8_kernel_matches_dense_reference(asym):
    torch.manual_seed(0)
    q = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    s = torch.rand(32, 1) * 0.01
    zp = torch.randint(-20, 20, (32, 1), dtype=torch.int8) if asym else None
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    ref = x.float() @ kernels.dense_from_int(q, s, zp, -1).t()
    out = kernels.Int8WeightOnlyLinear(q, s, zp, None, "cpu")(x).float()
    assert torch.allclose(out, ref, atol=0.02 * ref.abs().max().item(), rtol=0)
    w8a8 = kernels.Int8DynamicActivationLinear(q, s, None, "cpu")(x).float()
    assert torch.allclose(w8a8, x.float() @ kernels.dense_from_int(q, s, None, -1).t(), atol=0.05 * ref.abs().max().item(), rtol=0)


def test_int4_cpu_unpack_inverts_aten_packing():
    q_u = torch.randint(0, 16, (128, 96), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q_u, 1)
    assert torch.equal(kernels.unpack_int4_cpu(packed, 128, 96), q_u.to(torch.uint8))


@pytest.mark.parametrize("asym", [False, True])
def test_prefill_rows_take_the_dequantized_path_and_agree_with_decode(asym):
    """From PREFILL_ROWS rows the weight-only layers dequantize for the call; each row must match
    what the decode kernel gives for that row alone."""
    torch.manual_seed(0)
    n, k, group = 128, 256, 64
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8)
    s = torch.rand(n, k // group) * 0.05
    zp = torch.randint(-3, 3, (n, k // group), dtype=torch.int8) if asym else None
    x = torch.randn(kernels.PREFILL_ROWS, k, dtype=torch.bfloat16)
    for layer in (kernels.Int4WeightOnlyLinear(q, s, zp, group, None, "cpu"),
                  kernels.Int8WeightOnlyLinear(torch.randint(-128, 128, (n, k), dtype=torch.int8), s[:, :1] * 0.2,
                                               zp[:, :1] if asym else None, None, "cpu")):
        many = layer(x).float()
        one = torch.cat([layer(x[i : i + 1]) for i in range(x.shape[0])]).float()
        assert torch.allclose(many, one, atol=0.02 * one.abs().max().item(), rtol=0)
    assert kernels.Int4WeightOnlyLinear(q, s, zp, group, None, "cpu")._dense_prefill


def test_accounting_tied_lm_head_counts_table_once_plus_row():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    acct = weight_read_bytes(m)
    linears = (32 * 32 * 2 + 16 * 32 * 2 + 64 * 32 * 3) * 2
    norms = 3 * 32 * 2
    assert acct["tied_lm_head"] and acct["weight_bytes_per_token"] == linears + norms + 100 * 32 * 2 + 32 * 2
    assert mean_step_bytes(1000, 10, 4, 3) == 1000 + 10 * (5.5 + 1)


def test_summary_stats():
    s = summarize_ms([0.001, 0.002, 0.003])
    assert s["median"] == pytest.approx(2.0) and s["n"] == 3 and s["min"] == pytest.approx(1.0)


def test_bench_cli_dense_and_int4_artifact(cli, tiny_llama, tiny_text, tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    art = tmp_path / "int4"
    code, _, err, _ = cli("convert", str(repo / "recipes" / "int4-w4a16-rtn.yaml"), "--model", str(tiny_llama), "--out", str(art), "--json")
    assert code == 0, err
    plot = tmp_path / "rule.png"
    code, _, err, data = cli("bench", str(tiny_llama), str(art), *FAST, "--engine", "eager", "--plot", str(plot), "--sweep", "8,16", "--json")
    assert code == 0, err
    dense, q4 = data["rows"]
    assert dense["kernel"] == "dense" and "int4pack" in q4["kernel"]
    assert q4["weight_bytes_per_token"] < dense["weight_bytes_per_token"]
    for r in data["rows"]:
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0 and len(r["stats"]["step_times_ms"][0]) == 3
        assert r["predicted_tpot_ms"] > 0 and 0 < r["tpot_efficiency"]
        assert [p["prompt_len"] for p in r["prompt_sweep"]] == [8, 16]
    assert plot.is_file() and plot.stat().st_size > 1000
    assert data["fit"]["points"] == 2


def test_bench_compiled_engine(cli, tiny_llama):
    code, _, err, data = cli("bench", str(tiny_llama), *FAST, "--engine", "compiled", "--json")
    assert code == 0, err
    assert data["rows"][0]["compile_and_warmup_s"] > 0


def test_bench_synthetic_shape(cli, tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256, "max_position_embeddings": 256, "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    code, _, err, data = cli("bench", "--shape", str(p), "--shape-bits", "16,4", *FAST, "--engine", "eager", "--json")
    assert code == 0, err
    b16, b4 = data["rows"]
    assert b4["weight_bytes_per_token"] < b16["weight_bytes_per_token"] / 2


def test_bench_bad_input(cli, tiny_llama):
    code, _, err, _ = cli("bench", str(tiny_llama), "--prompt-len", "0")
    assert code == 2 and "--prompt-len" in err
    code, _, err, _ = cli("bench", str(tiny_llama), "--prompt-len", "5000")
    assert code == 2 and "exceed the model's context" in err
    code, _, err, _ = cli("bench")
    assert code == 2 and "nothing to bench" in err
    if not torch.cuda.is_available():
        code, _, err, _ = cli("bench", str(tiny_llama), "--device", "cuda")
        assert code == 2 and "no CUDA GPU" in err
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "warp")
    assert code == 2 and "unknown engine" in err


def _no_probe(monkeypatch):
    import quantkit.bench.runner as runner

    monkeypatch.setattr(runner, "device_figures", lambda *a, **k: pytest.fail("probed the device"))


@pytest.mark.parametrize("flag,value", [("--repeats", "0"), ("--warmups", "-1"), ("--min-seconds", "-1")])
def test_bench_bad_timing_settings_before_any_work(cli, tiny_llama, monkeypatch, flag, value):
    _no_probe(monkeypatch)
    monkeypatch.setattr("quantkit.models.resolve_model", lambda *a: pytest.fail("resolved a model"))
    args = [*FAST, "--min-seconds", "0", flag, value]
    code, _, err, _ = cli("bench", str(tiny_llama), *args)
    assert code == 2 and flag in err and "Traceback" not in err


def test_bench_context_checked_before_probe(cli, tiny_llama, monkeypatch):
    _no_probe(monkeypatch)
    code, _, err, _ = cli("bench", str(tiny_llama), "--prompt-len", "5000")
    assert code == 2 and "exceed the model's context" in err


def test_bench_one_row_fails_others_kept_exit_1(cli, tiny_llama, tmp_path):
    import shutil

    short = tmp_path / "short"
    shutil.copytree(tiny_llama, short)
    cfg = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 8}))
    code, out, err, _ = cli("bench", str(tiny_llama), str(short), *FAST, "--engine", "eager")
    assert code == 1, err
    assert "| llama-gqa | dense |" in out
    assert "not benchmarked: short: prompt + generated tokens (20) exceed the model's context (8)" in out


def test_bench_update_card(cli, tiny_llama, tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    art = tmp_path / "int4"
    code, _, err, _ = cli("convert", str(repo / "recipes" / "int4-w4a16-rtn.yaml"), "--model", str(tiny_llama), "--out", str(art), "--json")
    assert code == 0, err
    code, _, err, data = cli("bench", str(art), str(tiny_llama), *FAST, "--engine", "eager", "--update-card", "--json")
    assert code == 0, err
    assert f"skipped {tiny_llama}: not a quantkit artifact" in err
    bench = json.loads((art / "quantkit.json").read_text())["results"]["bench"]
    assert bench["tpot_ms"] == data["rows"][0]["tpot_ms"] and bench["engine"] == "eager" and bench["device"] == "cpu"
    card = (art / "README.md").read_text()
    assert "| TTFT (16-token prompt, cpu, eager) |" in card and f"| TPOT (batch 1) | {bench['tpot_ms']:.2f} ms" in card
    assert f"| kernel | {bench['kernel']} |" in card
    assert not (tiny_llama / "quantkit.json").exists()


def test_bench_model_too_big(cli, tiny_llama, monkeypatch):
    import psutil

    class Tiny:
        available = 1000

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny())
    code, _, err, _ = cli("bench", str(tiny_llama), *FAST)
    assert code == 2 and "GB available" in err


def test_vllm_engine_without_vllm_is_clear(cli, tiny_llama):
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "vllm", *FAST)
    assert code == 2 and ("vLLM is not installed" in err or "needs --device cuda" in err)
