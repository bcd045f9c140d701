"""A recipe's `auto:` in `quantkit convert`: the units chosen on the model, the artifact's bits per
weight against the budget and the search's prediction, what quantkit.json and the card record,
the same choice as `quantkit sensitivity`, and what is refused before loading."""

import json
from pathlib import Path

import pytest
from fixtures import RECIPES, STUDIES

SMALL = ["--set", "calibration.samples=8", "--set", "calibration.seq_len=64"]
AUTO = "steps[0].quantize.auto={budget_bits: %s, windows: 2, seq_len: 64%s}"


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


def _float32(tiny_dir, tmp_path, arch):
    from fixtures import build_checkpoint

    return build_checkpoint(tmp_path / f"{arch}-fp32", arch, tiny_dir / "tokenizer", dtype="float32")


@pytest.mark.parametrize(
    "arch,dtype,budget", [("llama-gqa", "float16", "4.6"), ("qwen2", "float16", "5.2"), ("mistral", "float32", "4.9")]
)
def test_the_artifact_takes_the_predicted_bits_within_the_budget(
    cli, tiny_dir, tiny_text, tmp_path, arch, dtype, budget
):
    """On each architecture (Qwen2's q/k/v biases, a float32 checkpoint's 32-bit scales): the
    bits per weight models/sizes.py reads from the saved headers equal the search's prediction
    and stay within the budget; the overrides it wrote are the artifact's config groups."""
    from quantkit.models.sizes import checkpoint_sizes

    src = tiny_dir / arch if dtype == "float16" else _float32(tiny_dir, tmp_path, arch)
    out = tmp_path / "art"
    code, _, err, data = convert(cli, "int4-w4a16-rtn", src, out, tiny_text, "--set", AUTO % (budget, ""))
    assert code == 0, err
    mp = data["mixed_precision"]
    measured = checkpoint_sizes(out).bits_per_weight
    assert mp["measured_bits_per_weight"] == measured and measured == pytest.approx(mp["bits_per_weight"], abs=1e-6)
    assert measured <= float(budget) and mp["picked"] and data["verification"]["status"] == "passed"
    assert data["quantization"]["overrides"] == mp["overrides"] and "auto" not in data["quantization"]
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert sorted(g["weights"]["num_bits"] for g in groups.values()) == [4] + [8] * len(mp["overrides"])
    assert json.loads((out / "quantkit.json").read_text())["mixed_precision"] == mp


