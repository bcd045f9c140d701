"""quantkit bench on tiny fixtures: the CLI end to end, kernels, accounting, devices, bad input.
Timings are never asserted; the measurement fixes are checked through what the
JSON says about them."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fixtures import RECIPES

from quantkit.bench import kernels
from quantkit.bench.accounting import kv_concat, kv_live, kv_static, mean_step_bytes, weight_read_bytes
from quantkit.bench.harness import summarize_ms

REPO = Path(__file__).resolve().parents[1]
FAST = ["--prompt-len", "16", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "1"]


# a CPU with native bf16 arithmetic (AMX, AVX512-BF16): its bf16 matmul well above its float32
NATIVE_BF16 = {"bfloat16": 1.0, "float16": 0.15, "float32": 0.15}
# a CPU without it (AVX-512 VNNI, no BF16/AMX): bf16 emulated, an order of magnitude below float32
EMULATED_BF16 = {"bfloat16": 0.054, "float16": 0.01, "float32": 0.6}


def fake_probe(read_gbps=(20.0,), tflops=(1.0,), llc=None, matmul=NATIVE_BF16):
    """A probe(device) that returns the given figures in turn (before the timings, after them)."""
    calls = []

    def probe(device, threads=None):
        i = min(len(calls), len(read_gbps) - 1)
        calls.append(device)
        return {
            "device": str(device),
            "name": "fake cpu",
            "threads": 2,
            "read_gbps": read_gbps[i],
            "copy_gbps": read_gbps[i] / 2,
            "bf16_matmul_tflops": tflops[min(i, len(tflops) - 1)],
            "matmul_tflops": {**matmul, "bfloat16": tflops[min(i, len(tflops) - 1)] * matmul["bfloat16"]},
            "llc_bytes": llc,
            "measured_at": "now",
            "method": "injected",
            "spread": {
                "read_gbps": {"best": read_gbps[i], "median": read_gbps[i], "worst": read_gbps[i], "spread_pct": 0.0}
            },
        }

    probe.calls = calls
    return probe


@pytest.fixture(scope="module")
def int4_art(tiny_llama, tmp_path_factory):
    """One RTN INT4 g32 artifact of the tiny Llama for the module (a real compressed-tensors file)."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    out = tmp_path_factory.mktemp("art") / "int4"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTKIT_HOME", str(out.parent / "home"))
        res = CliRunner().invoke(
            group,
            [
                "convert",
                str(RECIPES / "int4-w4a16-rtn.yaml"),
                "--model",
                str(tiny_llama),
                "--set",
                "steps[0].quantize.group_size=32",
                "--out",
                str(out),
                "--json",
            ],
            catch_exceptions=False,
        )
    assert res.exit_code == 0, res.stderr
    return out


# ---- kernels and accounting ---------------------------------------------------------------


