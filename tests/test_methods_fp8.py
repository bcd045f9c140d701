"""FP8 through llm-compressor (methods/llmc.py fp8): the two built-in recipes convert the tiny
fixture without calibration, the artifact reloads in transformers on the CPU computing what an
FP8 checkpoint means, its sizes read ~8 bits per weight, eval runs on it, and bench says what it
times where the device has no FP8 matmul."""

import json
from pathlib import Path

import pytest
import torch

from quantkit.bench import kernels

SCHEMES = {"w8a8": "fp8-w8a8-dynamic", "w8a16": "fp8-w8a16"}
FAST = ["--prompt-len", "16", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "1"]
E4M3_MAX = 448.0  # OCP FP8 E4M3's largest finite value


@pytest.fixture(scope="module")
def fp8_arts(tiny_llama, tmp_path_factory):
    """scheme -> the tiny Llama converted with that built-in FP8 recipe, and its quantkit.json."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    root, arts = tmp_path_factory.mktemp("fp8"), {}
    for scheme, recipe in SCHEMES.items():
        out = root / scheme
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("QUANTKIT_HOME", str(root / "home"))
            res = CliRunner().invoke(
                group,
                ["convert", recipe, "--model", str(tiny_llama), "--out", str(out), "--json"],
                catch_exceptions=False,
            )
        assert res.exit_code == 0, res.stderr
        arts[scheme] = (out, json.loads(res.stdout))
    return arts


def _tensors(art: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(art.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _round_rows_fp8(x: torch.Tensor) -> torch.Tensor:
    """Each row's absmax onto E4M3's largest value, rounded to E4M3 and back (the FP8_DYNAMIC activations)."""
    scale = x.abs().amax(-1, keepdim=True) / E4M3_MAX
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale


# ---- the recipe ------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
def test_recipe_scheme_reads_and_dumps_under_its_key(scheme):
    from quantkit.recipe.files import recipe_from_dict

    cfg = recipe_from_dict({"steps": [{"quantize": {"method": "fp8", "scheme": scheme}}]}).steps[0].quantize
    assert (cfg.scheme, cfg.weight_bits, cfg.storage_group, cfg.ignore) == (
        f"FP8-{scheme.upper()}",
        8,
        -1,
        ("lm_head",),
    )
    assert cfg.model_dump(mode="json") == {"method": "fp8", "scheme": scheme, "ignore": ["lm_head"]}


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"scheme": "w4a16"}, r"quantize\.scheme: must be one of 'w8a8' or 'w8a16'"),
        ({"fp8_scheme": "w8a8"}, r"quantize\.fp8_scheme: unknown key"),
        ({"bits": 4}, r"quantize\.bits: unknown key"),
    ],
)
def test_recipe_refuses_what_fp8_does_not_take(bad, message):
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import recipe_from_dict

    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"steps": [{"quantize": {"method": "fp8", **bad}}]})


def test_builtin_recipes_need_no_calibration_text(cli, tiny_llama, tmp_path):
    for scheme, recipe in SCHEMES.items():
        code, _, err, plan = cli(
            "convert", recipe, "--model", str(tiny_llama), "--out", str(tmp_path / scheme), "--plan", "--json"
        )
        assert code == 0 and plan["fits"] and "calibration_forward" not in plan["time_breakdown"], err
        assert not (tmp_path / scheme).exists()


# ---- convert: the artifact and its reload --------------------------------------------------


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
def test_convert_writes_fp8_weights_and_describes_the_scheme(fp8_arts, tiny_llama, scheme):
    art, meta = fp8_arts[scheme]
    q = meta["quantization"]
    assert (q["format"], q["method"], q["scheme"], q["weight_bits"], q["weight_type"]) == (
        "compressed-tensors",
        "fp8",
        f"FP8-{scheme.upper()}",
        8,
        "float8_e4m3fn",
    )
    assert q["activations"] == ("float8_e4m3fn per token, dynamic" if scheme == "w8a8" else "16-bit")
    assert meta["calibration"] is None and meta["recipe"]["steps"] == [
        {"quantize": {"method": "fp8", "scheme": scheme, "ignore": ["lm_head"]}}
    ]
    v = meta["verification"]
    assert (
        v["status"] == "passed"
        and v["mean_kl"] <= v["threshold_mean_kl"]
        and v["loader"] == "transformers + compressed-tensors"
    )

    qcfg = json.loads((art / "config.json").read_text())["quantization_config"]
    (group,) = qcfg["config_groups"].values()
    assert qcfg["format"] == "float-quantized" and qcfg["ignore"] == ["lm_head"]
    assert {k: group["weights"][k] for k in ("type", "num_bits", "strategy", "dynamic")} == {
        "type": "float",
        "num_bits": 8,
        "strategy": "channel",
        "dynamic": False,
    }
    acts = group["input_activations"]
    assert (
        acts is None
        if scheme == "w8a16"
        else {k: acts[k] for k in ("type", "num_bits", "strategy", "dynamic")}
        == {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": True}
    )

    saved, source = _tensors(art), _tensors(tiny_llama)
    layer_weights = [k for k in saved if ".layers." in k and k.endswith("proj.weight")]
    assert layer_weights and all(saved[k].dtype == torch.float8_e4m3fn for k in layer_weights)
    assert not any(
        k.endswith(("input_scale", "weight_zero_point")) for k in saved
    )  # dynamic scales and symmetric: nothing stored
    for k in layer_weights:
        w, s = source[k].float(), saved[k[: -len("weight")] + "weight_scale"].float()
        assert s.shape == (w.shape[0], 1)
        assert torch.allclose(
            s, w.abs().amax(1, keepdim=True) / E4M3_MAX, rtol=2e-3
        )  # static: one scale per output channel
        err = (saved[k].float() * s - w).abs()
        assert bool(
            (err <= w.abs() * 2**-4 * 1.01 + s * 2**-9).all()
        )  # half an E4M3 step (3 mantissa bits), subnormals included
    for k in source:
        if ".layers." not in k or not k.endswith("proj.weight"):
            assert torch.equal(saved[k], source[k]), k  # embeddings, norms (and a separate lm_head) untouched


def _reference_fp8(source: Path, art: Path, dynamic: bool):
    """The source model with each quantized linear's weight replaced by the artifact's FP8 values
    times their scales, and for w8a8 its input rounded to FP8 per token: what the checkpoint means,
    written without compressed-tensors."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    saved = _tensors(art)
    for name, mod in model.named_modules():
        if name + ".weight_scale" in saved:
            mod.weight.data = saved[name + ".weight"].float() * saved[name + ".weight_scale"].float()
            if dynamic:
                mod.register_forward_pre_hook(lambda _, args: (_round_rows_fp8(args[0]),))
    return model


