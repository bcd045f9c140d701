"""Which latency degraded first under load, and why: decided from the parts the server reports.

The latency: the first step whose TTFT-P99, or TPOT-P99, passes DEGRADE_RATIO times the lightest
step's (when both pass at the same step, the one that moved further). The cause:

- TTFT first: the TTFT parts (parts.py) of the lightest step against the degraded one. The part
  whose mean grew most names the cause: queue_ms -> scheduling (requests wait for a slot or a
  batch: slots, priority, admission control), prefill_ms -> compute contention (prefills share the
  device with other requests' work: chunked prefill, prefix caching, fewer concurrent prefills),
  other_ms -> the server's front end or the network. Without parts: unknown, and the reason.
- TPOT first: each decode step slows as the batch grows; what it is bound by is the device's,
  named by the batch-1 attribution of a `quantkit bench` result on that device (`attribution.bound`:
  bandwidth, compute or overhead). Without one: unknown. Never bandwidth by default: a CPU's
  decode is often compute-bound, a GPU's at small batch bandwidth-bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from quantkit.load.parts import PARTS, mean_of
from quantkit.load.step_record import Step

# A latency "degrades" once its P99 exceeds this multiple of the first (lightest) step's P99.
DEGRADE_RATIO = 1.5

PART_CAUSE = {
    "queue_ms": "scheduling",
    "prefill_ms": "compute contention",
    "other_ms": "front end",
}
CAUSE_TEXT = {
    "scheduling": "requests wait for a slot or a batch (queueing); more slots, priority for short "
    "prompts or admission control move this knee",
    "compute contention": "prefills share the device with other requests' work; chunked prefill, "
    "prefix caching or fewer concurrent prefills move this knee",
    "front end": "the time outside the engine grew (HTTP, tokenizing, the network)",
    "bandwidth": "decode steps are bound by memory bandwidth (the batch-1 attribution); smaller "
    "weights and KV cache, i.e. quantization, or faster memory move this knee",
    "compute": "decode steps are bound by compute (the batch-1 attribution); a larger batch makes "
    "every step slower; threads, kernels with native arithmetic or a faster device move this knee",
    "overhead": "decode steps are bound by fixed per-step costs (the batch-1 attribution); a larger "
    "batch spreads them, fewer layers or a leaner runtime move this knee",
}


@dataclass(frozen=True)
class DeviceBound:
    """The resource a decode step is bound by on this device, and where that was read."""

    bound: str  # one of core.attribution.RESOURCES: bandwidth, compute, overhead
    source: str  # e.g. "bench.json row demo-int4 (attribution.bound)"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DegradedFirst:
    """Which P99 left its unloaded value first (`first`: "ttft", "tpot" or None), at which step and
    by how much, and the cause the server's parts or the device's attribution name."""

    first: str | None
    ttft_step: int | None = None
    ttft_ratio: float | None = None
    tpot_step: int | None = None
    tpot_ratio: float | None = None
    cause: str | None = None
    evidence: str | None = None
    part_growth_ms: dict | None = None
    meaning: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "DegradedFirst":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} in degraded_first")
        return cls(**data)


def _first_degraded(steps: Sequence[Step], metric: str) -> tuple[int | None, float | None]:
    base = steps[0].latency(metric).p99
    if not base:
        return None, None
    for i, step in enumerate(steps[1:], start=1):
        value = step.latency(metric).p99
        if value is None or value > DEGRADE_RATIO * base:
            return i, (value / base if value is not None else None)
    return None, None


def _ttft_cause(base: Step, step: Step, index: int) -> tuple[str, str, dict | None]:
    """(cause, evidence, growth of each part's mean in ms) from the two steps' TTFT parts."""
    before, after = base.ttft_parts, step.ttft_parts
    growth = {}
    for name in PARTS:
        a, b = mean_of(before, name), mean_of(after, name)
        if a is None or b is None:
            told = after if after is not None else before
            reason = told.absent if told is not None else None
            return "unknown", f"TTFT is not split: {reason or 'the steps carry no TTFT parts'}", None
        growth[name] = b - a
    largest = max(growth, key=growth.get)
    share = (after.share.queue, before.share.queue)
    queue, prefill, other = (growth[name] for name in PARTS)
    evidence = (
        f"from the lightest step to step {index}: queue +{queue:.0f} ms, "
        f"prefill {prefill:+.0f} ms, other {other:+.0f} ms (means)"
    )
    if share[0] is not None and share[1] is not None:
        evidence += f"; queue share {100 * share[1]:.0f}% -> {100 * share[0]:.0f}%"
    return PART_CAUSE[largest], evidence, growth


def degraded_first(steps: Sequence[Step], attribution: DeviceBound | None = None) -> DegradedFirst:
    """Which P99 left its unloaded value first, and the cause the server's parts (TTFT) or the
    device's batch-1 attribution (TPOT) name."""
    ttft_step, ttft_ratio = _first_degraded(steps, "ttft_ms") if steps else (None, None)
    tpot_step, tpot_ratio = _first_degraded(steps, "tpot_ms") if steps else (None, None)
    if ttft_step is None and tpot_step is None:
        first = None
    elif tpot_step is None or (ttft_step is not None and ttft_step < tpot_step):
        first = "ttft"
    elif ttft_step is None or tpot_step < ttft_step:
        first = "tpot"
    else:  # same step: the one that moved further from its baseline
        first = "ttft" if (ttft_ratio or float("inf")) >= (tpot_ratio or float("inf")) else "tpot"
    cause = evidence = growth = None
    if first == "ttft":
        cause, evidence, growth = _ttft_cause(steps[0], steps[ttft_step], ttft_step)
    elif first == "tpot":
        cause = attribution.bound if attribution else "unknown"
        evidence = (
            f"the device's batch-1 attribution: {attribution.source}"
            if attribution
            else "no batch-1 attribution of this device was given (--attribution BENCH.json)"
        )
    return DegradedFirst(
        first=first,
        ttft_step=ttft_step,
        ttft_ratio=ttft_ratio,
        tpot_step=tpot_step,
        tpot_ratio=tpot_ratio,
        cause=cause,
        evidence=evidence,
        part_growth_ms=growth,
        meaning=meaning(first, cause, evidence),
    )


def meaning(first: str | None, cause: str | None, evidence: str | None) -> str:
    """One line: which latency degraded first and what that points at."""
    if first is None:
        return f"neither TTFT-P99 nor TPOT-P99 exceeded {DEGRADE_RATIO:g}x the first step's within the bounds"
    head = "TTFT degraded first" if first == "ttft" else "TPOT degraded first"
    if cause == "unknown":
        return f"{head}; its cause is unknown: {evidence}"
    return f"{head}: {cause}: {CAUSE_TEXT[cause]} ({evidence})"