def dense_from_int(q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """Reference dequantization w = (q - zp) * scale."""
    n, k = q.shape
    groups = 1 if group_size in (-1, None) else k // group_size
    s = scale.float().reshape(n, groups, 1)
    z = torch.zeros_like(s) if zp is None else zp.float().reshape(n, groups, 1)
    return ((q.float().reshape(n, groups, -1) - z) * s).reshape(n, k)


@pytest.mark.parametrize("group,asym", [(32, False), (64, True), (128, False)])
def test_int4_kernel_matches_dense_reference(group, asym):
    torch.manual_seed(0)
    n, k = 64, 256
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8)
    s = torch.rand(n, k // group) * 0.05
    zp = torch.randint(-3, 3, (n, k // group), dtype=torch.int8) if asym else None
    x = torch.randn(3, k, dtype=torch.bfloat16)
    ref = x.float() @ dense_from_int(q, s, zp, group).t()
    out = kernels.Int4WeightOnlyLinear(q, s, zp, group, None, torch.device("cpu"))(x).float()
    assert torch.allclose(out, ref, atol=0.05 * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("asym", [False, True])
def test_int8_kernel_matches_dense_reference(asym):
    torch.manual_seed(0)
    q = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
    s = torch.rand(32, 1) * 0.01
    zp = torch.randint(-20, 20, (32, 1), dtype=torch.int8) if asym else None
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    ref = x.float() @ dense_from_int(q, s, zp, -1).t()
    out = kernels.Int8WeightOnlyLinear(q, s, zp, None, "cpu:0")(x).float()
    assert torch.allclose(out, ref, atol=0.02 * ref.abs().max().item(), rtol=0)
    w8a8 = kernels.Int8DynamicActivationLinear(q, s, None, "cpu")(x).float()
    assert torch.allclose(
        w8a8, x.float() @ dense_from_int(q, s, None, -1).t(), atol=0.05 * ref.abs().max().item(), rtol=0
    )


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
    for layer in (
        kernels.Int4WeightOnlyLinear(q, s, zp, group, None, "cpu"),
        kernels.Int8WeightOnlyLinear(
            torch.randint(-128, 128, (n, k), dtype=torch.int8), s[:, :1] * 0.2, zp[:, :1] if asym else None, None, "cpu"
        ),
    ):
        many = layer(x).float()
        one = torch.cat([layer(x[i : i + 1]) for i in range(x.shape[0])]).float()
        assert torch.allclose(many, one, atol=0.02 * one.abs().max().item(), rtol=0)
    assert kernels.Int4WeightOnlyLinear(q, s, zp, group, None, "cpu")._dense_prefill


def test_accounting_tied_lm_head_counts_table_once_plus_row():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    acct = weight_read_bytes(m)
    linears = (32 * 32 * 2 + 16 * 32 * 2 + 64 * 32 * 3) * 2
    norms = 3 * 32 * 2
    assert acct["tied_lm_head"] and acct["weight_bytes_per_token"] == linears + norms + 100 * 32 * 2 + 32 * 2


def test_kv_step_formulas_by_hand():
    """What each cache touches per step (accounting.py), kv = 10 bytes per token, 4 tokens cached."""
    assert kv_live(10, 4) == 10 * 6  # attend over 5, write 1
    assert kv_static(10, 32) == 10 * 33  # attend over all 32 slots, write 1
    assert kv_concat(10, 4) == 10 * 15  # cat reads 5, writes 5, attention reads 5
    # timed steps of prompt 4, 3 tokens (2 decode steps): 4 and 5 tokens cached
    assert mean_step_bytes(lambda c: 1000 + kv_live(10, c), 4, 3) == 1000 + 10 * 6.5


def test_summary_stats():
    s = summarize_ms([0.001, 0.002, 0.003])
    assert s.median == pytest.approx(2.0) and s.n == 3 and s.min == pytest.approx(1.0)
    assert s.spread == pytest.approx((s.p90 - 1.0) / 1.0) and summarize_ms([0.002]).spread is None


# ---- devices -----------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu:0", torch.device("cpu"), torch.device("cpu", 0)])
def test_compressed_loader_builds_on_the_device(int4_art, device):
    """The skeleton was built on meta and then `.to(device)` for any device spelled other than
    "cpu": `load_for_bench(path, "cpu:0")` raised "Cannot copy out of meta tensor"."""
    from quantkit.bench.loader import load_for_bench

    bm = load_for_bench(int4_art, device, torch.float32)
    assert all(t.device.type == "cpu" for t in [*bm.model.parameters(), *bm.model.buffers()])
    assert "int4pack" in bm.kernel


def test_no_device_strings_compared_in_the_bench_path():
    """Devices are values: nothing in bench/, roofline or the bench CLI compares a device string
    with "cpu"/"cuda" (the only branches on a device pick a kernel or a sync, on `.type`)."""
    import re

    files = [
        *(REPO / "quantkit" / "bench").rglob("*.py"),
        REPO / "quantkit" / "core" / "roofline.py",
        REPO / "quantkit" / "cli" / "bench_cmd.py",
    ]
    pattern = re.compile(r"""(==|!=)\s*["'](cpu|cuda)["']|["'](cpu|cuda)["']\s*(==|!=)|in\s*\(\s*["'](cpu|cuda)["']""")
    hits = [
        f"{f.name}: {line.strip()}"
        for f in files
        for line in f.read_text().splitlines()
        if pattern.search(line) and ".type" not in line
    ]
    assert hits == []


def test_no_engine_names_compared_in_the_bench_path():
    """An engine's capabilities are attributes of its class (`engine_class(name).takes_gguf`): no code
    around the engines compares an engine's name."""
    import re

    from quantkit.bench.engines import ENGINES

    files = [*(REPO / "quantkit" / "bench").rglob("*.py"), REPO / "quantkit" / "cli" / "bench_cmd.py"]
    names = "|".join(ENGINES)
    pattern = re.compile(rf"""(==|!=)\s*["']({names})["']|["']({names})["']\s*(==|!=)|\bin\s*\(\s*["']({names})["']""")
    hits = [f"{f.name}: {line.strip()}" for f in files for line in f.read_text().splitlines() if pattern.search(line)]
    assert hits == []


def test_bench_runs_with_device_values(tiny_llama, int4_art):
    """The same bench path with a torch.device value and with "cpu:0"; the report names the device and dtype."""
    from quantkit.bench.bench_runner import bench_many
    from quantkit.bench.bench_settings import BenchSettings

    for dev in (torch.device("cpu"), "cpu:0"):
        s = BenchSettings(device=dev, engine="eager", prompt_len=8, gen_len=3, repeats=1, min_seconds=0, warmups=0)
        res = bench_many([int4_art], s, probe=fake_probe())
        row, d = res.rows[0], res.device
        assert d.type == "cpu" and d.dtype == "bfloat16" and d.device_name == "fake cpu"
        assert row.device == str(torch.device(dev)) and row.dtype == "bfloat16" and row.device_name
        assert res.settings.device == str(torch.device(dev))


@pytest.mark.parametrize("matmul, asked, want", [(NATIVE_BF16, None, "bfloat16"), (EMULATED_BF16, None, "float32"),
                                                 (EMULATED_BF16, "bfloat16", "bfloat16")])  # fmt: skip
def test_the_torch_engines_compute_in_the_dtype_the_probe_chooses(tiny_llama, int4_art, matmul, asked, want):
    """bf16 where the probe's bf16 matmul is at least float32's; float32 on a CPU whose bf16 is emulated
    (that CPU's figures, faked); --dtype over both. The row names the dtype, why, and ATen's CPU kernels;
    the twin the attribution measures is built in the same dtype."""
    from quantkit.bench.bench_runner import bench_many
    from quantkit.bench.bench_settings import BenchSettings

    s = BenchSettings(device="cpu", engine="eager", prompt_len=8, gen_len=3, repeats=1, min_seconds=0, warmups=0)
    res = bench_many([tiny_llama, int4_art], replace(s, dtype=asked), probe=fake_probe(matmul=matmul))
    for row in res.rows:
        assert row.dtype == want and row.kv_cache == want, row.name
        assert row.cpu_variant == f"ATen {torch.backends.cpu.get_cpu_capability()}"
        assert ("asked for" if asked else "probed") in row.engine_info.own["dtype_reason"]
        assert row.attribution is not None and f"random {want} weights" in row.attribution.fixed.twin


def test_dtype_is_a_torch_engines_setting(cli, tiny_llama):
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "llamacpp", "--dtype", "float32", *FAST)
    assert code == 2 and "--dtype float32: the llamacpp engine computes in its own types" in err
    assert "--engine eager | compiled take a dtype" in err and "\n" not in err.strip()


# ---- the CLI end to end --------------------------------------------------------------------


def test_bench_cli_dense_and_int4_artifact(cli, tiny_llama, int4_art, tmp_path):
    plot = tmp_path / "rule.png"
    code, _, err, data = cli(
        "bench",
        str(tiny_llama),
        str(int4_art),
        *FAST,
        "--engine",
        "eager",
        "--device",
        "cpu:0",
        "--plot",
        str(plot),
        "--sweep",
        "8,16",
        "--json",
    )
    assert code == 0, err
    dense, q4 = data["rows"]
    assert dense["kernel"] == "dense" and "int4pack" in q4["kernel"]
    assert q4["weight_bytes_per_token"] < dense["weight_bytes_per_token"]
    for r in data["rows"]:
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0 and len(r["stats"]["step_times_ms"][0]) == 3
        assert r["predicted_tpot_ms"] > 0 and 0 < r["tpot_efficiency"]
        assert [p["prompt_len"] for p in r["prompt_sweep"]] == [8, 16]
        assert r["self_check"]["status"] == "passed" and r["self_check"]["mean_kl"] < 0.05
    assert plot.is_file() and plot.stat().st_size > 1000
    assert data["fit"]["points"] == sum(not r["disturbed"] for r in data["rows"])  # disturbed rows are not fitted
    assert data["device"]["device"] == "cpu:0" and data["device"]["dtype"] == "bfloat16" and data["device"]["name"]


def test_prefill_floor_counts_lm_head_once(tiny_llama, monkeypatch):
    """A1: the TTFT floor of the bench is the hand-computed FLOPs with the lm_head at one position
    (engines ask for logits_to_keep=1); the old count put it at every prompt position."""
    from quantkit.bench.bench_runner import bench_many
    from quantkit.bench.bench_settings import BenchSettings

    cfg = json.loads((tiny_llama / "config.json").read_text())
    P, V, h, i, L = 16, cfg["vocab_size"], 128, 256, 2
    linear = 2 * L * (h * h + 2 * 64 * h + h * h + 3 * i * h) * P  # q, k and v (2 KV heads of 32), o, gate/up/down
    flops = linear + 2 * V * h * 1 + 2 * L * 4 * 32 * P * (P + 1)
    compute = 1e-6  # TFLOP/s: compute-bound at any byte count
    s = BenchSettings(
        device="cpu", engine="eager", prompt_len=P, gen_len=3, repeats=1, min_seconds=0, warmups=0, self_check=False
    )
    every_dtype = {"bfloat16": 1.0, "float16": compute, "float32": compute}  # the floor takes the fastest matmul
    row = bench_many([tiny_llama], s, probe=fake_probe(tflops=(compute,), matmul=every_dtype)).rows[0]
    assert row.predicted_ttft_ms == pytest.approx(flops / (compute * 1e12) * 1e3, rel=1e-9)


def test_compiled_cache_sized_per_measurement_and_gqa_shows(cli, tiny_dir):
    """A2: the compiled engine's static cache holds prompt + generated tokens whatever the sweep,
    and every step is accounted as reading all of it, at the KV heads' width: an MHA and a GQA
    model differing only in KV heads differ by exactly that many bytes per step."""
    args = [
        "--engine",
        "compiled",
        "--prompt-len",
        "16",
        "--gen-len",
        "4",
        "--repeats",
        "1",
        "--min-seconds",
        "0",
        "--warmups",
        "1",
        "--sweep",
        "8,48",
        "--no-self-check",
        "--json",
    ]
    code, _, err, data = cli("bench", str(tiny_dir / "llama-mha"), str(tiny_dir / "llama-gqa"), *args)
    assert code == 0, err
    mha, gqa = data["rows"]
    for r in (mha, gqa):
        assert r["kv_cache_tokens"] == 20  # not 48 + 4 (the sweep)
        assert r["bytes_per_token"] == r["weight_bytes_per_token"] + r["kv_bytes_per_token"] * (20 + 1)
    assert (
        mha["kv_bytes_per_token"] == 2 * gqa["kv_bytes_per_token"] == 2 * 2 * 4 * 32 * 2
    )  # K+V, 2 layers, 4 heads of 32, bf16
    saved = (mha["bytes_per_token"] - mha["weight_bytes_per_token"]) - (
        gqa["bytes_per_token"] - gqa["weight_bytes_per_token"]
    )
    assert saved == (mha["kv_bytes_per_token"] - gqa["kv_bytes_per_token"]) * 21


def test_compiled_engine_never_times_compilation(cli, tiny_llama):
    """A3: --warmups 0 with the compiled engine still runs one warm-up (compilation is not decode), and says so."""
    args = list(FAST)
    args[args.index("--warmups") + 1] = "0"
    code, out, err, data = cli("bench", str(tiny_llama), *args, "--engine", "compiled", "--no-self-check", "--json")
    assert code == 0, err
    row = data["rows"][0]
    assert row["warmups"] == 1 and row["compile_and_warmup_s"] > 0 and "warmups_raised" in row["flags"]
    assert any("raised to 1" in n for n in row["notes"])
    code, out, err, _ = cli("bench", str(tiny_llama), *args, "--engine", "compiled", "--no-self-check")
    assert code == 0 and "--warmups 0 raised to 1" in out


def test_sweep_takes_enough_samples(cli, tiny_llama):
    """A3: each sweep length is warmed up and its median taken over at least SWEEP_SAMPLES samples."""
    from quantkit.bench.harness import SWEEP_SAMPLES

    code, _, err, data = cli(
        "bench", str(tiny_llama), *FAST, "--engine", "eager", "--sweep", "8,12", "--no-self-check", "--json"
    )
    assert code == 0, err
    assert all(p["ttft_ms"]["n"] >= SWEEP_SAMPLES for p in data["rows"][0]["prompt_sweep"])


def test_probe_drift_and_spread_reported(cli, tiny_llama, monkeypatch):
    """A4: the device is probed again after the timings; a drift beyond 15% is flagged in the JSON
    and in the text, and the probe's spread over repeats is printed."""
    import quantkit.bench.probe as probing

    monkeypatch.setattr(probing, "run_probe", fake_probe(read_gbps=(50.0, 30.0)))
    code, _, err, data = cli("bench", str(tiny_llama), *FAST, "--engine", "eager", "--no-self-check", "--json")
    assert code == 0, err
    drift = data["device"]["drift"]
    assert drift["flagged"] and drift["worst"] == "read_gbps" and drift["change"]["read_gbps"] == pytest.approx(-0.4)
    assert data["device"]["probe_after"]["read_gbps"] == 30.0 and data["device"]["bandwidth_gbps"] == 50.0
    monkeypatch.setattr(probing, "run_probe", fake_probe(read_gbps=(50.0, 30.0)))
    code, out, err, _ = cli("bench", str(tiny_llama), *FAST, "--engine", "eager", "--no-self-check")
    assert "warning: probe after the timings: read_gbps -40%" in out and "spread 0% over repeats" in out
    monkeypatch.setattr(probing, "run_probe", fake_probe(read_gbps=(50.0, 48.0)))
    code, _, err, data = cli("bench", str(tiny_llama), *FAST, "--engine", "eager", "--no-self-check", "--json")
    assert not data["device"]["drift"]["flagged"]


def test_model_in_cache_is_not_an_accounting_error(cli, tiny_llama, monkeypatch):
    """A4: a model whose step fits in the last-level cache may beat the streaming read: flagged
    'fits in cache', not an accounting error. The same speed without the cache is an error."""
    import quantkit.bench.probe as probing

    slow = 1e-6  # GB/s: any measured TPOT beats this roofline
    monkeypatch.setattr(probing, "run_probe", fake_probe(read_gbps=(slow,), llc=1 << 30))
    code, out, err, data = cli("bench", str(tiny_llama), *FAST, "--engine", "eager", "--no-self-check", "--json")
    row = data["rows"][0]
    assert (
        row["tpot_efficiency"] > 1
        and row["fits_in_cache"]
        and not row["accounting_error"]
        and "fits_in_cache" in row["flags"]
    )
    monkeypatch.setattr(probing, "run_probe", fake_probe(read_gbps=(slow,), llc=1 << 30))
    code, out, err, _ = cli("bench", str(tiny_llama), *FAST, "--engine", "eager", "--no-self-check")
    assert "(fits in cache)" in out and "fit in the last-level cache" in out and "(!)" not in out
    monkeypatch.setattr(probing, "run_probe", fake_probe(read_gbps=(slow,), llc=1000))
    code, out, err, _ = cli("bench", str(tiny_llama), *FAST, "--engine", "eager", "--no-self-check")
    assert "(!) efficiency above 100%" in out


def test_bench_synthetic_shape(cli, tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 256,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    code, _, err, data = cli(
        "bench", "--shape", str(p), "--shape-bits", "16,4", *FAST, "--engine", "eager", "--device", "cpu:0", "--json"
    )
    assert code == 0, err
    b16, b4 = data["rows"]
    assert b4["weight_bytes_per_token"] < b16["weight_bytes_per_token"] / 2
    assert b16["self_check"]["status"] == "skipped" and "random weights" in b16["self_check"]["reason"]


# ---- bad input ------------------------------------------------------------------------------


def test_bench_bad_input(cli, tiny_llama):
    code, _, err, _ = cli("bench", str(tiny_llama), "--prompt-len", "0")
    assert code == 2 and "--prompt-len" in err
    code, _, err, _ = cli("bench", str(tiny_llama), "--prompt-len", "5000")
    assert code == 2 and "exceed the model's context" in err
    code, _, err, _ = cli("bench")
    assert code == 2 and "nothing to bench" in err
    if not torch.cuda.is_available():
        for dev in ("cuda", "cuda:1"):
            code, _, err, _ = cli("bench", str(tiny_llama), "--device", dev)
            assert code == 2 and "no CUDA GPU" in err
    code, _, err, _ = cli("bench", str(tiny_llama), "--device", "tpu")
    assert code == 2 and "--device tpu" in err
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "warp")
    assert code == 2 and "unknown engine 'warp'; valid: eager, compiled, vllm" in err
    code, _, err, _ = cli("bench", str(tiny_llama), "--tensor-parallel", "2", "--engine", "compiled")
    assert code == 2 and "--tensor-parallel" in err


def _no_probe(monkeypatch):
    import quantkit.bench.probe as probing

    monkeypatch.setattr(probing, "run_probe", lambda *a, **k: pytest.fail("probed the device"))


@pytest.mark.parametrize(
    "flag,value", [("--repeats", "0"), ("--warmups", "-1"), ("--min-seconds", "-1"), ("--threads", "0")]
)
def test_bench_bad_timing_settings_before_any_work(cli, tiny_llama, monkeypatch, flag, value):
    _no_probe(monkeypatch)
    monkeypatch.setattr("quantkit.models.resolve.resolve_path", lambda *a: pytest.fail("resolved a model"))
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


def test_bench_update_card(cli, tiny_llama, int4_art, tmp_path):
    import shutil

    art = tmp_path / "int4"
    shutil.copytree(int4_art, art)
    code, _, err, data = cli(
        "bench", str(art), str(tiny_llama), *FAST, "--engine", "eager", "--device", "cpu", "--update-card", "--json"
    )
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


def test_vllm_engine_without_vllm_is_clear(cli, tiny_llama, monkeypatch):
    _no_probe(monkeypatch)
    monkeypatch.delenv("QUANTKIT_VLLM_VENV", raising=False)
    code, _, err, _ = cli("bench", str(tiny_llama), "--engine", "vllm", "--device", "cpu", *FAST)
    assert code == 2 and "vLLM is not installed" in err and "quantkit engines install vllm" in err
