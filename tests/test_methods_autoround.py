"""methods/autoround.py: AutoRound through llm-compressor, its presets and its bad input."""

import json

import pytest
from fixtures import RECIPES

AUTOROUND = "steps[0].quantize={method: autoround, bits: 4, group_size: 64, iters: 10}"


def convert(cli, model, out, text, *sets):
    return cli(
        "convert",
        str(RECIPES / "int4-w4a16-rtn.yaml"),
        "--model",
        str(model),
        "--out",
        str(out),
        "--calib",
        f"file:{text}",
        "--set",
        "calibration.samples=8",
        "--set",
        "calibration.seq_len=64",
        *sets,
        "--json",
    )


def test_presets_fill_iters_and_lr_from_auto_round_docs():
    from quantkit.recipe.files import recipe_from_dict

    def q(**kw):
        return recipe_from_dict({"steps": [{"quantize": {"method": "autoround", **kw}}]}).steps[0].quantize

    assert (q().iters, q().lr) == (200, 1 / 200)  # auto-round "default": lr 1/iters
    assert (q(preset="light").iters, q(preset="light").lr) == (50, 5e-3)
    assert (q(preset="best").iters, q(preset="best").lr) == (1000, 1 / 1000)
    assert (q(preset="light", iters=80).lr, q(iters=80, lr=0.02).lr) == (
        1 / 80,
        0.02,
    )  # an explicit iters re-derives lr
    assert q(preset="best").resolved_samples(128) == 128 and q(preset="best").resolved_samples(1024) == 512
    assert q(samples=16).resolved_samples(128) == 16


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("iters", "0", "steps[0].quantize.iters: input should be greater than or equal to 1"),
        ("iters", "-3", "steps[0].quantize.iters: input should be greater than or equal to 1"),
        ("lr", "0", "steps[0].quantize.lr: input should be greater than 0"),
        ("samples", "0", "steps[0].quantize.samples: input should be greater than or equal to 1"),
        ("preset", "fast", "steps[0].quantize.preset: must be one of"),
    ],
)
def test_bad_knobs_are_one_line_at_the_recipe_edge(cli, tiny_llama, tiny_text, tmp_path, key, value, message):
    code, out, err, _ = convert(
        cli, tiny_llama, tmp_path / "a", tiny_text, "--set", AUTOROUND, "--set", f"steps[0].quantize.{key}={value}"
    )
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()


def test_more_samples_than_calibration_windows_is_refused_before_loading(
    cli, tiny_llama, tiny_text, tmp_path, monkeypatch
):
    import quantkit.quantize.convert

    monkeypatch.setattr(quantkit.quantize.convert, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    code, _, err, _ = convert(
        cli, tiny_llama, tmp_path / "a", tiny_text, "--set", AUTOROUND, "--set", "steps[0].quantize.samples=9"
    )
    assert code == 2 and "samples: 9 tuning samples, but calibration.samples gives only 8" in err


def test_autoround_with_int8_override_converts_and_verifies(cli, tiny_llama, tiny_text, tmp_path):
    """Mixed precision through AutoRound's layer_config; q/k/v stay one unit (vLLM fuses them)."""
    out = tmp_path / "a"
    ov = (
        "steps[0].quantize.overrides=[{targets: "
        '["model\\\\.layers\\\\.1\\\\.self_attn\\\\.(q_proj|k_proj|v_proj)$"], bits: 8}]'
    )
    code, _, err, data = convert(
        cli, tiny_llama, out, tiny_text, "--set", AUTOROUND, "--set", "steps[0].quantize.samples=4", "--set", ov
    )
    assert code == 0, err
    assert data["verification"]["status"] == "passed" and data["quantization"]["method"] == "autoround"
    assert data["runtime"]["autoround_seed"] == 42  # auto-round 0.15's default, read from auto-round itself
    q = json.loads((out / "quantkit.json").read_text())["recipe"]["steps"][0]["quantize"]
    assert (q["iters"], q["lr"], q["samples"], q["preset"]) == (10, 0.1, 4, "default")
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert {g["weights"]["num_bits"] for g in groups.values()} == {4, 8}
