"""quantkit convert on tiny fixtures: every method, the artifact contents, and bad input."""

import json
import shutil

import pytest
from fixtures import RECIPES

SMALL_CALIB = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]


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
        *SMALL_CALIB,
        *extra,
        "--json",
    )


@pytest.mark.parametrize(
    "recipe,fmt,bits",
    [
        ("int4-w4a16-rtn", "compressed-tensors", 4),
        ("int4-w4a16-gptq-g64", "compressed-tensors", 4),
        ("int8-w8a16-gptq", "compressed-tensors", 8),
        ("int4-w4a16-awq", "compressed-tensors", 4),
        (
            "int4-w4a16-awq-gptq-mixed",
            "compressed-tensors",
            4,
        ),  # AWQ, then GPTQ, with INT8 units chosen on the model (auto)
        (
            "int4-w4a16-spinquant-gptq-asym-mixed",
            "compressed-tensors",
            4,
        ),  # rotations, asymmetric GPTQ, INT8 units chosen on the model
        ("int8-w8a8-smoothquant", "compressed-tensors", 8),
        ("bnb-nf4", "bitsandbytes", 4),
        ("bnb-int8", "bitsandbytes", 8),
    ],
)
def test_each_method_converts_and_verifies(cli, tiny_llama, tiny_text, tmp_path, recipe, fmt, bits):
    out = tmp_path / "art"
    code, _, err, data = convert(cli, recipe, tiny_llama, out, tiny_text)
    assert code == 0, err
    assert data["verification"]["status"] == "passed"
    assert data["verification"]["mean_kl"] <= 1e-3
    assert data["quantization"]["format"] == fmt and data["quantization"]["weight_bits"] == bits
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "quantkit.json", "README.md", "tokenizer.json", "generation_config.json"} <= files
    assert any(f.endswith(".safetensors") for f in files)
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" in cfg
    meta = json.loads((out / "quantkit.json").read_text())
    assert meta["source"]["sha256"] and meta["tool_versions"]["torch"] and meta["peak_rss_mb"] > 0
    card = (out / "README.md").read_text()
    assert "base_model_relation: quantized" in card and "library_name: transformers" in card
    assert not list(tmp_path.glob(".art.partial-*"))
    if recipe.endswith("-mixed"):  # the units auto raised are INT8 per channel, the rest INT4 g64
        mp = data["mixed_precision"]
        assert mp["measured_bits_per_weight"] <= 4.5  # on this tiny model an asymmetric budget of 4.5 may raise none
        groups = cfg["quantization_config"]["config_groups"]
        assert groups["group_0"]["weights"]["num_bits"] == 4
        assert [g["weights"]["num_bits"] for n, g in groups.items() if n != "group_0"] == [8] * len(mp["overrides"])
    if recipe == "int4-w4a16-spinquant-gptq-asym-mixed":  # asymmetric INT4 with zero points; none on the INT8 units
        assert groups["group_0"]["weights"]["symmetric"] is False
        from safetensors import safe_open

        from quantkit.methods.schemes import UNITS

        names = [k for f in out.glob("*.safetensors") for k in safe_open(str(f), "pt").keys()]
        zeros = {k.removesuffix(".weight_zero_point") for k in names if k.endswith(".weight_zero_point")}
        raised = {
            f"model.layers.{p['layer']}.{UNITS[p['unit']][0]}.{m}" for p in mp["picked"] for m in UNITS[p["unit"]][1]
        }
        assert zeros and not zeros & raised and len(zeros) == 2 * 7 - len(raised)


