"""quantkit.load.intervals: the SLO knee interpolated between levels, its bootstrap interval, the
P99's, and a shift that counts as a move only when its interval excludes no change."""

from __future__ import annotations

import numpy as np
import pytest

from quantkit.load import intervals
from quantkit.load.config import Slo
from quantkit.load.intervals import P99_NOT_MAX, crossing
from quantkit.load.step_record import Step

# the steps are written here as their JSON; each call reads them as records and answers in JSON


def _typed(steps: list[dict]) -> list[Step]:
    return [Step.from_json(s) for s in steps]


def slo_knee(steps, slo, **kw):
    found = intervals.slo_knee(_typed(steps), slo, **kw)
    return found.to_json() if found else None


def knee_draws(steps, slo, **kw):
    return intervals.knee_draws(_typed(steps), slo, **kw)


def p99_difference(base, other, metric, **kw):
    return intervals.p99_difference(_typed(base), _typed(other), metric, **kw).to_json()


def shift(base, other):
    return intervals.shift(base, other).to_json()


def _steps(level: float, center: float, spread: float, n: int = 150, repeats: int = 3, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed + int(level * 10))
    out = []
    for _ in range(repeats):
        ttft = rng.normal(center, spread, n).clip(1)
        out.append(
            {
                "offered": level,
                "partial": False,
                "requests": n,
                "completed": n,
                "error_count": 0,
                "duration_s": n / 10,
                "samples": {"ttft_ms": list(ttft), "tpot_ms": [10.0] * n},
            }
        )
    return out


def test_crossing_by_hand():
    assert crossing([1, 2, 4], [0.5, 0.8, 1.4]) == (pytest.approx(2 + 0.2 / 0.6 * 2), None)
    assert crossing([1, 2], [1.2, 2.0]) == (1, "below")
    assert crossing([1, 2], [0.2, 0.9]) == (2, "above")
    assert crossing([1, 2, 4], [0.5, np.inf, 0.9]) == (1, None)  # a level that failed: the knee is the one before


def test_the_knee_and_its_interval():
    # P99 = center + 2.33 sd: 60 ms at 1, ~93 at 2, ~163 at 4 against an SLO of 100 ms
    steps = _steps(1, 50, 4) + _steps(2, 80, 6) + _steps(4, 140, 10)
    found = slo_knee(steps, Slo(ttft_ms=100), draws=400)
    assert found["censored"] is None and 2 < found["knee"] < 2.5
    low, high = found["ci95"]
    assert low < found["knee"] < high and high - low < 0.6
    level = found["levels"][1]
    assert level["steps"] == 3 and level["completed"] == 450 and not level["p99_is_near_max"]
    assert level["ttft_p99_ci95"][0] < level["ttft_p99_ms"] < level["ttft_p99_ci95"][1]
    assert [lv["meets_slo"] for lv in found["levels"]] == [True, True, False]
    assert found["knee_qps"] == pytest.approx(10.0)  # n / duration at every level


def test_a_knee_outside_the_levels_is_a_bound():
    found = slo_knee(_steps(1, 50, 4) + _steps(2, 60, 4), Slo(ttft_ms=100), draws=100)
    assert found["knee"] is None and found["censored"] == "above" and found["bound"] == 2
    found = slo_knee(_steps(1, 200, 4), Slo(ttft_ms=100), draws=100)
    assert found["censored"] == "below" and found["ci95"] is None


def test_few_requests_say_the_p99_is_near_the_maximum():
    found = slo_knee(_steps(1, 50, 4, n=40, repeats=1), Slo(ttft_ms=100), draws=50)
    assert found["levels"][0]["p99_is_near_max"] and P99_NOT_MAX == 102


def test_a_move_needs_an_interval_that_excludes_no_change():
    slo = Slo(ttft_ms=100)
    base = _steps(1, 50, 4) + _steps(2, 80, 6) + _steps(4, 140, 10)
    same = _steps(1, 50, 4, seed=9) + _steps(2, 80, 6, seed=9) + _steps(4, 140, 10, seed=9)
    faster = _steps(1, 30, 3) + _steps(2, 45, 4) + _steps(4, 70, 6) + _steps(8, 130, 10)
    a, b, c = (knee_draws(s, slo, draws=300, seed=i) for i, s in enumerate((base, same, faster)))
    unmoved, moved = shift(a, b), shift(a, c)
    assert unmoved["moved"] is False and unmoved["ci95"][0] < 1 < unmoved["ci95"][1]
    assert moved["moved"] is True and moved["ci95"][0] > 1.5
    censored = knee_draws(_steps(1, 50, 4) + _steps(2, 60, 4), slo, draws=300)
    assert shift(a, censored)["moved"] is None and "outside" in shift(a, censored)["why"]


def test_p99_difference_at_one_level():
    diff = p99_difference(_steps(2, 80, 6), _steps(2, 60, 6, seed=3), "ttft_ms", draws=300)
    assert diff["difference_ms"] < -15 and diff["moved"] and diff["ci95"][1] < 0
    same = p99_difference(_steps(2, 80, 6), _steps(2, 80, 6, seed=5), "ttft_ms", draws=300)
    assert not same["moved"]


def test_a_class_slo_judges_the_knee_on_that_class_alone():
    from quantkit.load.config import LoadError, parse_slo

    assert parse_slo("ttft=100,class=short") == Slo(ttft_ms=100, cls="short")
    with pytest.raises(LoadError, match="needs a ttft or tpot"):
        parse_slo("class=short")
    steps = []
    for level, short, long in ((1, 50, 400), (2, 80, 700), (4, 140, 1300)):
        for step in _steps(level, short, 4):
            n = len(step["samples"]["ttft_ms"])  # every tenth request long, eight times slower
            step["samples"]["cls"] = ["long" if i % 10 == 0 else "short" for i in range(n)]
            step["samples"]["ttft_ms"] = [long if i % 10 == 0 else v for i, v in enumerate(step["samples"]["ttft_ms"])]
            steps.append(step)
    every = slo_knee(steps, Slo(ttft_ms=100), draws=100)
    short = slo_knee(steps, Slo(ttft_ms=100, cls="short"), draws=100)
    assert every["censored"] == "below"  # the long prompts miss 100 ms at every level
    assert short["censored"] is None and 2 < short["knee"] < 2.5 and short["slo"]["class"] == "short"
