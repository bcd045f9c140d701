"""Mixed precision under a budget: which units to raise above the base scheme, chosen on the model
being converted, so that the artifact's bits per weight stay within the budget exactly.

A unit is what vLLM serves as one kernel in one decoder layer (q/k/v fused, o, gate/up fused,
down). Each unit has the recipe's base scheme and a few options that raise it (INT8 per channel,
INT4 at a smaller group); each option has a cost in stored bits and a measured cost in accuracy
(the KL its rounding alone adds, `sensitivity.unit_kls`). Choosing one option per unit to minimise
the summed KL under a bits budget is a multiple-choice knapsack (Sinha & Zoltners 1979), solved
here by dynamic programming over the spare bits cut into `RESOLUTION` steps. Every option's cost
is rounded *up* to a whole step, so a solution never exceeds the budget: the only approximation is
that a choice needing a fraction of a step more than the spare bits may be passed over. Summing
per-unit KLs treats the units' errors as independent, as HAWQ-V3's integer program and ModelOpt's
auto_quantize (the sum of per-layer scores) do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantkit.errors import QuantkitError

RESOLUTION = 20_000  # steps of the spare budget: 120 units x 2 options x 20k = 5M updates, well under a second


@dataclass(frozen=True)
class Unit:
    """One unit of one layer: its weight count, and its stored bits and KL at each scheme (the base first)."""

    layer: int
    unit: str
    weights: int
    bits: tuple[float, ...]  # bits[j]: the unit's stored bits at scheme j (Scheme.stored_bits summed over its linears)
    kl: tuple[float, ...]  # kl[0]: the base scheme; kl[j]: option j


@dataclass(frozen=True)
class Choice:
    picked: tuple[int, ...]  # per unit: 0 = the base scheme, j = option j
    bits_per_weight: float  # over all the quantized linear weights (`total_weights`)
    kl_sum: float  # the summed per-unit KL of the choice (the objective)


def solve(units: list[Unit], budget: float, total_weights: int, other_bits: float = 0.0) -> Choice:
    """Minimise the summed KL under `budget` bits per weight over `total_weights` weights.

    Each unit's `bits` and `kl` list the base scheme first, then the options. `other_bits` are the
    stored bits of the weights counted in `total_weights` that are in no candidate unit (they stay
    as they are). Ties go to the cheaper choice, then to the lower layer. An infeasible budget
    (below every unit at the base) is one line."""
    base_bits = sum(u.bits[0] for u in units) + other_bits
    spare = budget * total_weights - base_bits
    floor = base_bits / total_weights
    if spare < -1e-9 * total_weights:
        raise QuantkitError(
            f"budget {budget:g} bits/weight is below {floor:.4f}, every unit at the base scheme; raise it or drop units"
        )
    extra = [[b - u.bits[0] for b in u.bits] for u in units]
    step = max(spare, 0.0) / RESOLUTION
    cap = RESOLUTION if step > 0 else 0
    cost = [
        [0 if e[j] <= 0 else (math.ceil(e[j] / step - 1e-9) if step > 0 else cap + 1) for j in range(len(e))]
        for e in extra
    ]
    picked = _knapsack(units, cost, cap)
    bits = base_bits + sum(extra[i][j] for i, j in enumerate(picked))
    return Choice(tuple(picked), bits / total_weights, sum(u.kl[j] for u, j in zip(units, picked)))


def _knapsack(units: list[Unit], cost: list[list[int]], cap: int) -> list[int]:
    """best[c]: the largest KL saved with at most c steps spent; ties keep the cheaper, earlier choice."""

    n = len(units)
    neg = -np.inf
    best = np.zeros(cap + 1)
    take = np.zeros((n, cap + 1), dtype=np.int8)
    for i, u in enumerate(units):
        new, arg = best.copy(), np.zeros(cap + 1, dtype=np.int8)
        for j in range(1, len(u.kl)):
            c, gain = cost[i][j], u.kl[0] - u.kl[j]
            if c > cap or gain <= 0:
                continue
            cand = np.full(cap + 1, neg)
            cand[c:] = best[: cap + 1 - c] + gain
            better = cand > new + 1e-15
            new[better], arg[better] = cand[better], j
        best, take[i] = new, arg
    c = int(np.flatnonzero(best >= best.max() - 1e-15)[0])  # the cheapest way to the best saving
    picked = [0] * n
    for i in range(n - 1, -1, -1):
        picked[i] = int(take[i, c])
        c -= cost[i][picked[i]] if picked[i] else 0
    return picked
