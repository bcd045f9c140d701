"""Models larger than RAM: the offload plan, compressed-tensors' disk offloading through convert,
and the per-layer onload that keeps an offloaded model's fake quantization honest."""

import json

import pytest
from fixtures import RECIPES

from quantkit.errors import RecipeError
from quantkit.models.offload import OffloadPlan, parse_size, plan


def test_parse_size():
    assert parse_size("8GB") == 8 * 10**9 and parse_size("16GiB") == 16 * 2**30 and parse_size("1.5 mb") == 1_500_000
    assert parse_size("4096") == 4096
    for bad in ("", "-1GB", "0", "lots", "8XB"):
        with pytest.raises(RecipeError, match="--max-memory"):
            parse_size(bad)


def test_plan_offloads_only_what_does_not_fit():
    n = 1_000_000_000  # 1B parameters: 4 GB in float32, 2 GB in fp16
    assert plan(n, "float32", "float16", None, available=10 * 10**9) is None  # 4 GB <= 75% of 10 GB
    p = plan(n, "float32", "float16", None, available=5 * 10**9)
    assert p == OffloadPlan(cpu_bytes=int(5 * 10**9 * 0.75), model_bytes=2 * 10**9, dtype="float16")
    assert plan(n, "bfloat16", "bfloat16", 3 * 10**9, available=10**6) is None  # an explicit budget wins
    assert plan(n, "bfloat16", "bfloat16", 10**9, available=10**12).cpu_bytes == 10**9


def _convert(cli, tiny_llama, tiny_text, out, *extra, recipe="int4-w4a16-gptq-g64"):

    recipe = RECIPES / f"{recipe}.yaml"
    return cli(
        "convert",
        str(recipe),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        "calibration.samples=4",
        "--set",
        "calibration.seq_len=32",
        *extra,
        "--json",
    )


def test_convert_offloaded_to_disk_matches_in_ram(cli, tiny_llama, tiny_text, tmp_path):
    import torch

    from quantkit.artifacts.containers import CONTAINERS
    from quantkit.quantize.verify import compare_logits, logits

    code, _, err, gptq = _convert(cli, tiny_llama, tiny_text, tmp_path / "gptq", "--max-memory", "100KB")
    assert code == 0, err  # GPTQ through the sequential pipeline with most weights on disk
    assert gptq["offload"]["disk_tensors"] > 0 and gptq["verification"]["mean_kl"] < 1e-4
    code, _, err, ram = _convert(
        cli,
        tiny_llama,
        tiny_text,
        tmp_path / "ram",
        "--set",
        "calibration.compute_dtype=float32",
        recipe="int4-w4a16-rtn",
    )
    assert code == 0, err
    assert ram["offload"] is None
    code, _, err, disk = _convert(
        cli, tiny_llama, tiny_text, tmp_path / "disk", "--max-memory", "100KB", recipe="int4-w4a16-rtn"
    )
    assert code == 0, err
    assert (
        disk["offload"]["disk_tensors"] > 0
        and disk["offload"]["dtype"] == "float16"
        and disk["offload"]["cpu_bytes"] == 100_000
    )
    assert disk["verification"]["status"] == "passed" and disk["verification"]["mean_kl"] < 1e-4
    assert json.loads((tmp_path / "disk" / "quantkit.json").read_text())["offload"]["disk_tensors"] > 0
    assert not list(tmp_path.glob(".disk.offload-*")) and not list(tmp_path.glob(".disk.partial-*"))
    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(0))
    a, b = (logits(CONTAINERS["compressed-tensors"].load(tmp_path / n, "float16"), ids) for n in ("ram", "disk"))
    assert compare_logits(a, b)["mean_kl"] < 1e-5  # RTN from fp16 weights: the same grid in fp16 or fp32


def test_max_memory_refused_where_it_does_not_apply(cli, tiny_llama, tmp_path):

    recipe = RECIPES / "bnb-int8.yaml"
    code, _, err, _ = cli(
        "convert", str(recipe), "--model", str(tiny_llama), "--out", str(tmp_path / "x"), "--max-memory", "1GB"
    )
    assert code == 2 and "--max-memory applies to the llm-compressor methods" in err
    code, _, err, _ = cli(
        "convert", str(recipe), "--model", str(tiny_llama), "--out", str(tmp_path / "x"), "--max-memory", "lots"
    )
    assert code == 2 and "expected a positive size" in err


def test_offloaded_fake_quant_runs_quantized_weights(tiny_llama, tmp_path):
    """compressed-tensors 0.19 fault: a disk-offloaded layer re-reads its weight inside
    quantized_forward and runs unquantized; layer_at_a_time() must give the quantized logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from quantkit.methods.method_registry import METHODS
    from quantkit.models.offload import load
    from quantkit.quantize.verify import logits  # runs the forward inside offload.layer_at_a_time

    rtn = _rtn_cfg()
    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
    fp = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float16).eval()
    with torch.inference_mode():
        fp_logits = fp(input_ids=ids).logits.float()
    quantize = METHODS["rtn"].quantize
    ram = quantize(AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float16).eval(), rtn, None)
    disk = quantize(
        load(tiny_llama, OffloadPlan(cpu_bytes=10_000, model_bytes=0, dtype="float16"), tmp_path / "off"), rtn, None
    )
    want = logits(ram, ids)
    assert (want - fp_logits).abs().max() > 1e-2  # quantization shows in the logits
    assert torch.allclose(logits(disk, ids), want, atol=1e-3)


def _rtn_cfg():
    from quantkit.methods.configs import RTNConfig

    return RTNConfig(method="rtn", bits=4, group_size=32, symmetric=True)
