"""Which load to measure next: a staircase of fixed levels, or a search for the highest load that
meets the SLO. Pure: a plan looks at the steps measured so far and names the next (level, phase).

Staircase: climb the levels in order until saturation (stats.should_stop), then measure every level
it reached `repeats` times in all (passes in the same order).

Search (`--search`, between the two levels given, with `--slo`):
  bracket  the lower bound, then doubling, until a level misses the SLO or the upper bound meets it;
  bisect   between the highest level that meets it and the lowest that misses (concurrency: the
           midpoint, until they are 1 apart; rate: the geometric midpoint, until within RATE_TOL);
  measure  those two levels until each has `repeats` steps: the knee (intervals.py) is interpolated
           between them, and its interval comes from their requests.
A level meets the SLO when the P99s over all its steps do and few of its requests failed
(intervals.meets). Should the repeats turn a verdict, the bracket moves and the search goes on, up to
MAX_STEPS steps in all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from quantkit.load.config import LoadConfig
from quantkit.load.intervals import by_level, meets
from quantkit.load.load_stats import should_stop
from quantkit.load.step_record import Step

RATE_TOL = 0.15  # rate search: stop when the bracket's ends are within 15% of each other
MAX_STEPS = 24  # a search never measures more steps than this


def _pooled(steps: Sequence[Step], level: float) -> list[Step]:
    return [s for s in steps if s.offered == level and not s.partial]


def _midpoint(low: float, high: float, integer: bool) -> float | None:
    """The next level between a passing `low` and a failing `high`, or None when they are close enough."""
    if integer:
        return None if high - low <= 1 else float((int(low) + int(high)) // 2)
    return None if high / low <= 1 + RATE_TOL else math.sqrt(low * high)


def search_next(cfg: LoadConfig, steps: Sequence[Step]) -> tuple[float, str] | None:
    """The next (level, phase) of the SLO search, or None when it is done."""
    lo, hi = cfg.levels
    integer = cfg.mode == "concurrency"
    if len(steps) >= MAX_STEPS:
        return None
    grouped = by_level(steps)
    levels = list(grouped)
    verdict = {level: meets(grouped[level], cfg.slo) for level in levels}
    passing = [lv for lv in levels if verdict[lv]]
    failing = [lv for lv in levels if not verdict[lv]]
    if not levels:
        return lo, "bracket"
    low = max((lv for lv in passing if not failing or lv < min(failing)), default=None)
    high = min((lv for lv in failing if low is None or lv > low), default=None)
    if low is None:  # even the lower bound misses: the knee is below it
        return _repeat(steps, [lo], cfg.repeats)
    if high is None:
        if low >= hi:  # even the upper bound meets it: the knee is above it
            return _repeat(steps, [hi], cfg.repeats)
        nxt = min(hi, 2 * low)
        return (float(int(nxt)) if integer else nxt), "bracket"
    mid = _midpoint(low, high, integer)
    if mid is not None and mid not in verdict:
        return mid, "bisect"
    return _repeat(steps, [low, high], cfg.repeats)


def _repeat(steps: Sequence[Step], levels: list[float], repeats: int) -> tuple[float, str] | None:
    for level in levels:
        if len(_pooled(steps, level)) < repeats:
            return level, "measure"
    return None


def staircase_next(cfg: LoadConfig, steps: Sequence[Step], climbing: bool) -> tuple[float, str] | None:
    """The next (level, phase) of the staircase: climb, then repeat the levels reached."""
    done = [s for s in steps if not s.partial]
    first = [s for s in done if (s.repeat or 0) == 0]
    if climbing:
        saturated = len(first) > 1 and cfg.stop_at_saturation and should_stop(first, cfg.patience)
        if len(first) < len(cfg.levels) and not saturated:
            return cfg.levels[len(first)], "climb"
    reached = [s.offered for s in first]
    for repeat in range(1, cfg.repeats):
        for level in reached:
            if not any(s.offered == level and s.repeat == repeat for s in done):
                return level, "repeat"
    return None


def next_level(cfg: LoadConfig, steps: Sequence[Step], climbing: bool = True) -> tuple[float, str] | None:
    return search_next(cfg, steps) if cfg.search else staircase_next(cfg, steps, climbing)
