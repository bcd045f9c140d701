"""The knee as the highest load that meets the SLO, with 95% intervals on it and on every P99.

The knee: per level (all its steps pooled), how far the P99s are from the SLO,
r = max(TTFT-P99 / ttft objective, TPOT-P99 / tpot objective) (r = inf when more than
MAX_FAILED of its requests failed). The knee is where r crosses 1, interpolated linearly in
load between the last level that meets the SLO and the first that misses it; below the lowest
level measured it is "below" that level, past the highest "above" it (censored: a bound, no value).

Intervals: a hierarchical bootstrap (resample a level's steps with replacement, then the answered
requests inside each chosen step; Davison & Hinkley, Bootstrap Methods, 1997, sec. 3.8), so the
interval holds the step-to-step spread of a shared machine as well as the sampling of requests.
A 95% interval is the 2.5th and 97.5th percentiles of DRAWS replicates; when more than 2.5% of
them are censored on one side, the interval is open on that side (None).

With n answered requests a P99 interpolates between the order statistics at 0.99 (n - 1): below
the maximum only from n = P99_NOT_MAX requests on (numpy's linear rule), and a level that has fewer
says so (`p99_is_near_max`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from quantkit.core.record_checks import known_keys
from quantkit.load.config import Slo
from quantkit.load.step_record import Step

DRAWS = 1000
MAX_FAILED = 0.01  # a level whose requests failed more often than this does not meet the SLO
P99_NOT_MAX = 102  # the P99's upper order statistic is below the maximum from 102 requests on


@dataclass(frozen=True)
class SloLevel:
    """One level's steps pooled: its P99s with their 95% intervals, and whether it meets the SLO."""

    offered: float
    steps: int
    requests: int
    completed: int
    achieved_qps: float | None
    ttft_p99_ms: float | None
    ttft_p99_ci95: list | None
    tpot_p99_ms: float | None
    tpot_p99_ci95: list | None
    p99_is_near_max: bool
    meets_slo: bool

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "SloLevel":
        return cls(**known_keys(cls, data, "a level of the SLO knee"))


@dataclass(frozen=True)
class SloKnee:
    """The highest load that meets the SLO, with its interval (or `censored` below or above the
    levels measured, with that level as `bound`), and every level's P99s."""

    slo: dict  # the SLO it was judged on: ttft_ms, tpot_ms, class
    knee: float | None
    censored: str | None
    bound: float | None
    ci95: list | None
    knee_qps: float | None
    knee_qps_ci95: list | None
    censored_draws: float
    levels: list[SloLevel]
    bootstrap: dict  # draws, seed, method

    def to_json(self) -> dict:
        return {**asdict(self), "levels": [level.to_json() for level in self.levels]}

    @classmethod
    def from_json(cls, data: dict) -> "SloKnee":
        data = known_keys(cls, data, "the SLO knee")
        return cls(**{**data, "levels": [SloLevel.from_json(level) for level in data["levels"]]})


@dataclass(frozen=True)
class KneeShift:
    """The SLO knee's ratio other / base with its 95% interval; `why` when it cannot be judged."""

    ratio: float | None
    ci95: list | None
    moved: bool | None
    why: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "KneeShift":
        return cls(**known_keys(cls, data, "a knee's shift"))


@dataclass(frozen=True)
class P99Difference:
    """other - base of one level's P99 (ms) with its 95% interval; of one class where `cls` is set."""

    difference_ms: float | None
    ci95: list | None
    moved: bool | None
    cls: str | None = None

    def to_json(self) -> dict:
        out = {"difference_ms": self.difference_ms, "ci95": self.ci95, "moved": self.moved}
        return {"class": self.cls, **out} if self.cls is not None else out

    @classmethod
    def from_json(cls, data: dict) -> "P99Difference":
        data = dict(data)
        return cls(cls=data.pop("class", None), **known_keys(cls, data, "a P99 difference"))


def _arrays(step: Step, metric: str, cls: str | None = None) -> np.ndarray:
    """A step's answered requests' values of `metric` (ms), of one workload class when `cls` is given."""
    values = step.samples.of(metric)
    classes = step.samples.cls or [None] * len(values)
    return np.asarray([v for v, c in zip(values, classes) if v is not None and (cls is None or c == cls)], dtype=float)


def by_level(steps: Sequence[Step]) -> dict[float, list[Step]]:
    out: dict[float, list[Step]] = {}
    for step in steps:
        if not step.partial and step.samples:
            out.setdefault(step.offered, []).append(step)
    return dict(sorted(out.items()))


