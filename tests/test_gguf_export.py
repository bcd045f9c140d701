"""quantkit export --format gguf on the tiny fixtures: exactness, metadata, refusals, transactions.

Exactness is checked three ways: (1) each GGUF tensor dequantized with `gguf.quants.dequantize`
and un-permuted equals the artifact's weight as compressed-tensors decompresses it, max |diff| 0;
(2) transformers' own GGUF loader (an independent reverse mapping, q/k un-permuting included)
reads the same weights; (3) the artifact's logits in transformers equal those of the GGUF weights.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from fixtures import CALIB_DATA, RECIPES, build_checkpoint
from gguf_helpers import artifact_weights, craft_artifact, gguf_tensors, hf_name_map, rerecord
from installed import needs_llama_cpp, require_llama_cpp

REPO = Path(__file__).resolve().parents[1]
SMALL_CALIB = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]

# name -> (fixture, recipe, extra --set, expected GGUF type of the linear layers)
ARTIFACTS = {
    "rtn-g32-mha": ("llama-mha", "int4-w4a16-rtn", ["steps[0].quantize.group_size=32"], "Q4_0"),
    "gptq-g64-gqa": ("llama-gqa", "int4-w4a16-gptq-g64", [], "Q4_0"),  # static act-order (the recipe default)
    "rtn-channel-qwen2": ("qwen2", "int4-w4a16-rtn", ["steps[0].quantize.group_size=-1"], "Q4_0"),
    "int8-mistral": ("mistral", "int8-w8a16-gptq", [], "Q8_0"),
    "w8a8-gqa": ("llama-gqa", "int8-w8a8-smoothquant", [], "Q8_0"),
    "rtn-g128-untied": ("llama-untied", "int4-w4a16-rtn", ["steps[0].quantize.group_size=128"], "Q4_0"),
    # SpinQuant R1/R2 fused into the weights: a plain model to llama.cpp (transform_config weight_* only)
    "spin-gptq-gqa": ("llama-gqa", "int4-w4a16-spinquant-gptq-g64", [], "Q4_0"),
}


def run_cli(home: Path, *args: str):
    from quantkit.cli import cli as group

    result = CliRunner().invoke(
        group, list(args), catch_exceptions=False, env={"QUANTKIT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    )
    data = json.loads(result.stdout) if "--json" in args and result.exit_code == 0 else None
    return result.exit_code, result.stdout, result.stderr, data


@pytest.fixture(scope="session")
def models(tiny_dir, tmp_path_factory) -> dict[str, Path]:
    """The tiny fixtures plus an untied-embedding Llama and a bfloat16 one."""
    out = {name: tiny_dir / name for name in ("llama-mha", "llama-gqa", "mistral", "qwen2")}
    root = tmp_path_factory.mktemp("gguf-models")
    out["llama-untied"] = untied_llama(build_checkpoint(root / "untied", "llama-mha", tiny_dir / "tokenizer", seed=3))
    out["llama-bf16"] = build_checkpoint(root / "bf16", "llama-gqa", tiny_dir / "tokenizer", seed=4, dtype="bfloat16")
    return out


def untied_llama(path: Path) -> Path:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float16)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.08)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def artifacts(models, tiny_text, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-artifacts")
    built = {}
    for name, (model, recipe, sets, _) in ARTIFACTS.items():
        extra = [a for s in sets for a in ("--set", s)]
        code, _, err, _ = run_cli(
            root / "home",
            "convert",
            str(RECIPES / f"{recipe}.yaml"),
            "--model",
            str(models[model]),
            "--out",
            str(root / name),
            "--calib",
            f"file:{tiny_text}",
            *SMALL_CALIB,
            *extra,
            "--json",
        )
        assert code == 0, f"{name}: {err}"
        built[name] = root / name
    return built


def export(cli, artifact: Path, out: Path, *extra: str):
    return cli("export", str(artifact), "--format", "gguf", "--out", str(out), *extra, "--json")


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))[:4]
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("name", list(ARTIFACTS))
def test_quantized_artifact_exports_exactly(cli, artifacts, tmp_path, name):
    art, out = artifacts[name], tmp_path / f"{name}.gguf"
    code, _, err, rec = export(cli, art, out)
    assert code == 0, err
    expected_type = ARTIFACTS[name][3]
    assert rec["lossless"] is True and rec["lossy_tensors"] == []
    assert rec["tensor_types"][expected_type] == 14  # 2 layers x (q, k, v, o, gate, up, down)
    assert rec["verification"]["max_abs_diff_exact"] == 0.0
    assert all(m["exact"] for m in rec["mapping"])
    # (1) gguf.quants.dequantize of every tensor, q/k rows un-permuted, vs compressed-tensors' decompression
    ours = gguf_tensors(out, hf_name_map(rec))
    ref = artifact_weights(art, torch.float32)
    ref = {k: v for k, v in ref.items() if k in ours}
    assert max_diff(ours, ref) == 0.0
    # ... and in the artifact's own dtype (fp16 products rounded once, as transformers runs it)
    ref16 = artifact_weights(art, torch.float16)
    assert max(float((ours[k].half().float() - ref16[k].float()).abs().max()) for k in ours) == 0.0
    # (2) transformers' GGUF loader, which un-permutes q/k its own way
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name, dtype=torch.float32).state_dict()
    assert max_diff({k: loaded[k] for k in ours}, ours) == 0.0
    # the record beside the file names it and its hash
    side = json.loads((tmp_path / f"{name}.quantkit.json").read_text())
    assert side["sha256"] == rec["sha256"] and side["lossless"] is True


@pytest.mark.parametrize("model", ["qwen2", "llama-bf16", "llama-untied"])
def test_dense_checkpoint_exports_exactly(cli, models, tmp_path, model):
    out = tmp_path / "dense.gguf"
    code, _, err, rec = export(cli, models[model], out)
    assert code == 0, err
    assert rec["lossless"] is True
    want = "BF16" if model == "llama-bf16" else "F16"
    assert set(rec["tensor_types"]) == {want, "F32"}  # 2-D weights keep their 16 bits, norms/biases F32
    ours = gguf_tensors(out, hf_name_map(rec))
    ref = artifact_weights(models[model], torch.float32)
    assert max_diff(ours, {k: v for k, v in ref.items() if k in ours}) == 0.0
    assert ("output.weight" in {m for m in hf_name_map(rec)}) == (model == "llama-untied")


def test_logits_of_the_gguf_weights_equal_the_artifacts(artifacts, tmp_path, tiny_text):
    """Through transformers at float32, the GGUF's weights compute the artifact's logits: KL 0."""
    from quantkit.gguf.artifact import Artifact
    from quantkit.gguf.artifact_to_gguf import GgufOptions, export_gguf
    from quantkit.gguf.fidelity import logits_kl
    from quantkit.gguf.gguf_arch import hparams
    from quantkit.gguf.tensor_map import make_plan

    art = artifacts["gptq-g64-gqa"]
    out = tmp_path / "g.gguf"
    export_gguf(art, out, GgufOptions())
    with Artifact(art) as a:
        hp = hparams(a.path, a.config)
        plans = make_plan(a, hp)
    r = logits_kl(art, out, plans, hp, f"file:{tiny_text}")
    assert r.mean_kl == 0.0 and r.top1_agreement == 1.0


# ---------------------------------------------------------------- metadata


def test_metadata_round_trips(cli, artifacts, tmp_path):
    import gguf

    from quantkit.gguf.read import field_value, inspect, open_reader

    out = tmp_path / "m.gguf"
    code, _, err, rec = export(cli, artifacts["gptq-g64-gqa"], out)
    assert code == 0, err
    cfg = json.loads((artifacts["gptq-g64-gqa"] / "config.json").read_text())
    r = open_reader(out)
    f = lambda k: field_value(r, k)  # noqa: E731
    assert f("general.architecture") == "llama"
    assert f("llama.block_count") == cfg["num_hidden_layers"] and f("llama.embedding_length") == cfg["hidden_size"]
    assert f("llama.attention.head_count") == 4 and f("llama.attention.head_count_kv") == 2
    assert (
        f("llama.feed_forward_length") == cfg["intermediate_size"]
        and f("llama.context_length") == cfg["max_position_embeddings"]
    )
    assert f("llama.rope.dimension_count") == 32 and f("llama.rope.freq_base") == pytest.approx(
        cfg["rope_parameters"]["rope_theta"]
    )
    assert f("llama.attention.layer_norm_rms_epsilon") == pytest.approx(cfg["rms_norm_eps"])
    assert f("general.file_type") == gguf.LlamaFileType.MOSTLY_Q4_0
    assert f("tokenizer.ggml.model") == "gpt2" and f("tokenizer.ggml.pre") == "gpt-2"
    tokens = f("tokenizer.ggml.tokens")
    assert len(tokens) == cfg["vocab_size"] and tokens[1] == "<|im_start|>"
    types = f("tokenizer.ggml.token_type")
    assert types[1] == gguf.TokenType.CONTROL and types[100] == gguf.TokenType.NORMAL
    assert len(f("tokenizer.ggml.merges")) > 0
    assert (f("tokenizer.ggml.bos_token_id"), f("tokenizer.ggml.eos_token_id")) == (1, 2)
    assert "<|im_start|>" in f("tokenizer.chat_template")
    assert f("quantkit.lossless") is True and f("quantkit.artifact.sha256") == rec["source"]["sha256"]
    meta = json.loads((artifacts["gptq-g64-gqa"] / "quantkit.json").read_text())
    # the origin is the checkpoint the artifact was converted from, not the artifact
    assert f("quantkit.source.sha256") == rec["origin"]["sha256"] == meta["source"]["sha256"] != rec["source"]["sha256"]
    assert json.loads(f("quantkit.provenance"))["calibration"] == json.loads(json.dumps(meta["calibration"]))
    assert json.loads(f("quantkit.quantization"))["group_size"] == 64
    info = inspect(out)
    assert (
        info["tensor_types"]["Q4_0"] == 14
        and info["bytes_by_type"]["Q4_0"]
        == sum(
            np.prod(s) // 32 * 18
            for s in [(128, 128), (64, 128), (64, 128), (128, 128), (256, 128), (256, 128), (128, 256)]
        )
        * 2
    )


def test_head_dim_other_than_hidden_over_heads_writes_key_length(cli, tiny_dir, tmp_path):
    """Mistral-NeMo-like shapes: head_dim * heads != hidden (llama.cpp then needs key/value_length)."""
    from quantkit.gguf.read import field_value, open_reader

    src = build_checkpoint(tmp_path / "hd", "mistral", tiny_dir / "tokenizer", seed=5)
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"]
    mod = reshape_heads(src, head_dim=48)
    code, _, err, _ = export(cli, mod, tmp_path / "hd.gguf")
    assert code == 0, err
    r = open_reader(tmp_path / "hd.gguf")
    assert field_value(r, "llama.attention.key_length") == 48 and field_value(r, "llama.rope.dimension_count") == 48


def reshape_heads(src: Path, head_dim: int) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(src))
    cfg.head_dim = head_dim
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float16)
    out = src.parent / f"{src.name}-hd{head_dim}"
    model.save_pretrained(str(out))
    for f in src.glob("tokenizer*"):
        shutil.copy(f, out / f.name)
    return out


def test_llama3_rope_writes_frequency_factors(cli, tiny_dir, tmp_path):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from quantkit.gguf.read import open_reader

    src = build_checkpoint(tmp_path / "l3", "llama-gqa", tiny_dir / "tokenizer", seed=6)
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    (src / "config.json").write_text(json.dumps(cfg))
    code, _, err, rec = export(cli, src, tmp_path / "l3.gguf")
    assert code == 0, err and rec["extra_tensors"] == ["rope_freqs.weight"]
    t = {t.name: t for t in open_reader(tmp_path / "l3.gguf").tensors}["rope_freqs.weight"]
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](AutoConfig.from_pretrained(str(src)), torch.device("cpu"))
    plain = 1.0 / (500000.0 ** (torch.arange(0, 32, 2).float() / 32))
    assert np.allclose(np.asarray(t.data), (plain / scaled).numpy(), rtol=1e-6)
    assert float(np.asarray(t.data).max()) == pytest.approx(8.0)


def test_demo_like_tokenizer_json_maps_to_its_llama_cpp_pre_tokenizer():
    from quantkit.errors import ModelError
    from quantkit.gguf.vocab import pre_tokenizer_name

    bpe = {"model": {"type": "BPE"}, "normalizer": None}
    smollm = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        ],
    }
    assert pre_tokenizer_name({**bpe, "pre_tokenizer": smollm}, Path("t")) == "smollm"
    assert pre_tokenizer_name({**bpe, "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}, Path("t")) == "gpt-2"
    for bad in (
        {"type": "Metaspace", "replacement": "▁"},
        {"type": "ByteLevel", "add_prefix_space": True},
        {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Isolated"},
                {"type": "ByteLevel", "use_regex": False},
            ],
        },
    ):
        with pytest.raises(ModelError):
            pre_tokenizer_name({**bpe, "pre_tokenizer": bad}, Path("t"))
    with pytest.raises(ModelError, match="byte-level BPE"):
        pre_tokenizer_name({"model": {"type": "Unigram"}, "pre_tokenizer": None}, Path("t"))


# ---------------------------------------------------------------- lossy, only when asked


def test_asymmetric_int4_maps_to_q4_1_or_says_why_not(cli, models, tiny_text, tmp_path):
    """Asymmetric INT4 -> Q4_1 exactly where every block's minimum is an fp16 value; otherwise refused,
    or with --allow-lossy written with rounded minimums and its KL reported."""
    art = tmp_path / "asym"
    code, _, err, _ = run_cli(
        tmp_path / "home",
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(models["qwen2"]),
        "--out",
        str(art),
        "--set",
        "steps[0].quantize.group_size=32",
        "--set",
        "steps[0].quantize.symmetric=false",
        "--set",  # bf16 minimums are fp16 values (8 mantissa bits within 11): most blocks map exactly
        "calibration.compute_dtype=bfloat16",
        "--json",
    )
    assert code == 0, err
    out = tmp_path / "asym.gguf"
    code, _, err, _ = export(cli, art, out)
    assert code == 2 and "Q4_1 minimum" in err and "fp16" in err and "--allow-lossy" in err
    assert not out.exists() and not list(tmp_path.glob(".asym.gguf.partial-*"))
    code, _, err, rec = export(cli, art, out, "--allow-lossy", "--kl-text", f"file:{tiny_text}")
    assert code == 0, err
    assert rec["lossless"] is False and rec["tensor_types"]["Q4_1"] == 14
    assert 0 < rec["kl_vs_artifact"]["mean_kl"] < 1e-4 and "first half" in rec["kl_vs_artifact"]["text"]
    worst = max(t["max_abs_diff"] for t in rec["lossy_tensors"])
    assert 0 < worst < 1e-3  # one fp16 rounding of m
    # blocks whose minimum was exact came through exactly: only rounded ones differ
    ours = gguf_tensors(out, hf_name_map(rec))
    ref = artifact_weights(art, torch.float32)
    diffs = [(ours[k] - ref[k]).abs() for k in ours if k.endswith("proj.weight")]
    assert sum(int((d > 0).sum()) for d in diffs) < 0.2 * sum(d.numel() for d in diffs)


def test_embeddings_q8_0_on_request(cli, artifacts, tmp_path):
    out = tmp_path / "e.gguf"
    code, _, err, rec = export(cli, artifacts["rtn-g128-untied"], out, "--embeddings", "q8_0")
    assert code == 0, err
    assert rec["lossless"] is False and {t["tensor"] for t in rec["lossy_tensors"]} == {
        "token_embd.weight",
        "output.weight",
    }
    assert rec["tensor_types"]["Q8_0"] == 2 and "mean_kl" in rec["kl_vs_artifact"]


@pytest.mark.parametrize(
    "case,needle",
    [
        ("g16", "group size 16 is not a multiple of 32"),
        ("permuted-g-idx", "groups are permuted"),
        ("bf16-scales", "not representable in GGUF's fp16"),
        ("int8-asym", "INT8 asymmetric"),
        ("int2", "INT2 symmetric"),
    ],
)
def test_grids_without_an_exact_gguf_type_are_refused(cli, models, tmp_path, case, needle):
    art = craft_artifact(models["llama-gqa"], tmp_path / case, case)
    out = tmp_path / "x.gguf"
    code, _, err, _ = export(cli, art, out)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not out.exists() and not list(tmp_path.glob(".x.gguf.partial-*"))


@pytest.mark.parametrize("case", ["g16", "permuted-g-idx", "bf16-scales"])
def test_allow_lossy_maps_them_and_reports_kl(cli, models, tmp_path, case):
    art = craft_artifact(models["llama-gqa"], tmp_path / case, case)
    code, _, err, rec = export(cli, art, tmp_path / "x.gguf", "--allow-lossy")
    assert code == 0, err
    assert rec["lossless"] is False and rec["lossy_tensors"] and rec["kl_vs_artifact"]["finite"]
    assert "random token ids" in rec["kl_vs_artifact"]["text"]


@pytest.mark.parametrize("side", ["artifact", "GGUF's weights"], ids=["artifact", "gguf"])
def test_a_fidelity_kl_that_is_not_finite_fails_the_export(cli, models, tmp_path, monkeypatch, side):
    """A lossy GGUF's KL against its artifact is its fidelity figure: NaN (either side's logits
    non-finite) fails the export, nothing written, rather than a record of `NaN`."""
    import torch

    from quantkit.gguf import fidelity

    art = craft_artifact(models["llama-gqa"], tmp_path / "g16", "g16")
    real, calls = fidelity.logits, []

    def logits(model, ids):
        calls.append(1)
        out = real(model, ids)
        return torch.full_like(out, float("nan")) if (len(calls) == 1) == (side == "artifact") else out

    monkeypatch.setattr(fidelity, "logits", logits)
    out = tmp_path / "x.gguf"
    code, _, err, _ = export(cli, art, out, "--allow-lossy")
    assert code == 2 and "no finite KL" in err and f"the {side}" in err and err.count("\n") == 1, err
    assert not out.exists() and not list(tmp_path.glob(".x.*"))


def test_crafted_exact_cases_are_exact(cli, models, tmp_path):
    """act-order g_idx that keeps 32-blocks whole, and bf16 scales that are fp16 values, stay exact."""
    for case in ("blockwise-g-idx", "bf16-exact-scales"):
        art = craft_artifact(models["llama-gqa"], tmp_path / case, case)
        code, _, err, rec = export(cli, art, tmp_path / f"{case}.gguf")
        assert code == 0, err
        assert rec["lossless"] is True
        ours = gguf_tensors(tmp_path / f"{case}.gguf", hf_name_map(rec))
        ref = torch.load(art / "reference.pt")  # (q - z) * s per column, written when the artifact was made
        assert max_diff({k: v for k, v in ours.items() if k in ref}, ref) == 0.0


# ---------------------------------------------------------------- bad input and transactions


def test_bad_inputs_are_one_line_exit_2_and_write_nothing(cli, artifacts, models, tmp_path):
    art = artifacts["rtn-g32-mha"]
    out = tmp_path / "o.gguf"
    cases = {}
    trunc = tmp_path / "trunc"
    shutil.copytree(art, trunc)
    st = trunc / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    cases["truncated safetensors"] = (rerecord(trunc), "truncated")
    phi = tmp_path / "phi"
    shutil.copytree(models["llama-gqa"], phi)
    cfg = json.loads((phi / "config.json").read_text())
    (phi / "config.json").write_text(json.dumps({**cfg, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}))
    cases["unsupported architecture"] = (phi, "not exported to GGUF")
    bnb = tmp_path / "bnb"
    shutil.copytree(models["llama-gqa"], bnb)
    (bnb / "config.json").write_text(
        json.dumps({**cfg, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}})
    )
    cases["bitsandbytes"] = (bnb, "bitsandbytes artifact")
    lies = tmp_path / "lies"
    shutil.copytree(art, lies)
    cfg = json.loads((lies / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64  # the tensors hold group 32
    (lies / "config.json").write_text(json.dumps(cfg))
    cases["config that does not match its tensors"] = (rerecord(lies), "weight_scale has shape")
    online = tmp_path / "online"
    shutil.copytree(artifacts["spin-gptq-gqa"], online)
    cfg = json.loads((online / "config.json").read_text())
    cfg["quantization_config"]["transform_config"]["config_groups"]["R4"] = {
        "type": "hadamard",
        "apply": [{"targets": ["re:.*down_proj$"], "location": "input"}],
    }  # QuaRot's online R4
    (online / "config.json").write_text(json.dumps(cfg))
    cases["an online rotation"] = (rerecord(online), "rotates activations at run time (R4 at input")
    cases["not a directory"] = (tmp_path / "missing", "no such file or directory")
    gg = tmp_path / "in.gguf"
    gg.write_bytes(b"GGUF" + bytes(60))
    cases["a GGUF as input"] = (gg, "GGUF files run in")
    for what, (src, needle) in cases.items():
        code, _, err, _ = export(cli, src, out)
        assert code == 2, f"{what}: {err}"
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, f"{what}: {err}"
        assert not out.exists() and not list(tmp_path.glob(".o.gguf.partial-*")), what


def test_existing_out_needs_force_and_a_failed_export_leaves_it(cli, artifacts, tmp_path, monkeypatch):
    out = tmp_path / "keep.gguf"
    assert export(cli, artifacts["rtn-g32-mha"], out)[0] == 0
    old, old_record = out.read_bytes(), (tmp_path / "keep.quantkit.json").read_bytes()
    code, _, err, _ = export(cli, artifacts["rtn-g32-mha"], out)
    assert code == 2 and "--force" in err and out.read_bytes() == old
    code, _, err, _ = cli("export", str(artifacts["rtn-g32-mha"]), "--format", "gguf", "--out", str(tmp_path))
    assert code == 2 and "is a directory" in err
    import quantkit.gguf.write as w

    calls = {"n": 0}
    real = w.tensor_bytes

    def failing(art, plan):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(art, plan)

    def untouched():
        assert out.read_bytes() == old and (tmp_path / "keep.quantkit.json").read_bytes() == old_record
        assert not list(tmp_path.glob(".keep*"))  # no temp file, no lock

    monkeypatch.setattr(w, "tensor_bytes", failing)
    code, _, err, _ = export(cli, artifacts["rtn-g32-mha"], out, "--force")
    assert code == 130
    untouched()

    def disk_full(art, plan):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(w, "tensor_bytes", disk_full)
    code, _, err, _ = export(cli, artifacts["rtn-g32-mha"], out, "--force")
    assert code == 2 and "No space left on device" in err and err.count("\n") == 1
    untouched()
    monkeypatch.setattr(w, "tensor_bytes", real)
    code, _, err, rec = export(cli, artifacts["rtn-g32-mha"], out, "--force")
    assert code == 0, err
    assert json.loads((tmp_path / "keep.quantkit.json").read_text())["sha256"] == rec["sha256"]


def test_default_out_is_beside_the_artifact(cli, artifacts, tmp_path):
    art = tmp_path / "a"
    shutil.copytree(artifacts["rtn-g32-mha"], art)
    code, out, err, _ = cli("export", str(art), "--format", "gguf")
    assert code == 0, err
    assert (tmp_path / "a.gguf").is_file() and (tmp_path / "a.quantkit.json").is_file()
    assert "lossless" in out and "Q4_0" in out


def test_truncated_or_foreign_gguf_is_one_clear_error(cli, artifacts, tmp_path):
    from quantkit.errors import ModelError
    from quantkit.gguf.read import inspect

    out = tmp_path / "t.gguf"
    assert export(cli, artifacts["rtn-g32-mha"], out)[0] == 0
    data = out.read_bytes()
    for name, blob, needle in [
        ("cut.gguf", data[: len(data) // 2], "truncated"),
        ("head.gguf", data[:100], "truncated"),
        ("not.gguf", b"PK\x03\x04" + data[4:], "not a GGUF"),
    ]:
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(ModelError, match=needle):
            inspect(tmp_path / name)


def test_recipe_export_formats_key():
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import recipe_from_dict

    steps = [{"quantize": {"method": "rtn"}}]
    assert recipe_from_dict({"steps": steps, "export": {"formats": ["gguf"]}}).export.formats == ("gguf",)
    # a name the exporter registry does not know is refused by `run` (tests/test_export_registry.py);
    # one that could not be a format's name (a run's directory RUN_DIR/FMT) by the recipe itself
    with pytest.raises(RecipeError, match="export.formats"):
        recipe_from_dict({"steps": steps, "export": {"formats": ["../gguf"]}})


# ---------------------------------------------------------------- through llama.cpp
# (installed.py: fails where the install script built it)


def agreement():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gguf_logits_agreement", REPO / "benchmarks" / "gguf_logits_agreement.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def text_ids(artifact: Path, text: Path, n: int = 128) -> list[int]:
    from quantkit.models.checkpoint import load_tokenizer

    return load_tokenizer(artifact)(text.read_text()[: n * 12], add_special_tokens=False)["input_ids"][:n]


@needs_llama_cpp
@pytest.mark.parametrize("name", list(ARTIFACTS))
def test_llama_cpp_runs_the_export_with_only_its_activation_rounding(cli, artifacts, tmp_path, tiny_text, name):
    """llama.cpp's logits differ from transformers' by its activation rounding (Q8_0 inputs to quantized
    matmuls): of the size that rounding gives when simulated in transformers, and equal to the simulation
    to float32 noise at the first position (a wrong export would differ there already)."""
    out = tmp_path / f"{name}.gguf"
    assert export(cli, artifacts[name], out)[0] == 0
    r = agreement().measure(artifacts[name], out, text_ids(artifacts[name], tiny_text))
    assert r["engines"]["mean"] < 1e-3, r
    if name != "w8a8-gqa":  # W8A8's own per-token INT8 activations are a different rounding from llama.cpp's
        assert r["same_prefix"] >= 1, r
        assert r["engines"]["mean"] < 3 * r["simulated"]["mean"], r


@needs_llama_cpp
@pytest.mark.parametrize("model", ["qwen2", "llama-untied", "llama-bf16"])
def test_llama_cpp_runs_dense_exports_to_fp16_rounding(cli, models, tmp_path, tiny_text, model):
    out = tmp_path / "d.gguf"
    assert export(cli, models[model], out)[0] == 0
    r = agreement().measure(models[model], out, text_ids(models[model], tiny_text))
    assert r["engines"]["mean"] < 2e-5 and r["top1_engines"] > 0.95, r


@needs_llama_cpp
def test_llama_cpp_runs_llama3_rope_and_odd_head_dims(cli, tiny_dir, tmp_path, tiny_text):
    src = build_checkpoint(tmp_path / "l3", "llama-gqa", tiny_dir / "tokenizer", seed=7)
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    (src / "config.json").write_text(json.dumps(cfg))
    odd = reshape_heads(build_checkpoint(tmp_path / "hd", "mistral", tiny_dir / "tokenizer", seed=8), head_dim=48)
    for model in (src, odd):
        out = tmp_path / f"{model.name}.gguf"
        assert export(cli, model, out)[0] == 0
        r = agreement().measure(model, out, text_ids(model, tiny_text))
        assert r["engines"]["mean"] < 2e-5, (model.name, r)


@needs_llama_cpp
def test_llama_cpp_tokenizes_like_transformers(cli, artifacts, tmp_path, tiny_text):
    out = tmp_path / "t.gguf"
    assert export(cli, artifacts["rtn-channel-qwen2"], out)[0] == 0
    texts = [
        tiny_text.read_text()[:4000],
        "Hello world! 123 4567 89.5%",
        "Café déjà vu — naïve 北京 🙂\n\n\ttabs",
        "def f(x):\n    return x ** 2  # square\n",
        "  leading   spaces  and trailing  ",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    ]
    for text in texts:
        assert agreement().tokenizations_agree(artifacts["rtn-channel-qwen2"], out, text), text


# ---------------------------------------------------------------- the demo model
# (slow: GPTQ on 135M parameters takes minutes)

# English prose shipped with quantkit: the calibration text and the text llama.cpp is run on
DEMO_TEXT = CALIB_DATA / "text" / "world-factbook.txt"
DEMO_RECIPES = {"int4-gptq-g64": ("int4-w4a16-gptq-g64", "Q4_0", 210), "int8-gptq": ("int8-w8a16-gptq", "Q8_0", 210)}


@pytest.fixture(scope="session")
def demo_artifacts(demo_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-demo")
    built = {}
    for name, (recipe, _, _) in DEMO_RECIPES.items():
        code, _, err, _ = run_cli(
            root / "home",
            "convert",
            str(RECIPES / f"{recipe}.yaml"),
            "--model",
            str(demo_model),
            "--out",
            str(root / name),
            "--calib",
            f"file:{DEMO_TEXT}",
            "--set",
            "calibration.samples=4",  # what is checked is the export of the grid GPTQ chose, not its accuracy
            "--json",
        )
        assert code == 0, err
        built[name] = root / name
    return built


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEMO_RECIPES))
def test_demo_artifacts_export_exactly(cli, demo_artifacts, tmp_path, name):
    art, out = demo_artifacts[name], tmp_path / f"{name}.gguf"
    code, _, err, rec = export(cli, art, out)
    assert code == 0, err
    _, qtype, n = DEMO_RECIPES[name]
    assert rec["lossless"] is True and rec["tensor_types"][qtype] == n  # 30 layers x 7 linears
    ours = gguf_tensors(out, hf_name_map(rec))
    ref = artifact_weights(art, torch.float32)
    assert max_diff(ours, {k: v for k, v in ref.items() if k in ours}) == 0.0
    require_llama_cpp()
    r = agreement().measure(art, out, text_ids(art, DEMO_TEXT, 256))
    # measured on WikiText-2 (256 tokens): engines 2.7e-3 (INT4) / 2.3e-3 (INT8), simulated Q8_0 activation
    # rounding 3.0e-3 / 2.4e-3; the bounds hold on the shipped text too. With 30 layers fp32-level differences
    # flip some Q8_0 codes from the first token on, so unlike the tiny models no position matches the
    # simulation to float32 noise.
    assert r["engines"]["mean"] < 1e-2 and r["engines"]["mean"] < 3 * r["simulated"]["mean"], r
    assert agreement().tokenizations_agree(art, out, DEMO_TEXT.read_text()[:20000])


@pytest.mark.parametrize(
    "config, online",
    [
        (None, []),
        ({"config_groups": {"R1": {"apply": [{"location": "weight_output"}, {"location": "weight_input"}]}}}, []),
        (
            {
                "config_groups": {
                    "R1": {"apply": [{"location": "weight_input"}]},
                    "R3": {"apply": [{"location": "k_cache"}]},
                }
            },
            ["R3 at k_cache"],
        ),
        ({"config_groups": {"U": {"apply": [{"location": "input"}, {"location": "weight_input"}]}}}, ["U at input"]),
        ({"config_groups": {"X": {"apply": []}}}, ["X (no locations)"]),
        ({"config_groups": "junk"}, ["an unreadable transform_config"]),
    ],
)
def test_only_fused_rotations_export(config, online):
    from quantkit.gguf.artifact_to_gguf import online_transforms

    assert online_transforms(config) == online


def test_fused_rotation_export_says_so(cli, artifacts, tmp_path):
    code, _, err, rec = export(cli, artifacts["spin-gptq-gqa"], tmp_path / "s.gguf")
    assert code == 0, err
    assert rec["lossless"] and any("R1, R2 are fused into the weights" in n for n in rec["notes"])
