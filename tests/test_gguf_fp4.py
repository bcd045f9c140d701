"""FP4 artifacts to GGUF (gguf/grids.py, tensor_map.py, tensors.py): MXFP4 exactly to GGUF's MXFP4 (every
tensor dequantized by gguf-py equals the artifact's decompressed weight, max |diff| 0) and served by
llama.cpp; NVFP4 exactly to GGUF's NVFP4 where the per-tensor global scale allows (a power of two),
otherwise refused with what differs, or with --allow-lossy mapped as llama.cpp's own converter maps
it and its KL reported."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_helpers import artifact_weights, gguf_tensors, hf_name_map, rerecord
from installed import needs_llama_cpp

from quantkit.gguf import grids

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fp4(tiny_dir, tmp_path_factory) -> dict[str, Path]:
    """format -> the tiny Llama (GQA) and Qwen2 (q/k/v biases) converted with the built-in FP4 recipe."""
    from click.testing import CliRunner

    from quantkit.cli import cli as group

    root, arts = tmp_path_factory.mktemp("fp4-gguf"), {}
    for name, (fixture, recipe) in {
        "mxfp4": ("llama-gqa", "mxfp4-w4a16"),
        "nvfp4": ("llama-gqa", "nvfp4-w4a16"),
        "mxfp4-qwen2": ("qwen2", "mxfp4-w4a16"),
    }.items():
        res = CliRunner().invoke(
            group,
            ["convert", recipe, "--model", str(tiny_dir / fixture), "--out", str(root / name), "--json"],
            catch_exceptions=False,
            env={"QUANTKIT_HOME": str(root / "home")},
        )
        assert res.exit_code == 0, res.stderr
        arts[name] = root / name
    return arts


def export(cli, artifact: Path, out: Path, *extra: str):
    return cli("export", str(artifact), "--format", "gguf", "--out", str(out), *extra, "--json")


def with_power_of_two_global_scales(src: Path, out: Path) -> Path:
    """A copy of an NVFP4 artifact whose global scales are each rounded to a power of two (a valid
    NVFP4 artifact: its weights are then q * s / 2^k), manifest re-recorded."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    for shard in out.glob("*.safetensors"):
        tensors = load_file(str(shard))
        for k, v in tensors.items():
            if k.endswith("weight_global_scale"):
                tensors[k] = torch.exp2(torch.round(torch.log2(v)))
        save_file(tensors, str(shard), metadata={"format": "pt"})
    return rerecord(out)


# ---- the pure mapping ------------------------------------------------------------------------


def test_mxfp4_blocks_hold_the_codes_and_exponents_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (6, 128), generator=g, dtype=torch.uint8)
    e = torch.randint(100, 140, (6, 4), generator=g, dtype=torch.uint8)
    e[0, 0], e[1, 1] = 0, 1  # 2^-127 and 2^-126: gguf-py's denormal branch
    data = grids.pack_mxfp4(codes, e)
    assert data.shape == (6, 4 * 17)  # ggml-common.h: block_mxfp4 is 1 + 16 bytes per 32 values
    back = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.MXFP4)
    want = grids.fp4_weight(codes, grids.e8m0_values(e), 32)
    assert np.array_equal(back.astype(np.float64), want.numpy())


def test_mxfp4_nibble_order_is_ggmls():
    """compressed-tensors pairs columns (2k, 2k+1) in a byte; ggml pairs j and j + 16 within a block."""
    codes = torch.arange(32, dtype=torch.uint8).reshape(1, 32) % 16
    data = grids.pack_mxfp4(codes, torch.tensor([[127]], dtype=torch.uint8))
    assert data[0, 0] == 127 and list(data[0, 1:3]) == [0 | 0 << 4, 1 | 1 << 4]  # value 16 is code 0 again


