"""Prometheus histograms and counters a server exposes at /metrics: parsed, subtracted over a step,
histograms read as quantiles.

vLLM's OpenAI server exposes, per request that finished, how long it waited in the scheduler's
queue and how long its prefill took (`vllm:request_queue_time_seconds`,
`vllm:request_prefill_time_seconds`, and its own `vllm:time_to_first_token_seconds`). A step's
requests are the difference of two scrapes, one before the step and one after it drained. Sum and
count give exact means; a quantile is known only to its bucket, and is interpolated linearly inside
it as Prometheus' `histogram_quantile` does (the bucket's bounds travel with it).

Text format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# name{labels} value   (the labels may hold spaces inside quoted values; a timestamp may follow)
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
_LE = re.compile(r'le="([^"]*)"')


@dataclass(frozen=True)
class Histogram:
    """One histogram summed over its label sets: cumulative counts per upper bound, sum and count."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, +Inf last
    sum: float
    count: float

    def minus(self, before: "Histogram") -> "Histogram":
        """The observations made between `before` and this scrape (same bucket bounds)."""
        if [b for b, _ in before.buckets] != [b for b, _ in self.buckets]:
            return self  # the server restarted with other buckets: nothing to subtract from
        buckets = tuple((le, now - then) for (le, now), (_, then) in zip(self.buckets, before.buckets))
        return Histogram(buckets, self.sum - before.sum, self.count - before.count)

    def plus(self, other: "Histogram") -> "Histogram | None":
        """Both histograms' observations together (a level's repeats); None where their bounds differ."""
        if [b for b, _ in other.buckets] != [b for b, _ in self.buckets]:
            return None
        buckets = tuple((le, a + b) for (le, a), (_, b) in zip(self.buckets, other.buckets))
        return Histogram(buckets, self.sum + other.sum, self.count + other.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> tuple[float, float, float] | None:
        """(value, bucket lower bound, bucket upper bound) of quantile q in [0, 1], or None when empty.

        Linear inside the bucket the rank falls in (histogram_quantile); in the +Inf bucket the value
        is the last finite bound, and the upper bound is infinite."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(le):
                    return lower, lower, le
                value = lower + (le - lower) * (rank - below) / (cumulative - below)
                return value, lower, le
            lower, below = le, cumulative
        return lower, lower, math.inf


def _value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_histograms(text: str) -> dict[str, Histogram]:
    """Every histogram in a /metrics page, each summed over its label sets (several models or
    engines count as one server). Malformed lines are skipped: the page is read, never trusted."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.group(1), match.group(2) or "", _value(match.group(3))
        if value is None or math.isnan(value):
            continue
        if name.endswith("_bucket"):
            le = _LE.search(labels)
            bound = _value(le.group(1)) if le else None
            if bound is not None:
                into = buckets.setdefault(name[: -len("_bucket")], {})
                into[bound] = into.get(bound, 0.0) + value
        elif name.endswith("_sum"):
            sums[name[:-4]] = sums.get(name[:-4], 0.0) + value
        elif name.endswith("_count"):
            counts[name[:-6]] = counts.get(name[:-6], 0.0) + value
    return {
        name: Histogram(tuple(sorted(by_le.items())), sums.get(name, 0.0), counts[name])
        for name, by_le in buckets.items()
        if name in counts and by_le
    }


def parse_counters(text: str) -> dict[str, float]:
    """Every counter (a `NAME_total` sample) in a /metrics page, summed over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line) if line and not line.startswith("#") else None
        if match and match.group(1).endswith("_total"):
            value = _value(match.group(3))
            if value is not None and math.isfinite(value):
                out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


@dataclass(frozen=True)
class Scrape:
    """What one read of /metrics held (or its change over a step: `minus`)."""

    histograms: dict[str, Histogram]
    counters: dict[str, float]

    def minus(self, before: "Scrape") -> "Scrape":
        """The observations between `before` and this scrape (a histogram or counter new here counts whole)."""
        histograms = {
            n: (h.minus(before.histograms[n]) if n in before.histograms else h) for n, h in self.histograms.items()
        }
        counters = {n: v - before.counters.get(n, 0.0) for n, v in self.counters.items()}
        return Scrape(histograms, counters)

    @staticmethod
    def total(changes: list["Scrape | None"]) -> "Scrape | None":
        """Several steps' changes as one (a level's repeats: their histograms and counters summed);
        None unless every step has one, so the pooled figures cover the same requests."""
        if not changes or any(c is None for c in changes):
            return None
        histograms = {}
        for name in set.intersection(*(set(c.histograms) for c in changes)):
            summed = changes[0].histograms[name]
            for c in changes[1:]:
                summed = summed.plus(c.histograms[name]) if summed else None
            if summed:
                histograms[name] = summed
        names = set().union(*(c.counters for c in changes))
        return Scrape(histograms, {n: sum(c.counters.get(n, 0.0) for c in changes) for n in names})