def test_quantkit_json_and_the_card_record_the_search(cli, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "art"
    code, _, err, data = convert(
        cli, "int4-w4a16-rtn", tiny_llama, out, tiny_text, "--set", AUTO % ("4.8", ", units: [qkv, down]")
    )
    assert code == 0, err
    mp = data["mixed_precision"]
    assert (mp["budget_bits"], mp["metric"], mp["base"], mp["choices"], mp["units"]) == (
        4.8,
        "kl",
        "int4-g64",
        ["int8"],
        ["qkv", "down"],
    )
    w = mp["windows"]
    assert (w["requested"], w["used"], w["seq_len"]) == (2, 2, 64) and w["text"]["source"] == f"file:{tiny_text}"
    assert w["text"]["region"] == "second-half" and len(w["text"]["window_starts"]) == 2 and w["text"]["seed"] == 0
    # every unit at the base; its choices wherever a solution of the lazy search raised it (every picked unit)
    assert len(mp["ranking"]) == 2 * 2 and all(
        "int4-g64" in r["kls"] and r["chosen"] in r["kls"] for r in mp["ranking"]
    )
    assert mp["search"] == "lazy" and mp["measured"]["unit_forwards"] >= 2 * 2 + len(mp["picked"])
    assert {(p["layer"], p["unit"]) for p in mp["picked"]} == {
        (r["layer"], r["unit"]) for r in mp["ranking"] if r["chosen"] == "int8"
    }
    assert mp["wall_seconds"] > 0 and mp["measured_on"] and mp["noise_floor"]["kl"] >= 0
    card = (out / "README.md").read_text()
    raised = sorted(p["layer"] for p in mp["picked"] if p["unit"] == mp["picked"][0]["unit"])
    assert "## Mixed precision" in card and f"| int8 | {len(mp['picked'])} |" in card
    assert f"{mp['picked'][0]['unit']}: {', '.join(map(str, raised))}" in card
    assert str(tiny_text) not in card  # the text's name, never a local path


def test_sensitivity_picks_what_auto_picks(cli, tiny_llama, tiny_text, tmp_path):
    """The same model, text, windows and seed: `quantkit sensitivity` prints the choice `auto:` makes."""
    code, _, err, data = convert(
        cli,
        "int4-w4a16-rtn",
        tiny_llama,
        tmp_path / "art",
        tiny_text,
        "--set",
        AUTO % ("4.6", ", choices: [int8, int4-g32]"),
        "--set",
        "calibration.compute_dtype=float32",
    )
    assert code == 0, err
    code, _, err, sens = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.6",
        "--choices",
        "int8,int4-g32",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 0, err
    mp = data["mixed_precision"]
    assert mp["picked"] and sens["picked"] == mp["picked"] and sens["overrides"] == mp["overrides"]
    assert sens["bits_per_weight"] == mp["bits_per_weight"]
    # convert measures a unit's choices only where a solution raises it (auto.lazy_choice): the same base KLs
    assert {(r["layer"], r["unit"]): r["kl"] for r in sens["ranking"]} == {
        (r["layer"], r["unit"]): r["kl"] for r in mp["ranking"]
    }
    assert mp["search"] == "lazy" and mp["measured"]["unit_forwards"] <= sens["measured"]["unit_forwards"]


def test_int4_g32_choices_mix_group_sizes_and_reload(cli, tiny_llama, tiny_text, tmp_path):
    """The vLLM-CPU recipe: rotations, asymmetric GPTQ g64 and units raised to symmetric INT4 g32
    in one checkpoint; transformers reloads it (the convert's reload check) and no weight is INT8."""
    out = tmp_path / "art"
    code, _, err, data = convert(
        cli,
        "int4-w4a16-spinquant-gptq-asym-auto-vllm",
        tiny_llama,
        out,
        tiny_text,
        "--set",
        "steps[1].quantize.auto.windows=2",
        "--set",
        "steps[1].quantize.auto.seq_len=64",
        "--set",
        "steps[1].quantize.auto.budget_bits=4.4",
    )
    assert code == 0, err
    assert data["verification"]["status"] == "passed" and data["verification"]["mean_kl"] <= 1e-3
    mp = data["mixed_precision"]
    assert mp["picked"] and {p["scheme"] for p in mp["picked"]} == {"int4-g32"} and "rotation" in mp["measured_on"]
    weights = [
        g["weights"]
        for g in json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"].values()
    ]
    assert {(w["num_bits"], w["group_size"], w["symmetric"]) for w in weights} == {(4, 64, False), (4, 32, True)}
    assert (
        mp["measured_bits_per_weight"] == pytest.approx(mp["bits_per_weight"], abs=1e-6)
        and mp["measured_bits_per_weight"] <= 4.4
    )


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            (
                "--set",
                "steps[0].quantize.ignore=[lm_head, 're:.*self_attn.*']",
                "--set",
                AUTO % ("4.6", ", units: [qkv, o]"),
            ),
            "steps[0].quantize.auto.units: every qkv, o unit of this model is in ignore",
        ),
        (
            ("--set", AUTO % ("4.6", ""), "--max-memory", "100KB"),
            "auto: mixed precision runs a forward of the whole model",
        ),
        (
            ("--set", "steps[0].quantize.auto={budget_bits: 4.6, seq_len: 2048}"),
            "auto.seq_len 2048 is longer than the model's context",
        ),
    ],
)
def test_refused_before_loading(cli, tiny_llama, tiny_text, tmp_path, monkeypatch, extra, message):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, tmp_path / "x", tiny_text, *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_a_budget_below_this_models_floor_is_refused_before_loading(cli, tiny_dir, tiny_text, tmp_path):
    """A float32 checkpoint stores 32-bit scales: INT4 g64 takes 4.5 bits per weight there, so a
    budget the recipe accepts (>= 4.25) can be below what the model needs."""
    src = _float32(tiny_dir, tmp_path, "llama-gqa")
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", src, tmp_path / "x", tiny_text, "--set", AUTO % ("4.4", ""))
    assert code == 2 and "auto.budget_bits 4.4: below 4.5000 bits/weight" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_a_choice_group_that_does_not_divide_is_refused(cli, tiny_dir, tiny_text, tmp_path):
    import transformers
    from fixtures import build_checkpoint

    src = tmp_path / "odd"
    build_checkpoint(src, "llama-gqa", tiny_dir / "tokenizer")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_size=96, head_dim=24, intermediate_size=192)
    config = transformers.LlamaConfig(
        **{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")}
    )
    transformers.LlamaForCausalLM(config).save_pretrained(str(src))
    code, _, err, _ = convert(
        cli,
        "int4-w4a16-rtn",
        src,
        tmp_path / "x",
        tiny_text,
        "--set",
        "steps[0].quantize.group_size=32",
        "--set",
        AUTO % ("5", ", choices: [int8-g64]"),
    )
    assert code == 2 and "int8-g64: group 64 does not divide the 96 input columns" in err, err


def test_torchrun_refuses_auto():
    from types import SimpleNamespace

    from quantkit.errors import QuantkitError
    from quantkit.quantize.job import check_torchrun

    job = SimpleNamespace(
        key="steps", has_gqa=False, method=SimpleNamespace(torchrun=True), offload=None, auto=object(), quant=None
    )
    with pytest.raises(QuantkitError, match="auto mixed precision measures the units in one process"):
        check_torchrun(job)


# ---------------------------------------------------------------- the shipped recipes


def test_no_shipped_recipe_names_a_layer():
    """Layer numbers belong to one model: a recipe that lists them is wrong on every other one."""
    import re

    index = re.compile(r"layers\\*\.(\(|\[?[0-9])")
    shipped = sorted([*RECIPES.glob("*.yaml"), *STUDIES.glob("*.yaml")])  # recipes and lever studies
    assert shipped
    found = [(p.name, line) for p in shipped for line in p.read_text().splitlines() if index.search(line)]
    assert not found, found
    assert index.search(r'targets: ["model\\.layers\\.(1|3)\\.self_attn"]') and index.search("model.layers.0.mlp")
    # the hand-picked targets the best-INT4 benchmark compares auto with (given by --set, never in a file) are caught
    assert index.search(
        'targets: ["model\\\\.layers\\\\.(1|12|13|14|15|16|17|19|23)\\\\.self_attn\\\\.(q_proj|k_proj|v_proj)$"]'
    )


def test_the_mixed_recipes_choose_on_the_model():
    from quantkit.methods.method_registry import quantize_step
    from quantkit.recipe.files import load_recipe

    mixed = sorted(RECIPES.glob("int4-*-mixed.yaml")) + [RECIPES / "int4-w4a16-spinquant-gptq-asym-auto-vllm.yaml"]
    assert len(mixed) == 5
    for p in mixed:
        q = quantize_step(load_recipe(p).all_variants()[0])
        assert q.auto is not None and not q.overrides and 4.49 <= q.auto.budget_bits <= 4.5, p.name
    suite = load_recipe(RECIPES / "suite-gqa.yaml")
    assert any(getattr(quantize_step(v), "auto", None) is not None for v in suite.all_variants())


# ---------------------------------------------------------------- a TPOT target as the budget


SHAPES = [  # (vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, tied)
    (384, 64, 160, 2, 4, 2, 16, True),
    (32000, 4096, 14336, 32, 32, 8, 128, False),
    (151936, 896, 4864, 24, 14, 2, 64, True),
]


@pytest.mark.parametrize("dims", SHAPES)
@pytest.mark.parametrize("bits,context", [(4.25, 0), (4.5, 2048), (8.0, 131)])
def test_the_tpot_budget_is_the_roofline_inverted(dims, bits, context):
    """A model whose decoder linears take `bits` per weight reads decode_bytes per step: the TPOT
    that takes on a device gives back exactly those bits."""
    from quantkit.core.roofline import Layout, Shape, WeightFormat, decode_bytes, linear_bits_for_tpot

    shape = Shape(*dims)
    bw = 3.35e12
    tpot = decode_bytes(shape, Layout(linear=WeightFormat(bits, 0)), context) / bw
    assert linear_bits_for_tpot(shape, tpot, bw, context) == pytest.approx(bits, rel=1e-9)
    assert linear_bits_for_tpot(shape, tpot * 0.9, bw, context + 1000) < bits  # less time, a longer context: fewer bits


@pytest.mark.parametrize(
    "auto,message",
    [
        ({"budget_bits": 4.5, "budget_tpot_ms": 5, "device": "h100"}, "give one budget"),
        ({}, "give one budget"),
        ({"budget_tpot_ms": 5}, "needs device"),
        ({"budget_tpot_ms": 5, "device": "tpu9000"}, "unknown device"),
        ({"budget_bits": 4.5, "device": "h100"}, "belong to budget_tpot_ms"),
        ({"budget_tpot_ms": -1, "device": "h100"}, "greater than 0"),
    ],
)
def test_a_tpot_budget_is_validated_when_the_recipe_is_read(auto, message):
    from quantkit.methods.schemes import AutoMixed

    with pytest.raises(ValueError, match=message):
        AutoMixed.model_validate(auto)


def _tpot_ms_for(model: Path, bits: float, device: str, context: int) -> float:
    from quantkit.core.hardware import get_device
    from quantkit.core.roofline import Layout, Shape, WeightFormat, decode_bytes

    shape = Shape.from_config(json.loads((model / "config.json").read_text()))
    return 1e3 * decode_bytes(shape, Layout(linear=WeightFormat(bits, 0)), context) / get_device(device).bandwidth


def test_convert_meets_a_tpot_target_through_the_roofline(cli, tiny_llama, tiny_text, tmp_path):
    """The recipe names a TPOT on a device; the artifact's bits stay within the bits that TPOT
    allows this model, and quantkit.json says how the budget was derived."""
    tpot = _tpot_ms_for(tiny_llama, 4.7, "l4", 256)
    auto = "steps[0].quantize.auto={budget_tpot_ms: %r, device: l4, context: 256, windows: 2, seq_len: 64}" % tpot
    code, _, err, data = convert(cli, "int4-w4a16-rtn", tiny_llama, tmp_path / "art", tiny_text, "--set", auto)
    assert code == 0, err
    mp = data["mixed_precision"]
    assert (
        mp["budget_from"]["device"] == "l4"
        and mp["budget_from"]["context"] == 256
        and mp["budget_from"]["budget_tpot_ms"] == tpot
    )
    assert (
        mp["budget_bits"] == pytest.approx(4.7, rel=1e-9)
        and mp["measured_bits_per_weight"] <= mp["budget_bits"]
        and mp["picked"]
    )


def test_a_tpot_target_this_model_cannot_meet_is_refused_before_loading(
    cli, tiny_llama, tiny_text, tmp_path, monkeypatch
):
    import quantkit.quantize.convert as qc

    monkeypatch.setattr(qc, "load_model", lambda *a, **k: pytest.fail("loaded the model before checking"))
    tpot = _tpot_ms_for(tiny_llama, 3.0, "h200", 0)  # below INT4 g64's floor
    auto = "steps[0].quantize.auto={budget_tpot_ms: %r, device: h200}" % tpot
    code, _, err, _ = convert(cli, "int4-w4a16-rtn", tiny_llama, tmp_path / "art", tiny_text, "--set", auto)
    assert (
        code == 2
        and len(err.strip().splitlines()) == 1
        and "budget_tpot_ms" in err
        and "on h200" in err
        and "below" in err
    )
    assert not (tmp_path / "art").exists()


ROTATED = """description: rotations, then RTN g64 with auto
steps:
  - transform: {method: spinquant, rotations: [R1, R2], transform_type: random-hadamard}
  - quantize: {method: rtn, bits: 4, group_size: 64, symmetric: false%s}
calibration: {samples: 8, seq_len: 64, compute_dtype: float32}
"""


def _rotated(tmp_path, auto: str = "") -> Path:
    path = tmp_path / f"rotated{len(auto)}.yaml"
    path.write_text(ROTATED % auto)
    return path


def test_a_rotated_recipe_measures_after_the_rotation_as_sensitivity_spinquant_does(
    cli, tiny_llama, tiny_text, tmp_path
):
    """With a transform step, auto: measures the weights the rounding will see (the rotation fused
    first); `quantkit sensitivity --spinquant` measures the same and prints the same choice."""
    out = tmp_path / "art"
    code, _, err, data = cli(
        "convert",
        str(_rotated(tmp_path, ", auto: {budget_bits: 4.6, windows: 2, seq_len: 64}")),
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--json",
    )
    assert code == 0, err
    mp = data["mixed_precision"]
    assert "after its rotation" in mp["measured_on"] and data["verification"]["status"] == "passed"
    assert "transform_config" in json.loads((out / "config.json").read_text())["quantization_config"]
    code, _, err, sens = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.6",
        "--asymmetric",
        "--spinquant",
        "R1,R2",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 0, err
    assert sens["rotations"] == ["R1", "R2"] and mp["picked"] and sens["picked"] == mp["picked"]
    assert {(r["layer"], r["unit"]): r["kl"] for r in sens["ranking"]} == {
        (r["layer"], r["unit"]): r["kl"] for r in mp["ranking"]
    }
    code, _, err, plain = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.6",
        "--asymmetric",
        "--text",
        f"file:{tiny_text}",
        "--windows",
        "2",
        "--seq-len",
        "64",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 0 and plain["rotations"] == [] and plain["ranking"] != sens["ranking"]


def test_fusing_the_rotation_first_changes_nothing_else(cli, tiny_llama, tiny_text, tmp_path):
    """A budget at the floor raises nothing: the artifact whose rotation ran before auto: equals,
    weight for weight, the one whose rotation ran inside the quantize pass (no auto:)."""
    from safetensors.torch import load_file

    arts, meta = [], []
    for auto in (", auto: {budget_bits: 4.3125, windows: 2, seq_len: 64}", ""):
        out = tmp_path / f"art{len(auto)}"
        code, _, err, data = cli(
            "convert",
            str(_rotated(tmp_path, auto)),
            "--model",
            str(tiny_llama),
            "--out",
            str(out),
            "--calib",
            f"file:{tiny_text}",
            "--json",
        )
        assert code == 0, err
        arts.append(load_file(out / "model.safetensors"))
        meta.append(data)
    assert meta[0]["mixed_precision"]["picked"] == [] and meta[0]["mixed_precision"]["measured_on"].startswith(
        "the model after its rotation"
    )
    assert meta[1].get("mixed_precision") is None and arts[0].keys() == arts[1].keys()
    assert all(arts[0][k].equal(arts[1][k]) for k in arts[0])


@pytest.mark.parametrize(
    "rotations,message", [("R3", "online"), ("R1,R9", "no rotation 'R9'"), ("R1,R1", "at most once")]
)
def test_sensitivity_refuses_a_rotation_it_cannot_fuse(cli, tiny_llama, tiny_text, rotations, message):
    code, _, err, _ = cli(
        "sensitivity",
        str(tiny_llama),
        "--budget",
        "4.6",
        "--spinquant",
        rotations,
        "--text",
        f"file:{tiny_text}",
        "--device",
        "cpu",
        "--json",
    )
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def _plan(cli, model, text, tmp_path, auto: str):
    code, _, err, plan = cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(model),
        "--out",
        str(tmp_path / "art"),
        "--calib",
        f"file:{text}",
        "--set",
        f"steps[0].quantize.auto={{{auto}, windows: 2, seq_len: 64}}",
        "--plan",
        "--json",
    )
    assert code == 0, err
    return plan


