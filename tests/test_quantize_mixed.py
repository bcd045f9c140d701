"""The budgeted choice of mixed precision: exact budget arithmetic, optimality against brute force,
ties, an infeasible budget, and the choice names."""

import itertools
import random

import pytest

from quantkit.errors import QuantkitError
from quantkit.methods.schemes import Scheme, parse_choice
from quantkit.quantize.mixed import Unit, solve

BASE, INT8, G32 = Scheme(4, 64), Scheme(8, -1), Scheme(4, 32)


def unit(layer, name, weights, in_features, kl, schemes=(BASE, INT8)):
    """A unit whose stored bits follow the nominal accounting of each scheme at its width."""
    return Unit(layer, name, weights, tuple(s.bits_per_weight(in_features) * weights for s in schemes), kl)


def test_scheme_bits_follow_the_storage_accounting():
    assert BASE.bits_per_weight(576) == pytest.approx(4.25)  # a 16-bit scale per 64 weights
    assert Scheme(4, 64, symmetric=False).bits_per_weight(576) == pytest.approx(4.3125)  # + a 4-bit zero point
    assert G32.bits_per_weight(576) == pytest.approx(4.5)
    assert INT8.bits_per_weight(576) == pytest.approx(8 + 16 / 576)  # one scale per output channel


@pytest.mark.parametrize(
    "text,scheme",
    [("int8", INT8), ("int4-g32", G32), ("int4-g128-asym", Scheme(4, 128, False)), ("int8-g128", Scheme(8, 128))],
)
def test_choice_names(text, scheme):
    assert parse_choice(text) == scheme and parse_choice(scheme.name) == scheme


@pytest.mark.parametrize("bad", ["int4", "int3", "fp8", "int4-g48", "int8 per channel", ""])
def test_bad_choice_names_are_one_line(bad):
    with pytest.raises(QuantkitError, match="expected int8" if bad not in ("int4",) else "needs a group"):
        parse_choice(bad)


def _brute(units, budget, total):
    best = None
    for pick in itertools.product(range(len(units[0].bits)), repeat=len(units)):
        bits = sum(u.bits[j] for u, j in zip(units, pick))
        if bits <= budget * total + 1e-6:
            kl = sum(u.kl[j] for u, j in zip(units, pick))
            if best is None or kl < best - 1e-12:
                best = kl
    return best


def test_the_choice_is_within_budget_and_optimal_on_random_instances():
    rng = random.Random(0)
    schemes = [BASE, G32, INT8]
    for _ in range(200):
        units = [
            unit(
                i,
                "u",
                rng.choice([64, 128, 192]) * rng.randint(1, 8),
                rng.choice([64, 128, 576]),
                (lambda k0: (k0, k0 * rng.uniform(0.3, 0.9), k0 * rng.uniform(0, 0.2)))(rng.uniform(0.001, 0.1)),
                schemes,
            )
            for i in range(rng.randint(1, 6))
        ]
        total = sum(u.weights for u in units)
        floor = sum(u.bits[0] for u in units) / total
        budget = floor + rng.uniform(0, 4)
        got = solve(units, budget, total)
        assert got.bits_per_weight <= budget + 1e-12  # never above the budget
        assert got.bits_per_weight == pytest.approx(sum(u.bits[j] for u, j in zip(units, got.picked)) / total)
        # optimal up to the budget's resolution (a choice needing a fraction of a step more can be missed)
        assert (
            got.kl_sum <= _brute(units, budget, total) + 1e-9
            or got.kl_sum <= _brute(units, budget - (budget - floor) / 10_000, total) + 1e-9
        )


def test_ties_go_to_the_lower_layer_and_a_useless_option_is_never_paid_for():
    units = [unit(i, "qkv", 1000, 576, (0.05, 0.0)) for i in range(3)]
    one = (4.25 * 3000 + (INT8.bits_per_weight(576) - 4.25) * 1000) / 3000
    got = solve(units, one + 1e-9, 3000)
    assert got.picked == (1, 0, 0)
    flat = [unit(0, "o", 1000, 576, (0.01, 0.02))]  # raising it would not help
    assert solve(flat, 16, 1000).picked == (0,)


def test_weights_outside_the_units_count_at_their_bits():
    units = [unit(0, "qkv", 1000, 576, (0.05, 0.0))]
    # 9000 more weights stay INT4 g64: the budget is over all 10,000
    roomy = solve(units, 4.25 + 0.38, 10_000, other_bits=4.25 * 9000)
    tight = solve(units, 4.25 + 0.37, 10_000, other_bits=4.25 * 9000)
    assert roomy.picked == (1,) and tight.picked == (0,) and roomy.bits_per_weight <= 4.63