def _p99(values: np.ndarray) -> float:
    return float(np.percentile(values, 99)) if values.size else float("nan")


def _failed(steps: Sequence[Step]) -> bool:
    sent = sum(s.requests for s in steps)
    return not sent or sum(s.error_count for s in steps) > MAX_FAILED * sent


def _ratio(ttft: float, tpot: float, slo: Slo) -> float:
    """How far a level's P99s are from the SLO: above 1 misses it."""
    parts = []
    if slo.ttft_ms is not None:
        parts.append(ttft / slo.ttft_ms if ttft == ttft else np.inf)
    if slo.tpot_ms is not None and tpot == tpot:  # a level of one-token answers has no TPOT
        parts.append(tpot / slo.tpot_ms)
    return max(parts) if parts else np.nan


def crossing(levels: Sequence[float], ratios: Sequence[float]) -> tuple[float, str | None]:
    """(knee, censored): the load where r crosses 1 (linear between the levels around it); censored
    'below' the lowest level or 'above' the highest, with that level as the bound."""
    for i, r in enumerate(ratios):
        if r > 1 or r != r:
            if i == 0:
                return levels[0], "below"
            r0, l0, l1 = ratios[i - 1], levels[i - 1], levels[i]
            if not np.isfinite(r):
                return l0, None
            return l0 + (1 - r0) / (r - r0) * (l1 - l0), None
    return levels[-1], "above"


def _resample(rng: np.random.Generator, steps: Sequence[Step], metric: str, cls: str | None = None) -> np.ndarray:
    chosen = rng.integers(len(steps), size=len(steps))
    parts = []
    for j in chosen:
        values = _arrays(steps[j], metric, cls)
        parts.append(values[rng.integers(values.size, size=values.size)] if values.size else values)
    return np.concatenate(parts) if parts else np.empty(0)


def _draw_p99s(rng: np.random.Generator, steps: Sequence[Step], cls: str | None = None) -> tuple[float, float]:
    return _p99(_resample(rng, steps, "ttft_ms", cls)), _p99(_resample(rng, steps, "tpot_ms", cls))


def _interval(draws: np.ndarray, censored_low: np.ndarray, censored_high: np.ndarray) -> list:
    """[2.5%, 97.5%] of the draws, a side None where more than 2.5% of the draws are censored there."""
    ok = draws[~(censored_low | censored_high)]
    if not ok.size:
        return [None, None]
    low, high = np.percentile(ok, [2.5, 97.5])
    return [
        None if censored_low.mean() > 0.025 else float(low),
        None if censored_high.mean() > 0.025 else float(high),
    ]


def _qps_at(knee: float, levels: Sequence[float], qps: Sequence[float | None]) -> float | None:
    pairs = [(lv, q) for lv, q in zip(levels, qps) if q is not None]
    if not pairs:
        return None
    xs, ys = zip(*pairs)
    return float(np.interp(knee, xs, ys))


def knee_draws(steps: Sequence[Step], slo: Slo, draws: int = DRAWS, seed: int = 0) -> dict:
    """The knee's bootstrap replicates: knees, and which were censored below or above."""
    grouped = by_level(steps)
    levels = list(grouped)
    failed = [_failed(grouped[lv]) for lv in levels]
    rng = np.random.default_rng(seed)
    knees, low, high = np.empty(draws), np.zeros(draws, bool), np.zeros(draws, bool)
    for b in range(draws):
        ratios = [
            np.inf if failed[i] else _ratio(*_draw_p99s(rng, grouped[lv], slo.cls), slo) for i, lv in enumerate(levels)
        ]
        knees[b], censored = crossing(levels, ratios)
        low[b], high[b] = censored == "below", censored == "above"
    return {"knees": knees, "below": low, "above": high}


def meets(steps: Sequence[Step], slo: Slo) -> bool:
    """Whether one level's steps, pooled, meet the SLO: P99s within it and few failures."""
    if _failed(steps):
        return False
    ttft = np.concatenate([_arrays(s, "ttft_ms", slo.cls) for s in steps])
    tpot = np.concatenate([_arrays(s, "tpot_ms", slo.cls) for s in steps])
    return ttft.size > 0 and _ratio(_p99(ttft), _p99(tpot), slo) <= 1