def test_transformers_on_cpu_dequantizes_weights_and_rounds_activations_per_token(fp8_arts, tiny_llama):
    """transformers (with compressed-tensors' loader) on the CPU: FP8 weights times their scales in
    the load dtype, and under w8a8 each linear's input rounded to FP8 per token; w8a16 does not round."""
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 384, (1, 48), generator=torch.Generator().manual_seed(0))
    got = {}
    for scheme, (art, _) in fp8_arts.items():
        reload = AutoModelForCausalLM.from_pretrained(str(art), dtype=torch.float32, device_map="cpu").eval()
        with torch.no_grad():
            got[scheme] = reload(ids).logits
            for dynamic in (True, False):
                expected = _reference_fp8(tiny_llama, art, dynamic)(ids).logits
                close = torch.allclose(got[scheme], expected, atol=1e-5, rtol=0)
                assert close == (dynamic == (scheme == "w8a8")), (scheme, dynamic)
    assert not torch.allclose(got["w8a8"], got["w8a16"], atol=1e-3)  # the activation rounding is on in w8a8 only


# ---- sizes, eval ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
def test_sizes_count_one_byte_per_weight_plus_channel_scales(fp8_arts, scheme):
    """bits/weight read from the artifact's headers equals the roofline's 8-bit per-channel layout
    (1 byte per weight, a 16-bit scale per output channel), ~8.1 on the tiny shapes."""
    from quantkit.core.roofline import Shape, quantized_layout
    from quantkit.models.sizes import checkpoint_sizes

    art, _ = fp8_arts[scheme]
    shape = Shape.from_config(json.loads((art / "config.json").read_text()))
    fmt = quantized_layout(8, -1).linear
    expected = (
        8
        * shape.layers
        * sum(fmt.bytes_for(o, i) for o, i in shape.linears().values())
        / (shape.layers * shape.layer_linear_params())
    )
    bits = checkpoint_sizes(art).bits_per_weight
    assert bits == pytest.approx(expected, rel=1e-12) and 8.0 < bits < 8.2


