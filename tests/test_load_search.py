"""quantkit.load.search: the staircase's and the SLO search's next level, on hand-made steps."""

from __future__ import annotations

import numpy as np

from quantkit.load import search
from quantkit.load.config import build_config
from quantkit.load.load_options import LoadOptions
from quantkit.load.step_record import Step


def next_level(cfg, steps: list[dict]):
    """search.next_level on steps written as their JSON."""
    return search.next_level(cfg, [Step.from_json(s) for s in steps])


def _cfg(levels: str, repeats: int = 1, search: bool = True, rate: bool = False, slo: str = "ttft=100"):
    options = LoadOptions(
        concurrency=None if rate else levels,
        rate=levels if rate else None,
        slo=slo,
        prompt_len=16,
        gen_len=8,
        step_seconds=1,
        timeout_s=10,
        repeats=repeats,
        search=search,
    )
    return build_config(options, url="http://127.0.0.1:1", model="m")


def _step(level: float, ttft_ms: float, n: int = 120, errors: int = 0) -> dict:
    """A step whose requests all took `ttft_ms` (give or take 1%)."""
    values = list(np.linspace(0.99, 1.01, n) * ttft_ms)
    return {
        "offered": level,
        "partial": False,
        "requests": n + errors,
        "completed": n,
        "error_count": errors,
        "duration_s": 10.0,
        "samples": {"ttft_ms": values, "tpot_ms": [10.0] * n},
    }


def _run(cfg, latency) -> list[float]:
    """Drive the search against a server whose TTFT is latency(level); the levels it measured."""
    steps = []
    while (planned := next_level(cfg, steps)) is not None:
        steps.append(_step(planned[0], latency(planned[0])))
    return [s["offered"] for s in steps]


def test_concurrency_search_brackets_bisects_then_repeats_the_two_levels():
    # TTFT 30 ms per request in flight: the SLO of 100 ms holds up to concurrency 3
    measured = _run(_cfg("1,64", repeats=3), lambda c: 30.0 * c)
    assert measured[:4] == [1, 2, 4, 3]  # bracket 1, 2, 4 (misses); bisect 3
    assert sorted(measured[4:]) == [3, 3, 4, 4] and len(measured) == 8  # 3 and 4 three times each


def test_search_stops_at_the_bounds():
    assert _run(_cfg("1,8", repeats=2), lambda c: 10.0) == [1, 2, 4, 8, 8]  # meets it everywhere: above 8
    assert _run(_cfg("2,8", repeats=2), lambda c: 500.0) == [2, 2]  # misses at the lower bound: below 2


def test_rate_search_narrows_geometrically():
    measured = _run(_cfg("0.5,32", rate=True), lambda r: 40.0 * r)  # meets it below 2.5 req/s
    assert measured[:4] == [0.5, 1.0, 2.0, 4.0]
    low = max(r for r in measured if r * 40 <= 100)
    high = min(r for r in measured if r * 40 > 100)
    assert high / low <= 1.15 and low <= 2.5 < high


def test_a_level_with_failures_misses_the_slo():
    cfg = _cfg("1,8")
    assert next_level(cfg, [_step(1, 10.0), _step(2, 10.0, errors=1)]) == (4, "bracket")  # 1 of 121: within 1%
    assert next_level(cfg, [_step(1, 10.0), _step(2, 10.0, errors=5)]) is None  # 5 of 125: the knee is below 2


def test_the_staircase_climbs_then_repeats_what_it_reached():
    cfg = _cfg("1,2,4", repeats=2, search=False, slo=None)
    steps = []
    while (planned := next_level(cfg, steps)) is not None:
        steps.append({**_step(planned[0], 10.0), "repeat": sum(s["offered"] == planned[0] for s in steps)})
    assert [(s["offered"], s["repeat"]) for s in steps] == [(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1)]