def test_nvfp4_blocks_hold_the_codes_and_e4m3_scales_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (4, 128), generator=g, dtype=torch.uint8)
    scale_bits = torch.randint(1, 0x7F, (4, 8), generator=g, dtype=torch.uint8)  # positive E4M3, subnormals too
    data = grids.pack_nvfp4(codes, scale_bits)
    assert data.shape == (4, 2 * 36)  # ggml-common.h: block_nvfp4 is 4 scales + 32 bytes per 64 values
    back = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.NVFP4)
    want = grids.fp4_weight(codes, grids.e4m3_values(scale_bits), 16)
    assert np.array_equal(back.astype(np.float64), want.numpy())


def test_a_global_scale_is_exact_in_llama_cpp_only_as_a_power_of_two():
    assert grids.power_of_two(4096.0) and grids.inverse_f32(4096.0) * 4096.0 == 1.0
    assert not grids.power_of_two(7552.0) and grids.inverse_f32(7552.0) * 7552.0 != 1.0
    assert not grids.power_of_two(float("inf")) and not grids.power_of_two(0.0)


# ---- MXFP4: exact ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mxfp4", "mxfp4-qwen2"])
def test_mxfp4_exports_exactly(cli, fp4, tmp_path, name):
    out = tmp_path / f"{name}.gguf"
    code, _, err, rec = export(cli, fp4[name], out)
    assert code == 0, err
    assert rec["lossless"] is True and rec["lossy_tensors"] == []
    assert rec["tensor_types"]["MXFP4"] == 14 and rec["verification"]["max_abs_diff_exact"] == 0.0
    assert rec["mapping"][-1] == {"mapping": "MXFP4 (E2M1, E8M0 scale per 32) -> MXFP4", "tensors": 14, "exact": True}
    # gguf-py's dequantization, q/k rows un-permuted, against transformers + compressed-tensors' decompression
    ours = gguf_tensors(out, hf_name_map(rec))
    ref = artifact_weights(fp4[name], torch.float32)
    assert max(float((ours[k] - ref[k]).abs().max()) for k in ours) == 0.0
    assert gguf.GGUFReader(str(out)).fields["general.file_type"].parts[-1][0] == gguf.LlamaFileType.MOSTLY_MXFP4_MOE


# ---- NVFP4: exact only with a power-of-two global scale ---------------------------------------


def test_nvfp4_is_refused_and_says_what_differs(cli, fp4, tmp_path):
    out = tmp_path / "nv.gguf"
    code, _, err, _ = export(cli, fp4["nvfp4"], out)
    assert code == 2 and not out.exists()
    for needle in (
        "compressed-tensors computes w = q * s / g",
        "llama.cpp multiplies each matmul's output by the tensor's F32 .scale",
        "1/g has no float32 value (g is not a power of two",
        "the codes and E4M3 block scales carry over bit for bit",
        "--allow-lossy",
    ):
        assert needle in err, err


def test_nvfp4_with_power_of_two_global_scales_exports_exactly(cli, fp4, tmp_path):
    art = with_power_of_two_global_scales(fp4["nvfp4"], tmp_path / "art")
    out = tmp_path / "nv.gguf"
    code, _, err, rec = export(cli, art, out)
    assert code == 0, err
    assert rec["lossless"] is True and rec["tensor_types"] == {"F16": 1, "F32": 5 + 14, "NVFP4": 14}
    assert rec["verification"]["max_abs_diff_exact"] == 0.0
    tensors = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    ref = artifact_weights(art, torch.float32)
    for t in rec["tensors"]:
        if t["type"] != "NVFP4":
            continue
        w = gguf.quants.dequantize(tensors[t["name"]].data, gguf.GGMLQuantizationType.NVFP4)
        scale = tensors[t["name"].replace(".weight", ".scale")].data
        got = torch.from_numpy(np.asarray(w, dtype=np.float32) * scale[0])
        want = ref[t["source"]]
        got = (
            grids.rope_unpermute(got.reshape(want.shape), t["rope_permuted_heads"]) if t["rope_permuted_heads"] else got
        )
        assert torch.equal(got.reshape(want.shape), want), t["name"]