def test_an_infeasible_budget_is_one_line():
    with pytest.raises(QuantkitError, match="below 4.2500, every unit at the base scheme"):
        solve([unit(0, "o", 64, 64, (0.1, 0.0))], 4.0, 64)


# ---------------------------------------------------------------- stored bits, exactly


@pytest.mark.parametrize(
    "scheme", [BASE, INT8, G32, Scheme(4, 64, False), Scheme(4, 128, False), Scheme(8, 128), Scheme(8, -1, False)]
)
def test_stored_bits_equal_the_nominal_accounting_on_aligned_shapes(scheme):
    """Rows and columns that are multiples of the int32 packing: the exact count is the roofline's."""
    for out, cols in [(64, 128), (576, 576), (1536, 576), (192, 1536)]:
        assert scheme.stored_bits(out, cols, 16) == pytest.approx(scheme.bits_per_weight(cols) * out * cols)


def test_stored_bits_by_hand():
    # int4 g64 asymmetric, 64 x 128: codes 64 rows x 16 int32; scales 64 x 2 groups x 16 bits;
    # zero points packed 8 to an int32 along the rows: 8 x 2 int32
    assert Scheme(4, 64, False).stored_bits(64, 128, 16) == 64 * 16 * 32 + 64 * 2 * 16 + 8 * 2 * 32
    # rows that do not fill the last int32 of zero points, and float32 scales
    assert Scheme(4, 64, False).stored_bits(60, 128, 32) == 60 * 16 * 32 + 60 * 2 * 32 + 8 * 2 * 32
    # int8 per channel: 4 codes to an int32, one scale per row; a row of 102 takes 26 int32
    assert INT8.stored_bits(10, 102, 16) == 10 * 26 * 32 + 10 * 16


# ---------------------------------------------------------------- a recipe's auto: block


def _step(**quantize):
    from quantkit.recipe.files import recipe_from_dict

    return (
        recipe_from_dict({"steps": [{"quantize": {"method": "gptq", "bits": 4, "group_size": 64, **quantize}}]})
        .steps[0]
        .quantize
    )


def test_auto_defaults_and_round_trip():
    q = _step(auto={"budget_bits": 4.5})
    assert q.auto.units == ("qkv", "o", "gate_up", "down") and q.auto.choices == ("int8",) and q.auto.metric == "kl"
    assert q.auto.schemes(Scheme(4, 64)) == [BASE, INT8]
    again = _step(**{k: v for k, v in q.model_dump(mode="json").items() if k != "method"})
    assert again == q


@pytest.mark.parametrize(
    "auto,extra,message",
    [
        (
            {"budget_bits": 4.5},
            {"overrides": [{"targets": [".*down_proj$"], "bits": 8}]},
            "auto and overrides: give one of them",
        ),
        ({"budget_bits": 4.5, "metric": "mse"}, {}, "only kl for now"),
        ({"budget_bits": 4.5, "units": ["qkv", "mlp"]}, {}, "subset of qkv, o, gate_up, down"),
        ({"budget_bits": 4.5, "units": []}, {}, "subset of qkv, o, gate_up, down"),
        ({"budget_bits": 4.5, "choices": ["int4-g128"]}, {}, "does not raise a unit above the base scheme int4-g64"),
        ({"budget_bits": 4.5, "choices": ["int4-g64"]}, {}, "does not raise a unit above the base scheme int4-g64"),
        ({"budget_bits": 4.5, "choices": ["fp8"]}, {}, "expected int8"),
        ({"budget_bits": 4.5, "choices": []}, {}, "at least one scheme"),
        ({"budget_bits": 4.5, "choices": ["int8", "int8"]}, {}, "each scheme once"),
        ({"budget_bits": 4.0}, {}, "budget_bits 4: between 4.25"),
        ({"budget_bits": 4.3}, {"symmetric": False}, "budget_bits 4.3: between 4.3125"),
        ({"budget_bits": 17}, {}, "less than or equal to 16"),
        ({"budget_bits": 4.5, "windows": 0}, {}, "windows"),
        ({"budget_bits": 4.5, "bogus": 1}, {}, "bogus"),
        ({}, {}, "budget_bits"),
    ],
)
def test_bad_auto_blocks_are_one_line_with_their_key(auto, extra, message):
    from quantkit.errors import RecipeError

    with pytest.raises(RecipeError) as exc:
        _step(auto=auto, **extra)
    assert message in str(exc.value) and "steps[0].quantize" in str(exc.value) and len(str(exc.value).splitlines()) == 1


def test_auto_belongs_to_weight_only_steps():
    from quantkit.errors import RecipeError
    from quantkit.recipe.files import recipe_from_dict

    with pytest.raises(RecipeError, match="auto"):
        recipe_from_dict({"steps": [{"quantize": {"method": "w8a8", "auto": {"budget_bits": 8.5}}}]})