def test_group_128_with_act_order_by_default(cli, tiny_llama, tiny_text, tmp_path):
    """Group 128 (no shipped recipe: it does not divide the demo's 576 columns) through --set;
    GPTQ orders columns by activation (static act-order, llm-compressor's default) unless told not to."""
    out = tmp_path / "g128"
    code, _, err, data = convert(
        cli, "int4-w4a16-gptq-g64", tiny_llama, out, tiny_text, "--set", "steps[0].quantize.group_size=128"
    )
    assert code == 0, err
    assert data["verification"]["status"] == "passed" and data["quantization"]["group_size"] == 128
    weights = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"][
        "weights"
    ]
    assert (weights["group_size"], weights["actorder"], weights["num_bits"]) == (128, "static", 4)
    code, _, err, data = convert(
        cli,
        "int4-w4a16-gptq-g64",
        tiny_llama,
        tmp_path / "plain",
        tiny_text,
        "--set",
        "steps[0].quantize.actorder=null",
    )
    assert code == 0, err
    weights = json.loads((tmp_path / "plain" / "config.json").read_text())["quantization_config"]["config_groups"][
        "group_0"
    ]["weights"]
    assert weights["actorder"] is None and data["quantization"]["actorder"] is None


def test_fused_shards_need_one_scheme(cli, tiny_llama, tiny_text, tmp_path):
    """vLLM fuses q/k/v and gate/up: an override or ignore entry must take all of them or none."""
    for value, shards in [
        ("[{targets: ['.*self_attn\\.(k_proj|v_proj)$'], bits: 8}]", "q_proj/k_proj/v_proj"),
        ("[{targets: ['.*mlp\\.up_proj$'], bits: 8}]", "gate_proj/up_proj"),
        # the same bits and group as the base scheme but with zero points: still another scheme to vLLM
        ("[{targets: ['.*self_attn\\.v_proj$'], bits: 4, group_size: 64, symmetric: false}]", "q_proj/k_proj/v_proj"),
    ]:
        code, _, err, _ = convert(
            cli,
            "int4-w4a16-rtn",
            tiny_llama,
            tmp_path / "x",
            tiny_text,
            "--set",
            f"steps[0].quantize.overrides={value}",
        )
        assert code == 2 and f"vLLM serves {shards} of model.layers.0" in err and "needs one scheme" in err, err
        assert not (tmp_path / "x").exists()
    code, _, err, _ = convert(
        cli,
        "int4-w4a16-rtn",
        tiny_llama,
        tmp_path / "x",
        tiny_text,
        "--set",
        "steps[0].quantize.ignore=[lm_head, 're:.*v_proj$']",
    )
    assert code == 2 and "v_proj: not quantized" in err
    code, _, err, _ = convert(
        cli,
        "int4-w4a16-rtn",
        tiny_llama,
        tmp_path / "y",
        tiny_text,
        "--set",
        "steps[0].quantize.overrides=[{targets: ['model\\.layers\\.0\\.self_attn\\.[qkv]_proj$'], bits: 8}]",
    )
    assert code == 0, err


def test_override_matching_no_layer_is_refused(cli, tiny_llama, tiny_text, tmp_path):
    """A layer list written for a deeper model, or a typo: one line, exit 2, before loading, nothing at --out."""
    for target in ("model\\.layers\\.(7|9)\\.self_attn\\.(q_proj|k_proj|v_proj)$", ".*mlp\\.dwn_proj$"):
        code, _, err, _ = convert(
            cli,
            "int4-w4a16-rtn",
            tiny_llama,
            tmp_path / "x",
            tiny_text,
            "--set",
            f"steps[0].quantize.overrides=[{{targets: ['{target}'], bits: 8, group_size: -1}}]",
        )
        assert (
            code == 2 and "steps[0].quantize.overrides[0]: target" in err and "matches no quantized linear layer" in err
        ), err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    # a target that matches some layers passes, even when others in its list do not exist here
    code, _, err, _ = convert(
        cli,
        "int4-w4a16-rtn",
        tiny_llama,
        tmp_path / "y",
        tiny_text,
        "--set",
        "steps[0].quantize.overrides=[{targets: "
        "['model\\.layers\\.(1|29)\\.self_attn\\.(q_proj|k_proj|v_proj)$'], bits: 8}]",
    )
    assert code == 0, err


