"""Scheme facts (models/scheme_facts.py): what a config.json's quantization_config declares, read as
typed facts (weight format, bits, groups, symmetry, scales, activations, dynamic or not), the same
facts every method config states for the groups it builds, and anything unrecognised as unknown."""

import pytest

from quantkit.methods import llmc
from quantkit.models import scheme_facts
from quantkit.models.scheme_facts import DENSE, MXFP4, NVFP4, SchemeFacts


def ct_config(groups: dict, fmt: str = "pack-quantized") -> dict:
    """A compressed-tensors quantization_config as save_pretrained writes it, from QuantizationSchemes."""
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {name: g.model_dump(mode="json") for name, g in groups.items()},
    }


def preset(name: str) -> dict:
    from compressed_tensors.quantization import preset_name_to_scheme

    return ct_config({"group_0": preset_name_to_scheme(name, ["Linear"])})


# ---- facts from configs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "config,expected",
    [
        (lambda: preset("W4A16"), scheme_facts.int_weights(4, 128, True)),
        (lambda: preset("W4A16_ASYM"), scheme_facts.int_weights(4, 128, False)),
        (lambda: preset("W8A16"), scheme_facts.int_weights(8, 128, True)),
        (lambda: preset("W8A8"), scheme_facts.int_weights(8, -1, True, ("int", 8, True))),
        (lambda: preset("FP8_DYNAMIC"), scheme_facts.fp8_weights(dynamic_activations=True)),
        (lambda: preset("NVFP4A16"), NVFP4),
        (lambda: preset("MXFP4A16"), MXFP4),
    ],
    ids=["int4-g128", "int4-asym", "int8-g128", "int8-w8a8", "fp8-dynamic", "nvfp4", "mxfp4"],
)
def test_compressed_tensors_presets_read_as_their_facts(config, expected):
    assert scheme_facts.from_quantization_config(config()) == [expected]


def test_the_fp4_facts_are_what_their_formats_are():
    assert (NVFP4.weights, NVFP4.bits, NVFP4.strategy, NVFP4.group_size, NVFP4.scales) == (
        "nvfp4",
        4,
        "tensor_group",  # groups of 16 and one FP32 scale per tensor
        16,
        "float8_e4m3fn",
    )
    assert (MXFP4.weights, MXFP4.bits, MXFP4.strategy, MXFP4.group_size, MXFP4.scales) == (
        "mxfp4",
        4,
        "group",
        32,
        "e8m0",
    )
    assert NVFP4.activations == MXFP4.activations == "16-bit"
    assert NVFP4.label == "nvfp4-w4a16" and MXFP4.label == "mxfp4-w4a16"


def test_every_method_config_states_the_facts_of_the_groups_it_builds():
    """A config's facts (what quantkit.json and the plan read before any conversion) are those of the
    compressed-tensors groups its handler hands llm-compressor (what the artifact's config.json declares)."""
    from quantkit.recipe.files import recipe_from_dict

    def cfg(**q):
        return recipe_from_dict({"steps": [{"quantize": q}]}).steps[0].quantize

    overrides = [{"targets": [".*down_proj$"], "bits": 8}]
    cases = [
        (cfg(method="rtn", bits=4, group_size=64, symmetric=False, overrides=overrides), llmc.weight_groups),
        (cfg(method="gptq", bits=8, group_size=-1), llmc.weight_groups),
        (cfg(method="w8a8"), lambda c: llmc.w8a8_groups()),
        (cfg(method="fp8", scheme="w8a8"), llmc.fp8_groups),
        (cfg(method="fp8", scheme="w8a16"), llmc.fp8_groups),
        (cfg(method="fp4", format="nvfp4"), llmc.fp4_groups),
        (cfg(method="fp4", format="mxfp4"), llmc.fp4_groups),
    ]
    for c, groups in cases:
        assert tuple(scheme_facts.from_quantization_config(ct_config(groups(c)))) == c.facts, c


def test_bitsandbytes_configs_read_as_their_facts():
    nf4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    assert scheme_facts.from_quantization_config(nf4) == [scheme_facts.bnb_4bit("nf4", False)]
    int8 = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    assert scheme_facts.from_quantization_config(int8) == [scheme_facts.LLM_INT8]
    assert all(f.label == "bitsandbytes" for f in (scheme_facts.bnb_4bit("nf4", True), scheme_facts.LLM_INT8))


# ---- unknown is unknown ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "qc",
    [
        {"quant_method": "gptq", "bits": 4, "group_size": 128},  # another tool's format
        {"quant_method": "compressed-tensors", "config_groups": {}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 6, "type": "float"}}}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "nf"}}}},
        # FP4 codes in a layout neither NVFP4 nor MXFP4 is (groups of 64 with float scales)
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {"weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 64}}
            },
        },
        {"quant_method": "bitsandbytes"},
        "not a mapping",
    ],
)
def test_a_format_nothing_recognises_reads_as_unknown(qc):
    (facts,) = scheme_facts.from_quantization_config(qc)
    assert not facts.known and facts.label.startswith("unknown")


def test_static_activation_scales_are_a_fact():
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    acts = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="tensor", dynamic=False)
    weights = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")
    (facts,) = scheme_facts.from_quantization_config(
        ct_config({"g": QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts)})
    )
    assert (facts.activations, facts.activation_bits, facts.dynamic) == ("int", 8, False)


def test_quantkit_json_records_round_trip_and_unrecorded_ones_are_unknown():
    for f in (DENSE, NVFP4, MXFP4, scheme_facts.int_weights(4, 32, False)):
        assert SchemeFacts.from_dict(f.as_dict()) == f
        assert scheme_facts.of_meta({"quantization": {"weights": [f.as_dict()]}}) == [f]
    assert scheme_facts.of_meta({"quantization": None}) == [DENSE]
    (old,) = scheme_facts.of_meta({"quantization": {"format": "compressed-tensors", "weight_bits": 4}})
    assert not old.known  # written before facts were recorded: nothing is claimed for it
    assert not SchemeFacts.from_dict({**NVFP4.as_dict(), "weights": "nvfp8"}).known
    assert not SchemeFacts.from_dict({**NVFP4.as_dict(), "surprise": 1}).known
