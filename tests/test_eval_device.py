"""`quantkit eval --device/--dtype/--batch-size`: the device is a value (cpu and cpu:0 run the same
path a GPU takes), the default precision follows the device, windows are batched, and lm-eval tasks
run where the model loaded. No GPU here: the CUDA defaults are checked on a device value."""

import pytest
import torch

from quantkit.evals.placement import default_batch_size, default_dtype, window_bytes

ARGS = ["--seq-len", "32", "--max-tokens", "160", "--json"]


@pytest.fixture(scope="module")
def other(tiny_dir, tmp_path_factory):
    from fixtures import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("dev") / "other", "llama-gqa", tiny_dir / "tokenizer", seed=1)


def _eval(cli, other, tiny_dir, tiny_text, *extra):
    code, _, err, data = cli(
        "eval", str(other), "--baseline", str(tiny_dir / "llama-gqa"), "--text", f"file:{tiny_text}", *ARGS, *extra
    )
    assert code == 0, err
    return data


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "auto"])
def test_every_cpu_spelling_gives_the_same_figures_and_reports_the_device(
    cli, other, tiny_dir, tiny_text, device, monkeypatch
):
    import quantkit.evals.scorers.transformers_scorer as hf

    seen = []
    real = hf.load_model
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: seen.append(k["device"]) or real(*a, **k))
    ref = _eval(cli, other, tiny_dir, tiny_text, "--device", "cpu")
    seen.clear()
    data = _eval(cli, other, tiny_dir, tiny_text, "--device", device)
    assert (
        all(isinstance(d, torch.device) and d.type == "cpu" for d in seen) and seen
    )  # a torch.device reaches the loader
    assert data["device"]["type"] == "cpu" and data["device"]["name"] and data["device"]["dtype"] == "float32"
    assert data["dtype"] == "float32"  # the CPU's default
    assert data["texts"][0]["ppl"] == pytest.approx(ref["texts"][0]["ppl"], rel=1e-6)


@pytest.mark.parametrize("batch", ["1", "2", "5", "64"])
def test_batched_windows_score_like_one_at_a_time(cli, other, tiny_dir, tiny_text, batch):
    ref = _eval(cli, other, tiny_dir, tiny_text, "--batch-size", "1")
    data = _eval(cli, other, tiny_dir, tiny_text, "--device", "cpu:0", "--batch-size", batch)
    a, b = ref["texts"][0], data["texts"][0]
    assert data["scorer"]["batch_size"] == int(batch) and a["tokens"] == b["tokens"] == 5 * 31
    assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-5) and b["baseline_ppl"] == pytest.approx(
        a["baseline_ppl"], rel=1e-5
    )
    assert b["kld"]["mean"] == pytest.approx(a["kld"]["mean"], rel=1e-4, abs=1e-7)
    assert b["top1_agreement"] == a["top1_agreement"]


def test_dtype_override_and_its_own_baseline_cache(cli, other, tiny_dir, tiny_text):
    f32 = _eval(cli, other, tiny_dir, tiny_text)
    bf16 = _eval(cli, other, tiny_dir, tiny_text, "--dtype", "bfloat16")
    assert bf16["dtype"] == "bfloat16" and bf16["device"]["dtype"] == "bfloat16"
    assert bf16["texts"][0]["baseline_cached"] is False  # a bf16 baseline is another pass, not the float32 one
    assert bf16["texts"][0]["baseline_ppl"] != f32["texts"][0]["baseline_ppl"]
    assert bf16["texts"][0]["baseline_ppl"] == pytest.approx(f32["texts"][0]["baseline_ppl"], rel=0.05)


@pytest.mark.parametrize(
    "device,needle",
    [("cuda", "no CUDA GPU"), ("cuda:7", "no CUDA GPU"), ("tpu", "not a device"), ("meta", "not supported")],
)
def test_an_unavailable_device_is_one_line_before_anything_loads(
    cli, other, tiny_dir, tiny_text, device, needle, monkeypatch
):
    import quantkit.evals.eval_runner as runner
    import quantkit.evals.scorers.transformers_scorer as hf

    if torch.cuda.is_available() and device.startswith("cuda"):
        pytest.skip("this machine has a GPU")
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("loaded a model for an unavailable device"))
    monkeypatch.setattr(
        runner, "load_tokenizer", lambda *a, **k: pytest.fail("read the tokenizer for an unavailable device")
    )
    code, _, err, _ = cli(
        "eval", str(other), "--baseline", str(tiny_dir / "llama-gqa"), "--text", f"file:{tiny_text}", "--device", device
    )
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_batch_size_is_one_line(cli, other, tiny_dir, tiny_text):
    code, _, err, _ = cli(
        "eval",
        str(other),
        "--baseline",
        str(tiny_dir / "llama-gqa"),
        "--text",
        f"file:{tiny_text}",
        "--batch-size",
        "0",
    )
    assert code == 2 and "--batch-size must be at least 1, not 0" in err


def test_defaults_follow_the_device():
    assert default_dtype(torch.device("cpu")) == "float32"
    assert default_dtype(torch.device("cpu", 0)) == "float32"
    # a GPU's from its probed matmul rates (values: no GPU needed to check the rule)
    assert default_dtype(torch.device("cuda", 0), {"bfloat16": 700.0, "float32": 60.0}) == "bfloat16"
    assert default_dtype(torch.device("cuda", 0), {"bfloat16": 20.0, "float32": 14.0}) == "bfloat16"
    assert default_dtype(torch.device("cuda", 0), {"bfloat16": 2.0, "float32": 14.0}) == "float32"  # no bf16 units
    assert default_dtype(torch.device("cpu"), {"bfloat16": 9.0, "float32": 1.0}) == "float32"  # the CPU: float32


def test_gpu_batch_is_sized_to_free_memory(monkeypatch):
    import quantkit.evals.placement as devices  # placement imports free_bytes by name

    cfg = {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
    }  # Llama-3-8B
    per = window_bytes(cfg, 512, "bfloat16")
    assert 0.5e9 < per < 1.5e9  # ~0.6 GB of logits, float32 copy and log-softmax per 512-token window
    for free, expected in ((100e9, 32), (10e9, int(10e9 * 0.4 // per)), (0.1e9, 1)):
        monkeypatch.setattr(devices, "free_bytes", lambda d, f=free: int(f))
        assert default_batch_size(torch.device("cuda", 1), cfg, 512, 1000, "bfloat16") == expected
    monkeypatch.setattr(devices, "free_bytes", lambda d: int(1e12))
    assert default_batch_size(torch.device("cuda", 0), cfg, 512, 3, "bfloat16") == 3  # never more than the windows
    assert default_batch_size(torch.device("cpu", 0), cfg, 512, 1000, "float32") == 1


def test_lm_eval_tasks_run_on_the_eval_device(cli, tiny_dir, monkeypatch):
    import quantkit.evals.lmeval as lmeval

    seen = []
    real = lmeval._hf_lm
    monkeypatch.setattr(
        lmeval, "_hf_lm", lambda run, path, model, tok: seen.append(run.device) or real(run, path, model, tok)
    )
    code, _, err, data = cli(
        "eval",
        str(tiny_dir / "llama-mha"),
        "--baseline",
        str(tiny_dir / "llama-mha"),
        "--tasks",
        "qk_facts",
        "--limit",
        "4",
        "--device",
        "cpu:0",
        "--json",
    )
    assert code == 0, err
    assert data["tasks"]["qk_facts"]["n"] == 4 and data["tasks_backend"] == "hf"
    assert seen and all(d == torch.device("cpu", 0) for d in seen)