def test_calibration_manifest(cli, tiny_llama, tiny_text, tmp_path):
    code, _, err, data = convert(cli, "int4-w4a16-gptq-g64", tiny_llama, tmp_path / "a", tiny_text)
    assert code == 0, err
    c = data["calibration"]
    assert c["samples"] == 8 and c["seq_len"] == 64 and c["tokens"] == 512
    assert c["region"] == "second-half" and len(c["window_starts"]) == 8
    assert all(s >= c["stream_tokens"] // 2 for s in c["window_starts"])
    assert 0.0 <= c["duplicate_fraction"] <= 1.0 and len(c["sha256"]) == 64
    r = json.loads((tmp_path / "a" / "quantkit.json").read_text())["recipe"]  # the recipe as resolved
    assert r["steps"][0]["quantize"]["group_size"] == 64 and r["variant"] == "int4-w4a16-gptq-g64"
    assert r["calibration"]["source"] == f"file:{tiny_text}" and r["calibration"]["samples"] == 8
    assert r["calibration"]["seq_len"] == 64 and r["calibration"]["region"] == "second-half"
    assert r["export"]["max_shard_size"] and "variants" not in r


def test_mixed_precision_override(cli, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "mixed"
    code, _, err, data = convert(
        cli,
        "int4-w4a16-gptq-g64",
        tiny_llama,
        out,
        tiny_text,
        "--set",
        "steps[0].quantize.overrides=[{targets: ['.*mlp\\.down_proj$'], bits: 8, group_size: -1}]",
    )
    assert code == 0, err
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    bits = sorted(g["weights"]["num_bits"] for g in groups.values())
    assert bits == [4, 8]


def test_existing_out_refused_then_force(cli, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, out, tiny_text)
    assert code == 2 and "already exists" in err and (out / "keep.txt").exists()
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, out, tiny_text, "--force")
    assert (
        code == 2 and "not a quantkit artifact" in err and (out / "keep.txt").exists()
    )  # --force replaces only an artifact
    (out / "quantkit.json").write_text("{}")  # as if quantkit had written it
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, out, tiny_text, "--force")
    assert code == 0, err
    assert not (out / "keep.txt").exists() and (out / "quantkit.json").exists()


def test_group_size_not_dividing_is_an_error_before_work(cli, tiny_dir, tiny_text, tmp_path):
    # intermediate 256 and hidden 128 are divisible by 64; make a 96-wide model
    import transformers
    from fixtures import build_checkpoint

    src = tmp_path / "odd"
    build_checkpoint(src, "llama-gqa", tiny_dir / "tokenizer")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_size=96, head_dim=24)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")})
    )
    model.save_pretrained(str(src))
    code, _, err, _ = convert(cli, "int4-w4a16-gptq-g64", src, tmp_path / "x", tiny_text)
    assert code == 2
    assert "group_size 64 does not divide the 96 input columns of" in err
    assert "sizes that work for every layer: 32, -1" in err
    assert not (tmp_path / "x").exists()


def test_missing_calibration_source(cli, tiny_llama, tmp_path):
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "x"),
        "--set",
        "calibration.source=null",
    )  # the recipe's own source is mix:default
    assert code == 2 and "needs calibration text" in err


def test_suite_recipe_needs_variant(cli, tiny_llama, tmp_path):
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "demo.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "x"),
    )
    assert code == 2 and "--variant" in err