def test_nvfp4_allow_lossy_maps_it_as_llama_cpp_does_and_reports_the_kl(cli, fp4, tmp_path):
    out = tmp_path / "nv.gguf"
    code, _, err, rec = export(cli, fp4["nvfp4"], out, "--allow-lossy")
    assert code == 0, err
    assert rec["lossless"] is False and rec["tensor_types"]["NVFP4"] == 14
    lossy = {t["tensor"]: t for t in rec["lossy_tensors"]}
    assert len(lossy) == 28  # each weight and its .scale
    assert all(t["rel_rmse"] < 1e-7 for t in lossy.values())  # 1/g's float32 rounding, nothing else
    assert 0 <= rec["kl_vs_artifact"]["mean_kl"] < 1e-6, rec["kl_vs_artifact"]


def test_nvfp4_columns_ggml_blocks_do_not_divide_are_refused(cli, tiny_dir, tmp_path):
    """NVFP4 groups of 16 fit a down_proj of 80 columns; ggml's NVFP4 blocks of 64 do not."""
    from fixtures import build_checkpoint

    src = build_checkpoint(tmp_path / "odd", "llama-gqa", tiny_dir / "tokenizer", intermediate_size=80)
    art = tmp_path / "art"
    assert cli("convert", "nvfp4-w4a16", "--model", str(src), "--out", str(art))[0] == 0
    code, _, err, _ = export(cli, art, tmp_path / "nv.gguf", "--allow-lossy")
    assert code == 2 and "80 input columns are not a multiple of 64, ggml's NVFP4 block" in err, err


# ---- llama.cpp runs them -------------------------------------------------------------------------


def agreement():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gguf_logits_agreement", REPO / "benchmarks" / "gguf_logits_agreement.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@needs_llama_cpp
@pytest.mark.parametrize("name,extra", [("mxfp4", ()), ("nvfp4", ("--allow-lossy",))])
def test_llama_cpp_runs_the_fp4_export_with_only_its_activation_rounding(cli, fp4, tmp_path, tiny_text, name, extra):
    """MXFP4 and NVFP4 matmuls take Q8_0 activations on the CPU (ggml-cpu.c): llama.cpp's logits are
    the artifact's up to that rounding, and equal the simulation of it at the first position."""
    from quantkit.models.checkpoint import load_tokenizer

    out = tmp_path / f"{name}.gguf"
    assert export(cli, fp4[name], out, *extra)[0] == 0
    ids = load_tokenizer(fp4[name])(tiny_text.read_text()[:1536], add_special_tokens=False)["input_ids"][:128]
    r = agreement().measure(fp4[name], out, ids)
    assert r["engines"]["mean"] < 1e-3 and r["same_prefix"] >= 1, r
    assert r["engines"]["mean"] < 3 * r["simulated"]["mean"], r


@needs_llama_cpp
def test_eval_and_bench_run_the_mxfp4_gguf_in_llama_cpp(cli, fp4, tiny_dir, tiny_text, tmp_path):
    out = tmp_path / "mx.gguf"
    assert export(cli, fp4["mxfp4"], out)[0] == 0
    code, _, err, ev = cli(
        "eval", str(out), "--baseline", str(tiny_dir / "llama-gqa"), "--engine", "llamacpp",
        "--text", f"file:{tiny_text}", "--seq-len", "64", "--max-tokens", "512", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert ev["scorer"]["dtype"].startswith("MXFP4") and 0 < ev["texts"][0]["kld"]["mean"] < 1, ev
    fast = ["--prompt-len", "16", "--gen-len", "4", "--repeats", "1", "--min-seconds", "0", "--warmups", "1"]
    code, _, err, b = cli("bench", str(out), "--engine", "llamacpp", *fast, "--json")
    assert code == 0, err
    assert b["device"]["dtype"].startswith("MXFP4"), b
    assert json.loads((tmp_path / "mx.quantkit.json").read_text())["lossless"] is True
