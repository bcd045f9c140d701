"""The budgeted choice of mixed precision: exact budget arithmetic, optimality against brute force,
ties, an infeasible budget, and the choice names."""

import itertools
import random

import pytest

from quantkit.errors import QuantkitError
from quantkit.quantize.mixed import Scheme, Unit, parse_choice, solve

BASE, INT8, G32 = Scheme(4, 64), Scheme(8, -1), Scheme(4, 32)


def test_scheme_bits_follow_the_storage_accounting():
    assert BASE.bits_per_weight(576) == pytest.approx(4.25)  # a 16-bit scale per 64 weights
    assert Scheme(4, 64, symmetric=False).bits_per_weight(576) == pytest.approx(4.3125)  # + a 4-bit zero point
    assert G32.bits_per_weight(576) == pytest.approx(4.5)
    assert INT8.bits_per_weight(576) == pytest.approx(8 + 16 / 576)  # one scale per output channel


@pytest.mark.parametrize("text,scheme", [("int8", INT8), ("int4-g32", G32), ("int4-g128-asym", Scheme(4, 128, False)),
                                         ("int8-g128", Scheme(8, 128))])
def test_choice_names(text, scheme):
    assert parse_choice(text) == scheme and parse_choice(scheme.name) == scheme


@pytest.mark.parametrize("bad", ["int4", "int3", "fp8", "int4-g48", "int8 per channel", ""])
def test_bad_choice_names_are_one_line(bad):
    with pytest.raises(QuantkitError, match="expected int8"if bad not in ("int4",) else "needs a group"):
        parse_choice(bad)


def _brute(units, schemes, budget, total):
    base = sum(schemes[0].bits_per_weight(u.in_features) * u.weights for u in units)
    best = None
    for pick in itertools.product(range(len(schemes)), repeat=len(units)):
        bits = base + sum((schemes[j].bits_per_weight(u.in_features) - schemes[0].bits_per_weight(u.in_features)) * u.weights
                          for u, j in zip(units, pick))
        if bits <= budget * total + 1e-6:
            kl = sum(u.kl[j] for u, j in zip(units, pick))
            if best is None or kl < best - 1e-12:
                best = kl
    return best


def test_the_choice_is_within_budget_and_optimal_on_random_instances():
    rng = random.Random(0)
    schemes = [BASE, G32, INT8]
    for _ in range(200):
        units = [Unit(i, "u", rng.choice([64, 128, 192]) * rng.randint(1, 8), rng.choice([64, 128, 576]),
                      (lambda k0: (k0, k0 * rng.uniform(0.3, 0.9), k0 * rng.uniform(0, 0.2)))(rng.uniform(0.001, 0.1)))
                 for i in range(rng.randint(1, 6))]
        total = sum(u.weights for u in units)
        floor = sum(BASE.bits_per_weight(u.in_features) * u.weights for u in units) / total
        budget = floor + rng.uniform(0, 4)
        got = solve(units, schemes, budget, total)
        assert got.bits_per_weight <= budget + 1e-12  # never above the budget
        # optimal up to the budget's resolution (a choice needing a fraction of a step more can be missed)
        assert got.kl_sum <= _brute(units, schemes, budget, total) + 1e-9 or \
            got.kl_sum <= _brute(units, schemes, budget - (budget - floor) / 10_000, total) + 1e-9


def test_ties_go_to_the_lower_layer_and_a_useless_option_is_never_paid_for():
    units = [Unit(i, "qkv", 1000, 576, (0.05, 0.0)) for i in range(3)]
    one = (4.25 * 3000 + (INT8.bits_per_weight(576) - 4.25) * 1000) / 3000
    got = solve(units, [BASE, INT8], one + 1e-9, 3000)
    assert got.picked == (1, 0, 0)
    flat = [Unit(0, "o", 1000, 576, (0.01, 0.02))]  # raising it would not help
    assert solve(flat, [BASE, INT8], 16, 1000).picked == (0,)


def test_weights_outside_the_units_count_at_their_bits():
    units = [Unit(0, "qkv", 1000, 576, (0.05, 0.0))]
    # 9000 more weights stay INT4 g64: the budget is over all 10,000
    roomy = solve(units, [BASE, INT8], 4.25 + 0.38, 10_000, other_bits=4.25 * 9000)
    tight = solve(units, [BASE, INT8], 4.25 + 0.37, 10_000, other_bits=4.25 * 9000)
    assert roomy.picked == (1,) and tight.picked == (0,) and roomy.bits_per_weight <= 4.63


def test_an_infeasible_budget_is_one_line():
    with pytest.raises(QuantkitError, match="below 4.2500, every unit at the base scheme"):
        solve([Unit(0, "o", 64, 64, (0.1, 0.0))], [BASE, INT8], 4.0, 64)