def _level_row(level: float, steps: Sequence[Step], slo: Slo, rng: np.random.Generator, draws: int) -> SloLevel:
    ttft = np.concatenate([_arrays(s, "ttft_ms", slo.cls) for s in steps])
    tpot = np.concatenate([_arrays(s, "tpot_ms", slo.cls) for s in steps])
    reps = np.array([_draw_p99s(rng, steps, slo.cls) for _ in range(draws)])
    duration = sum(s.duration_s for s in steps)
    completed = sum(s.completed for s in steps)

    def ci(col: np.ndarray) -> list | None:
        col = col[col == col]
        return [float(x) for x in np.percentile(col, [2.5, 97.5])] if col.size else None

    return SloLevel(
        offered=level,
        steps=len(steps),
        requests=sum(s.requests for s in steps),
        completed=completed,
        achieved_qps=completed / duration if duration > 0 else None,
        ttft_p99_ms=_p99(ttft) if ttft.size else None,
        ttft_p99_ci95=ci(reps[:, 0]),
        tpot_p99_ms=_p99(tpot) if tpot.size else None,
        tpot_p99_ci95=ci(reps[:, 1]),
        p99_is_near_max=int(ttft.size) < P99_NOT_MAX,
        meets_slo=meets(steps, slo),
    )


def slo_knee(steps: Sequence[Step], slo: Slo, draws: int = DRAWS, seed: int = 0) -> SloKnee | None:
    """The knee (highest load meeting the SLO) with its interval, and every level's P99s with theirs."""
    grouped = by_level(steps)
    if slo.empty or not grouped:
        return None
    rng = np.random.default_rng(seed + 1)
    rows = [_level_row(level, mine, slo, rng, draws) for level, mine in grouped.items()]
    levels = [r.offered for r in rows]
    ratios = [
        np.inf if _failed(grouped[lv]) else _ratio(r.ttft_p99_ms or np.nan, r.tpot_p99_ms or np.nan, slo)
        for lv, r in zip(levels, rows)
    ]
    knee, censored = crossing(levels, ratios)
    reps = knee_draws(steps, slo, draws, seed)
    qps = [r.achieved_qps for r in rows]
    qps_draws = np.array([_qps_at(k, levels, qps) or np.nan for k in reps["knees"]])
    return SloKnee(
        slo={"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "class": slo.cls},
        knee=None if censored else knee,
        censored=censored,
        bound=knee if censored else None,
        ci95=None if censored else _interval(reps["knees"], reps["below"], reps["above"]),
        knee_qps=None if censored else _qps_at(knee, levels, qps),
        knee_qps_ci95=None if censored else _interval(qps_draws, reps["below"], reps["above"]),
        censored_draws=float((reps["below"] | reps["above"]).mean()),
        levels=rows,
        bootstrap={"draws": draws, "seed": seed, "method": "hierarchical: a level's steps, then requests"},
    )


def shift(base: dict, other: dict) -> KneeShift:
    """The knee's ratio other / base from two runs' bootstrap replicates (knee_draws), with its
    interval; `moved` only when the interval excludes 1 (no change)."""
    ok = ~(base["below"] | base["above"] | other["below"] | other["above"])
    if ok.mean() < 0.95:
        return KneeShift(None, None, None, "a knee outside its run's levels in over 5% of draws")
    ratios = other["knees"][ok] / base["knees"][ok]
    low, high = (float(x) for x in np.percentile(ratios, [2.5, 97.5]))
    return KneeShift(float(np.median(ratios)), [low, high], not (low <= 1.0 <= high), None)


def p99_difference(
    base: Sequence[dict], other: Sequence[dict], metric: str, draws: int = DRAWS, seed: int = 0, cls: str | None = None
) -> dict:
    """other - base of one level's P99 (steps of that level in each run, one class's requests when
    `cls` is given), with its interval."""
    rng = np.random.default_rng(seed)
    diffs = np.array(
        [_p99(_resample(rng, other, metric, cls)) - _p99(_resample(rng, base, metric, cls)) for _ in range(draws)]
    )
    diffs = diffs[diffs == diffs]
    if not diffs.size:
        return P99Difference(None, None, None, cls)
    point = _p99(np.concatenate([_arrays(s, metric, cls) for s in other])) - _p99(
        np.concatenate([_arrays(s, metric, cls) for s in base])
    )
    low, high = (float(x) for x in np.percentile(diffs, [2.5, 97.5]))
    return P99Difference(point, [low, high], not (low <= 0.0 <= high), cls)
