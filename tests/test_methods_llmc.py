"""llm-compressor's weight schemes as a recipe sets them: the observer that picks each group's range."""

import json
from pathlib import Path

import pytest
from fixtures import RECIPES

RTN = str(RECIPES / "int4-w4a16-rtn.yaml")


def _rounding_error(art: Path, src: Path) -> float:
    """Summed squared error of the artifact's dequantized decoder linears against the source's weights."""
    from safetensors.torch import load_file

    from quantkit.bench.loader import _group_of, _unpack

    sd, orig = load_file(art / "model.safetensors"), load_file(src / "model.safetensors")
    qcfg = json.loads((art / "config.json").read_text())["quantization_config"]
    total = 0.0
    for key in [k for k in sd if k.endswith(".weight_scale")]:
        prefix = key.removesuffix("weight_scale")
        q, scale, zp = _unpack(sd, prefix, _group_of(prefix.rstrip("."), qcfg))
        group = q.shape[1] // scale.shape[1]
        codes = q.float() - (zp.float().repeat_interleave(group, 1) if zp is not None else 0)
        w = codes * scale.float().repeat_interleave(group, 1)
        total += float(((w - orig[prefix + "weight"].float()) ** 2).sum())
    return total


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_mse_observer_reaches_the_artifact_and_rounds_closer(cli, tiny_llama, tmp_path, symmetric):
    """observer: mse is written into every config group (the base scheme's and a mixed-precision
    override's) and shrinks ranges where that rounds the weights closer: the whole model's rounding
    error falls below min/max ranges' (same RTN)."""
    errors = {}
    for observer in ("minmax", "mse"):
        out = tmp_path / observer
        code, _, err, data = cli(
            "convert",
            RTN,
            "--model",
            str(tiny_llama),
            "--out",
            str(out),
            "--set",
            f"steps[0].quantize.observer={observer}",
            "--set",
            f"steps[0].quantize.symmetric={str(symmetric).lower()}",
            "--set",
            'steps[0].quantize.overrides=[{targets: [".*(q_proj|k_proj|v_proj)$"], bits: 8, group_size: -1}]',
            "--json",
        )
        assert code == 0 and data["verification"]["status"] == "passed", err
        groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
        assert len(groups) == 2 and {g["weights"]["num_bits"] for g in groups.values()} == {4, 8}
        assert {g["weights"]["observer"] for g in groups.values()} == {
            "mse" if observer == "mse" else "memoryless_minmax"
        }
        errors[observer] = _rounding_error(out, tiny_llama)
    assert errors["mse"] < 0.98 * errors["minmax"], errors


def test_an_unknown_observer_is_refused(cli, tiny_llama, tmp_path):
    code, _, err, _ = cli(
        "convert",
        RTN,
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "x"),
        "--set",
        "steps[0].quantize.observer=l2",
        "--json",
    )
    assert code == 2 and "observer" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()
