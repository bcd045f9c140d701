"""What the model card claims about vLLM (quantkit/external/vllm_support.py): each kind of artifact
quantkit writes maps to its weight schemes, the CPU column is the measured compatibility table
(benchmarks/results/vllm_compat.json), and the card claims vLLM loading per device from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.artifacts.card import render_card
from quantkit.external import vllm_support

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "vllm_compat.json"
SMALL_CALIB = ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64"]


@pytest.fixture(scope="module")
def measured() -> dict:
    """The compatibility run's kinds; a missing or unreadable file fails (the table must be committed)."""
    return json.loads(RESULT.read_text())["kinds"]


# ---- each kind of artifact, converted for real on a tiny model --------------------------------

KINDS = [
    ("int4-w4a16-rtn", [], ["int4-w4a16"]),
    (
        "int4-w4a16-rtn",
        ["--set", "steps[0].quantize.symmetric=false", "--set", "steps[0].quantize.group_size=32"],
        ["int4-w4a16"],
    ),
    (
        "int4-w4a16-rtn",
        ["--set", "steps[0].quantize.bits=8", "--set", "steps[0].quantize.group_size=-1"],
        ["int8-w8a16"],
    ),
    (
        "int4-w4a16-rtn",
        ["--set", 'steps[0].quantize.overrides=[{"targets": [".*down_proj$"], "bits": 8}]'],
        ["int4-w4a16", "int8-w8a16"],
    ),
    ("int8-w8a8-smoothquant", SMALL_CALIB, ["int8-w8a8"]),
    ("fp8-w8a8-dynamic", [], ["fp8-w8a8"]),
    ("fp8-w8a16", [], ["fp8-w8a16"]),
    ("bnb-nf4", [], ["bitsandbytes"]),
]


@pytest.mark.parametrize(
    "recipe,sets,expected", KINDS, ids=[f"{r}{'+' + str(i) if s else ''}" for i, (r, s, _) in enumerate(KINDS)]
)
def test_each_artifact_kind_names_its_schemes_and_its_card_claims_them(
    cli, tiny_llama, tiny_text, tmp_path, recipe, sets, expected
):
    out = tmp_path / "art"
    code, _, err, _ = cli(
        "convert",
        recipe,
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        *sets,
        "--json",
    )
    assert code == 0, err
    meta = json.loads((out / "quantkit.json").read_text())
    assert vllm_support.schemes(meta) == expected
    card = (out / "README.md").read_text()
    verdict = vllm_support.verdict(expected)
    assert ("on the CPU (measured" in card) == verdict["cpu"]
    assert ("; on the CPU: " in card) == (verdict["gpu"] and not verdict["cpu"])
    assert ("does not load it" in card) == (not verdict["gpu"])


def test_an_auto_mixed_precision_counts_the_schemes_it_chose(cli, tiny_llama, tiny_text, tmp_path):
    """An auto step's choice is written into the config it ran with: INT8 units make an INT4 artifact W8A16 too."""
    out = tmp_path / "art"
    code, _, err, _ = cli(
        "convert",
        "int4-w4a16-rtn",
        "--model",
        str(tiny_llama),
        "--out",
        str(out),
        "--calib",
        f"file:{tiny_text}",
        "--set",
        'steps[0].quantize.auto={"budget_bits": 6.0, "choices": ["int8"], "windows": 2, "seq_len": 64}',
        *SMALL_CALIB,
        "--json",
    )
    assert code == 0, err
    meta = json.loads((out / "quantkit.json").read_text())
    raised = bool((meta.get("mixed_precision") or {}).get("picked"))
    assert vllm_support.schemes(meta) == (["int4-w4a16", "int8-w8a16"] if raised else ["int4-w4a16"])
    assert raised, "a budget of 6 bits/weight over INT4 g64 raises at least one unit"


def test_a_16_bit_artifact_is_served_everywhere_and_a_scheme_not_in_the_table_nowhere():
    assert vllm_support.schemes({"quantization": None}) == ["16-bit"]
    assert vllm_support.verdict(["16-bit"]) == {"cpu": True, "gpu": True, "unknown": []}
    assert vllm_support.verdict(["int4-w4a16", "int2-w2a16"]) == {"cpu": False, "gpu": False, "unknown": ["int2-w2a16"]}
    assert "does not load it" in render_card(
        {"name": "x", "quantization": {"format": "compressed-tensors", "weight_bits": 2, "scheme": "W2A16"}}
    )


# ---- the table in the product is the measured one ---------------------------------------------


def test_the_cpu_column_is_what_the_compatibility_run_measured(measured):
    """Every measured artifact: vLLM served it on the CPU exactly when SUPPORT says all its schemes are served."""
    rows = [r for r in measured.values() if "served" in r]
    assert rows, "the compatibility run loaded no artifact in vLLM"
    for r in rows:
        assert vllm_support.verdict(r["schemes"])["cpu"] == r["served"], (r["kind"], r["schemes"], r.get("vllm"))


def test_every_cpu_claim_was_measured(measured):
    """No CPU claim is read rather than measured: a scheme SUPPORT serves on the CPU occurs alone in
    an artifact vLLM served; every scheme measured alone has the CPU value it was measured with."""
    alone = {
        r["schemes"][0]: r["served"] for r in measured.values() if len(r.get("schemes") or []) == 1 and "served" in r
    }
    claimed = {s for s, sup in vllm_support.SUPPORT.items() if sup.cpu}
    assert claimed <= {s for s, served in alone.items() if served}, claimed - set(alone)
    assert all(vllm_support.SUPPORT[s].cpu == served for s, served in alone.items())
    unmeasured = set(vllm_support.SUPPORT) - set(alone)
    assert all("not measured" in vllm_support.SUPPORT[s].cpu_why for s in unmeasured), unmeasured


def test_refused_kinds_carry_vllms_own_error(measured):
    for r in measured.values():
        if r.get("served") is False:
            assert r["vllm"]["error"] and "engines install" not in r["vllm"]["error"], (
                r
            )  # vLLM's message, not quantkit's hint
