"""`quantkit convert --device`: the calibration device is a torch.device carried through every path
(llm-compressor's layer-by-layer pipeline, GQA's statistics and recovery, bitsandbytes, the reload
check), with `cpu`, `cpu:0` and `auto`, so a GPU run takes no code path these tests skip."""

import json

import pytest
import torch
from fixtures import RECIPES

SMALL = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]


def convert(cli, recipe, model, out, text, *extra):
    return cli(
        "convert",
        str(RECIPES / f"{recipe}.yaml"),
        "--model",
        str(model),
        "--out",
        str(out),
        "--calib",
        f"file:{text}",
        *SMALL,
        *extra,
        "--json",
    )


@pytest.fixture
def onloads(monkeypatch):
    """Every device llm-compressor's pipelines and quantkit's reload check onload a model to.

    llm-compressor's own choice is replaced by one that cannot run (the meta device), as on a
    machine where it would pick another device than the user's: only quantkit's device may reach
    the pipelines."""
    import compressed_tensors.offload as ct_offload
    import llmcompressor.pipelines.data_free.pipeline as data_free
    import llmcompressor.pipelines.sequential.pipeline as sequential
    import llmcompressor.utils.dev as dev

    seen = []
    original = ct_offload.set_onload_device

    def spy(model, device):
        seen.append(torch.device(device))
        return original(model, device)

    for mod in (sequential, data_free, ct_offload):
        monkeypatch.setattr(mod, "set_onload_device", spy)
    for mod in (dev, sequential, data_free):
        monkeypatch.setattr(mod, "get_main_device", lambda: torch.device("meta"))
    return seen


@pytest.mark.parametrize("spec,expected", [("cpu", "cpu"), ("cpu:0", "cpu:0"), ("auto", "cpu")])
@pytest.mark.parametrize("recipe", ["int4-w4a16-rtn", "int4-w4a16-gptq-g64"])
def test_llmcompressor_calibrates_on_the_given_device(
    cli, tiny_llama, tiny_text, tmp_path, onloads, spec, expected, recipe
):
    out = tmp_path / "art"
    code, _, err, data = convert(cli, recipe, tiny_llama, out, tiny_text, "--device", spec)
    assert code == 0, err
    # compressed-tensors takes the CPU without an index (offload.plain_cpu); llm-compressor's own
    # choice is unusable here, so every onload came from quantkit
    assert onloads and all(d == torch.device("cpu") for d in onloads), onloads  # pipeline and reload check alike
    assert len(onloads) >= 2  # the calibration pipeline, then the artifact's reload
    meta = json.loads((out / "quantkit.json").read_text())
    assert meta["device"]["device"] == expected and meta["device"]["type"] == "cpu" and meta["device"]["name"]
    # 4-bit weights calibrate in float32 on the CPU, whatever its bf16 rate (quantize/job.py calib_precision)
    assert meta["device"]["dtype"] == "float32" and meta["verification"]["mean_kl"] <= 1e-3
    assert meta["device"]["dtype_reason"].startswith("float32 on the CPU")
    assert meta["recipe"]["calibration"]["device"] == spec
    assert data["device"] == meta["device"]


def test_indexed_cpu_is_plain_for_compressed_tensors():
    from quantkit.models.offload import plain_cpu

    assert plain_cpu(torch.device("cpu", 0)) == torch.device("cpu")
    assert plain_cpu(torch.device("cuda", 1)) == torch.device(
        "cuda", 1
    )  # a GPU keeps its index (no CUDA needed to build it)


def test_patch_is_undone_even_on_failure():
    import llmcompressor.pipelines.sequential.pipeline as sequential
    import llmcompressor.utils.dev as dev

    from quantkit.models.offload import calibration_device

    before = (dev.get_main_device, sequential.get_main_device)
    with pytest.raises(RuntimeError):
        with calibration_device(torch.device("cpu", 0)):
            assert sequential.get_main_device() == torch.device("cpu") and dev.get_main_device() == torch.device("cpu")
            raise RuntimeError("boom")
    assert (dev.get_main_device, sequential.get_main_device) == before


def test_recipe_key_and_cli_override(cli, tiny_llama, tiny_text, tmp_path, onloads):
    out = tmp_path / "art"
    code, _, err, data = convert(cli, "int4-w4a16-rtn", tiny_llama, out, tiny_text, "--set", "calibration.device=cpu:0")
    assert code == 0, err
    assert data["device"]["device"] == "cpu:0" and set(onloads) == {torch.device("cpu")}
    code, _, err, data = convert(
        cli,
        "int4-w4a16-rtn",
        tiny_llama,
        out,
        tiny_text,
        "--set",
        "calibration.device=cuda:3",
        "--device",
        "cpu",
        "--force",
    )
    assert code == 0, err  # --device wins over the recipe
    assert data["device"]["device"] == "cpu" and data["recipe"]["calibration"]["device"] == "cpu"


def test_gqa_statistics_and_recovery_on_the_device(cli, tiny_llama, tiny_text, tmp_path):
    rec = "{tokens: 1024, max_minutes: 5, seq_len: 32, batch_size: 4, eval_every: 4, heldout_windows: 2}"
    code, _, err, data = convert(
        cli,
        "gqa",
        tiny_llama,
        tmp_path / "a",
        tiny_text,
        "--device",
        "cpu:0",
        "--set",
        "steps[0].gqa.kv_heads=1",
        "--set",
        f"steps[0].gqa.recover={rec}",
    )
    assert code == 0, err
    assert data["device"]["device"] == "cpu:0" and data["device"]["dtype"] == "float32"
    assert data["gqa"]["kv_heads_after"] == 1 and data["gqa"]["recover"]["steps"] == 8
    assert data["verification"]["mean_kl"] <= 1e-3


def test_bitsandbytes_quantizes_onto_the_device(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    import transformers

    seen = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    code, _, err, data = convert(cli, "bnb-nf4", tiny_llama, tmp_path / "a", tiny_text, "--device", "cpu:0")
    assert code == 0, err
    assert data["device"]["device"] == "cpu:0" and data["verification"]["status"] == "passed"
    # bitsandbytes quantizes onto the device as it loads, and the reload check loads there too
    assert [torch.device(d) for d in seen if d is not None].count(torch.device("cpu", 0)) >= 2, seen


@pytest.mark.parametrize(
    "spec,message",
    [
        ("cuda", "no CUDA GPU is available"),
        ("cuda:7", "no CUDA GPU is available"),
        ("mps", "not supported"),  # a torch device type quantkit does not run on
        ("tpu", "not a device"),  # not a torch device type at all
        ("gpu0", "not a device"),
    ],
)
def test_unavailable_device_is_one_line_before_loading(
    cli, tiny_llama, tiny_text, tmp_path, monkeypatch, spec, message
):
    import quantkit.models.checkpoint as models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(models, "checkpoint_hash", lambda *a, **k: pytest.fail("checkpoint hashed"))
    out = tmp_path / "art"
    code, _, err, _ = convert(cli, "int4-w4a16-gptq-g64", tiny_llama, out, tiny_text, "--device", spec)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob(".art.*"))


def test_missing_gpu_index_names_the_count(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, tmp_path / "art", tiny_text, "--device", "cuda:7")
    assert code == 2 and "has 1 CUDA GPU (cuda:0..cuda:0)" in err


def test_bad_recipe_device_names_the_key(cli, tiny_llama, tiny_text, tmp_path):
    code, _, err, _ = convert(
        cli, "int4-w4a16-rtn", tiny_llama, tmp_path / "art", tiny_text, "--set", "calibration.device=gpu"
    )
    assert code == 2 and "calibration.device" in err