@pytest.mark.parametrize(
    "budget",
    [
        "device: h100, budget_tpot_ms: 1000",
        "device: h100, budget_tpot_ms: 1.0e+308",
        "device: h100, budget_tpot_ms: 1",
        "device: a100, budget_tpot_ms: 5, context: 4096",
        "budget_bits: 16",
    ],
    ids=["tpot-1000", "tpot-1e308", "tpot-1-h100", "tpot-a100-context", "bits-16"],
)
def test_a_budget_buys_at_most_every_unit_at_its_widest_choice(cli, tiny_llama, tiny_text, tmp_path, budget):
    """A budget every variant meets translated into thousands of bits per weight: --plan reported a
    3,350 GB artifact for a 200 KB model ("DOES NOT FIT") and convert refused for 3,517 GB."""
    widest = _plan(cli, tiny_llama, tiny_text, tmp_path, "budget_bits: 8.5")  # int8 per channel: 8 + 16/128
    plan = _plan(cli, tiny_llama, tiny_text, tmp_path, budget)
    assert plan["fits"] and not plan["problems"], plan["problems"]
    assert plan["stages"]["artifact"] == widest["stages"]["artifact"] < plan["model"]["weight_bytes"]
    assert plan["disk"] < 64 << 20


def test_a_budget_beyond_the_widest_choices_converts_with_every_unit_raised(cli, tiny_llama, tiny_text, tmp_path):
    out = tmp_path / "art"
    code, _, err, data = convert(
        cli,
        "int4-w4a16-rtn",
        tiny_llama,
        out,
        tiny_text,
        "--set",
        "steps[0].quantize.auto={device: h100, budget_tpot_ms: 1000, windows: 2, seq_len: 64}",
    )
    assert code == 0, err
    mp = data["mixed_precision"]
    assert mp["budget_asked_bits"] > 1000 and mp["bits_per_weight"] <= mp["budget_bits"] < 8.2  # int8 + scales
    assert mp["picked"] and data["verification"]["status"] == "passed"
    assert "capped at what the widest choices take" in err