def test_non_finite_source_refused(cli, tiny_llama, tiny_text, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "nan"
    shutil.copytree(tiny_llama, src)
    sd = load_file(str(src / "model.safetensors"))
    key = next(k for k in sd if "q_proj" in k)
    sd[key][0, 0] = float("nan")
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", src, tmp_path / "x", tiny_text)
    assert code == 2 and "non-finite" in err and not (tmp_path / "x").exists()


def test_missing_tokenizer(cli, tiny_llama, tiny_text, tmp_path):
    src = tmp_path / "notok"
    shutil.copytree(tiny_llama, src)
    for f in src.glob("tokenizer*"):
        f.unlink()
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", src, tmp_path / "x", tiny_text)
    assert code == 2 and "tokenizer" in err


def test_unsupported_architecture(cli, tiny_llama, tiny_text, tmp_path):
    src = tmp_path / "arch"
    shutil.copytree(tiny_llama, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "not-a-model"
    (src / "config.json").write_text(json.dumps(cfg))
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", src, tmp_path / "x", tiny_text)
    assert code == 2 and "unsupported architecture" in err


def test_failed_verification_keeps_nothing(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    from quantkit.artifacts import containers

    real = containers.CONTAINERS["compressed-tensors"]

    def corrupt_load(path, dtype, device=None, **kwargs):
        model = real.load(path, dtype, device, **kwargs)
        import torch

        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(3.0) if hasattr(
                model.model.layers[0].mlp.down_proj, "weight"
            ) else None
            model.lm_head.weight.mul_(-1.0)
        return model

    monkeypatch.setitem(
        containers.CONTAINERS,
        "compressed-tensors",
        containers.Container(real.save, corrupt_load, real.loader, real.describe),
    )
    out = tmp_path / "bad"
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, out, tiny_text)
    assert code == 2 and "verification failed" in err
    assert not out.exists() and not list(tmp_path.glob(".bad.partial-*"))


def test_bnb_nf4_cpu_repack_fault_is_caught_without_the_fix(cli, tiny_llama, tiny_text, tmp_path, monkeypatch):
    """bitsandbytes 0.50 repacks 4-bit layers in place on AVX512-BF16 CPUs; saving then corrupts absmax.

    Without quantkit's restore (methods/bnb_cpu_fix.py) verification must catch it."""

    from quantkit.methods import bnb_cpu_fix

    monkeypatch.setattr(bnb_cpu_fix, "restore_canonical_state", lambda model: 0)
    code, _, err, _ = convert(
        cli, "bnb-nf4", tiny_llama, tmp_path / "nf4", tiny_text, "--set", "steps[0].quantize.double_quant=false"
    )
    if code == 0:
        pytest.skip("this CPU does not take bitsandbytes' AVX512-BF16 repack path; the fault cannot occur here")
    assert code == 2 and "verification failed" in err and not (tmp_path / "nf4").exists()


def test_self_calibration_is_seeded_and_cached(cli, tiny_llama, tmp_path, quantkit_home):
    args = [
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--calib",
        "self",
        "--set",
        "calibration.samples=4",
        "--set",
        "calibration.seq_len=32",
        "--json",
    ]
    code, _, err, a = cli(*args, "--out", str(tmp_path / "a"))
    assert code == 0, err
    c = a["calibration"]
    assert c["source"] == "self" and c["samples"] == 4 and c["tokens"] == 128 and c["generation"]["start"] == "BOS"
    assert len(list((quantkit_home / "calib").glob("self-*.pt"))) == 1
    code, _, err, b = cli(*args, "--out", str(tmp_path / "b"))
    assert code == 0 and b["calibration"]["duplicate_fraction"] == c["duplicate_fraction"]

    def w(d):
        return (d / "model.safetensors").read_bytes()

    assert w(tmp_path / "a") == w(tmp_path / "b")  # same seed, same text, same artifact


def test_chat_template_calibration(cli, tiny_llama, tiny_text, tmp_path):
    code, _, err, meta = convert(
        cli, "int4-w4a16-gptq-g64", tiny_llama, tmp_path / "c", tiny_text, "--set", "calibration.chat_template=true"
    )
    assert code == 0, err
    assert meta["calibration"]["chat_template"] is True and meta["calibration"]["samples"] >= 1


def test_hf_source_offline_is_clear(cli, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    code, _, err, _ = cli(
        "convert",
        str(RECIPES / "int4-w4a16-gptq-g64.yaml"),
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "h"),
        "--calib",
        "hf:wikitext:wikitext-2-raw-v1:train",
    )
    assert code == 2 and "hf:wikitext" in err and "Traceback" not in err and not (tmp_path / "h").exists()
