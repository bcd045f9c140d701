"""What the model card claims about vLLM (quantkit/external/vllm_support.py): each kind of artifact
quantkit writes records its schemes as facts, a table of rules keyed by those facts decides where
vLLM serves them (an unknown scheme nowhere), the CPU column is the measured compatibility table
(benchmarks/results/vllm_compat.json), and the card claims vLLM loading per device from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.artifacts.card import render_card
from quantkit.external import vllm_support
from quantkit.models import scheme_facts
from quantkit.models.scheme_facts import DENSE, SchemeFacts

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "vllm_compat.json"
SMALL_CALIB = ["--set", "calibration.samples=4", "--set", "calibration.seq_len=64"]


@pytest.fixture(scope="module")
def measured() -> dict:
    """The compatibility run's kinds; a missing or unreadable file fails (the table must be committed)."""
    return json.loads(RESULT.read_text())["kinds"]


def row_facts(row: dict) -> list[SchemeFacts]:
    return [SchemeFacts.from_dict(d) for d in row.get("facts") or []]


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
    ("nvfp4-w4a16", [], ["nvfp4-w4a16"]),
    ("mxfp4-w4a16", [], ["mxfp4-w4a16"]),
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
    found = vllm_support.schemes(meta)
    assert [f.label for f in found] == expected and found == scheme_facts.of_checkpoint(out)
    card = (out / "README.md").read_text()
    verdict = vllm_support.verdict(found)
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
    labels = [f.label for f in vllm_support.schemes(meta)]
    assert labels == (["int4-w4a16", "int8-w8a16"] if raised else ["int4-w4a16"])
    assert raised, "a budget of 6 bits/weight over INT4 g64 raises at least one unit"


def test_a_16_bit_artifact_is_served_everywhere_and_a_scheme_no_rule_matches_nowhere():
    assert vllm_support.schemes({"quantization": None}) == [DENSE]
    assert vllm_support.verdict([DENSE]) == {"cpu": True, "gpu": True, "unknown": []}
    int4, int2 = scheme_facts.int_weights(4, 64, True), scheme_facts.int_weights(2, 32, True)
    assert vllm_support.verdict([int4, int2]) == {"cpu": False, "gpu": False, "unknown": ["int2-w2a16"]}
    unrecorded = {"name": "x", "quantization": {"format": "compressed-tensors", "weight_bits": 4, "scheme": "W4A16"}}
    assert "does not load it" in render_card(unrecorded)  # a quantkit.json without facts: nothing claimed


@pytest.mark.parametrize(
    "facts",
    [
        scheme_facts.unknown("gptq"),
        SchemeFacts("compressed-tensors", "mxfp4", 4, "group", 32, False, "e8m0"),  # asymmetric: not vLLM's MXFP4
        SchemeFacts("compressed-tensors", "nvfp4", 4, "tensor_group", 16, True, "float8_e4m3fn", "nvfp4", 4, True),
        SchemeFacts("compressed-tensors", "int", 8, "channel", None, True, "float", "int", 8, False),  # static acts
        SchemeFacts("gptq", "int", 4, "group", 128, True, "float"),  # the same grid in another tool's container
    ],
    ids=["unknown", "asymmetric-mxfp4", "nvfp4-w4a4", "static-w8a8", "other-container"],
)
def test_the_rules_decide_on_facts_and_claim_nothing_they_do_not_cover(facts):
    """A scheme is decided by the first rule whose every stated fact agrees; facts no rule covers are
    unknown and served nowhere, whatever a name would suggest."""
    assert vllm_support.rule_for(facts) is None
    assert vllm_support.verdict([facts]) == {"cpu": False, "gpu": False, "unknown": [facts.label]}


def test_the_fp4_formats_are_decided_by_their_own_rules():
    nv, mx = vllm_support.rule_for(scheme_facts.NVFP4), vllm_support.rule_for(scheme_facts.MXFP4)
    assert nv is not mx and nv.weights == "nvfp4" and mx.weights == "mxfp4"
    assert (nv.support.cpu, nv.support.gpu, mx.support.cpu, mx.support.gpu) == (False, True, False, True)
    assert "sm90" in nv.support.gpu_why and "sm100" in nv.support.gpu_why and "sm90" in mx.support.gpu_why
    card = render_card({"name": "x", "quantization": {"weights": [scheme_facts.MXFP4.as_dict()]}})
    assert "serves it on NVIDIA GPUs" in card and "mxfp4-w4a16" in card and "no CPU entry" in card


# ---- the table in the product is the measured one ---------------------------------------------


def test_the_cpu_column_is_what_the_compatibility_run_measured(measured):
    """Every measured artifact: vLLM served it on the CPU exactly when the rules say all its schemes are served."""
    rows = [r for r in measured.values() if "served" in r]
    assert rows, "the compatibility run loaded no artifact in vLLM"
    for r in rows:
        facts = row_facts(r)
        assert facts and list(dict.fromkeys(f.label for f in facts)) == r["schemes"], r["kind"]
        assert vllm_support.verdict(facts)["cpu"] == r["served"], (r["kind"], r["schemes"], r.get("vllm"))


def test_every_cpu_claim_was_measured(measured):
    """No CPU claim is read rather than measured: a rule that serves on the CPU decided alone an
    artifact vLLM served; every rule that decided an artifact alone has the CPU value it was
    measured with; a rule no artifact exercised says so and claims nothing."""
    alone: dict[int, set[bool]] = {}
    for r in measured.values():
        rules = {vllm_support.RULES.index(vllm_support.rule_for(f)) for f in row_facts(r) if vllm_support.rule_for(f)}
        if "served" in r and len(rules) == 1:
            alone.setdefault(rules.pop(), set()).add(r["served"])
    for i, rule in enumerate(vllm_support.RULES):
        if i in alone:
            assert alone[i] == {rule.support.cpu}, (rule.what, alone[i])
        else:
            assert not rule.support.cpu and "not measured" in rule.support.cpu_why, rule.what


def test_refused_kinds_carry_vllms_own_error(measured):
    for r in measured.values():
        if r.get("served") is False:
            assert r["vllm"]["error"] and "engines install" not in r["vllm"]["error"], (
                r
            )  # vLLM's message, not quantkit's hint


def test_a_kv_cache_scheme_is_decided_by_its_own_rules_and_an_unknown_one_nowhere():
    from quantkit.models.kv_scheme import KvCacheFacts

    per_tensor, per_head = KvCacheFacts("fp8_e4m3", "tensor", True, 8), KvCacheFacts("fp8_e4m3", "attn_head", True, 8)
    assert vllm_support.kv_rule_for(per_tensor) is not vllm_support.kv_rule_for(per_head)
    assert vllm_support.verdict([DENSE], per_tensor) == {"cpu": True, "gpu": True, "unknown": []}
    odd = KvCacheFacts("int4", "token", False, 4)  # no rule: claimed nowhere, whatever the weights
    assert vllm_support.kv_rule_for(odd) is None
    assert vllm_support.verdict([DENSE], odd) == {"cpu": False, "gpu": False, "unknown": [odd.label]}
    meta = {"quantization": {"kv_cache": per_head.as_dict()}}
    assert vllm_support.kv_facts(meta) == per_head and vllm_support.kv_facts({"quantization": {}}) is None
    assert vllm_support.kv_facts({"quantization": {"kv_cache": {"junk": 1}}}).known is False