def test_eval_scores_the_fp8_artifact(cli, fp8_arts, tiny_llama, tiny_text):
    for scheme, (art, _) in fp8_arts.items():
        code, _, err, data = cli(
            "eval",
            str(art),
            "--baseline",
            str(tiny_llama),
            "--text",
            f"file:{tiny_text}",
            "--seq-len",
            "64",
            "--max-tokens",
            "256",
            "--json",
        )
        assert code == 0, err
        (row,) = data["texts"]
        assert row["tokens"] > 0 and 0 < row["kld"]["mean"] < 0.1 and row["ppl"] > 1, (
            scheme
        )  # quantized: not the baseline, not broken


# ---- bench ---------------------------------------------------------------------------------


def _fake_probe(device, threads=None):
    return {
        "device": str(device),
        "name": "fake cpu",
        "threads": 2,
        "read_gbps": 20.0,
        "copy_gbps": 10.0,
        "bf16_matmul_tflops": 1.0,
        "matmul_tflops": {"bfloat16": 1.0, "float32": 0.2},  # a CPU with bf16 arithmetic: the engine runs bf16
        "llc_bytes": None,
        "measured_at": "now",
        "method": "injected",
    }


def test_bench_on_cpu_states_what_it_times_and_counts_those_bytes(cli, fp8_arts, tiny_llama, monkeypatch):
    """No FP8 matmul on the CPU: the row says the weights were dequantized to bf16 (JSON `emulated`,
    its flag, a note in the text), its bytes per token are the 16-bit model's, and so is its roofline."""
    import quantkit.bench.probe as probing

    monkeypatch.setattr(probing, "run_probe", _fake_probe)
    arts = [str(fp8_arts[s][0]) for s in SCHEMES]
    code, _, err, data = cli("bench", str(tiny_llama), *arts, *FAST, "--engine", "eager", "--device", "cpu", "--json")
    assert code == 0, err
    dense, *fp8 = data["rows"]
    assert dense["emulated"] is None and "emulated" not in dense["flags"]
    for row in fp8:
        assert (
            "no FP8" in row["emulated"] and "dequantized to bfloat16" in row["emulated"] and "emulated" in row["flags"]
        )
        assert row["emulated"] in row["notes"] and "bfloat16 weights dequantized from FP8" in row["kernel"]
        assert row["weight_bytes_per_token"] == dense["weight_bytes_per_token"]  # bf16's 2 bytes a weight, as timed
        assert row["predicted_tpot_ms"] == pytest.approx(dense["predicted_tpot_ms"])
        assert row["self_check"]["status"] == "passed"
    code, out, err, _ = cli("bench", arts[0], *FAST, "--engine", "eager", "--device", "cpu")
    assert code == 0 and "FP8 is not timed as FP8 on cpu" in out and "not FP8's 1 byte" in out, err


@pytest.mark.parametrize("rows", [1, 40])
def test_fp8_kernel_path_matches_the_emulation(rows):
    """The layer's two paths differ only in the stored weight and the matmul call: torch._scaled_mm
    (run here through torch's CPU implementation, rows padded to 16) equals the dequantized GEMM."""
    torch.manual_seed(0)
    n, k = 48, 64
    w = torch.randn(n, k) * 0.05
    scale = w.abs().amax(1, keepdim=True) / E4M3_MAX
    q = (w / scale).to(torch.float8_e4m3fn)
    bias = torch.randn(n)
    x = torch.randn(2, rows, k)
    kernel = kernels.Fp8Linear(q, scale, bias, "cpu", dynamic=True, dtype=torch.float32, use_kernel=True)
    emulated = kernels.Fp8Linear(q, scale, bias, "cpu", dynamic=True, dtype=torch.float32, use_kernel=False)
    expected = _round_rows_fp8(x) @ (q.float() * scale).t() + bias
    assert kernel.emulated is None and emulated.emulated
    for layer in (kernel, emulated):
        assert torch.allclose(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert kernel.weight_t.dtype == torch.float8_e4m3fn and emulated.weight.dtype == torch.float32


def test_fp8_kernel_only_where_the_device_has_fp8_matmuls(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert kernels.fp8_kernel_missing(cuda, True, 64, 128) is None
    assert "multiple of 16" in kernels.fp8_kernel_missing(cuda, True, 64, 120)
    assert "W8A16" in kernels.fp8_kernel_missing(cuda, False, 64, 128)  # no FP8 weight-only matmul in torch
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert "compute capability 8.6" in kernels.fp8_kernel_missing(cuda, True, 64, 128)
    assert "on cpu" in kernels.fp8_kernel_missing(torch.device("cpu"), True, 64, 128)
