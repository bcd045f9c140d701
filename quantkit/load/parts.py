"""TTFT under load split into queueing, prefill and the rest, from what the server itself reports.

Nothing here is guessed: a part the server does not report is absent, and the step says why.

Per request, from llama.cpp's server (the `timings` of its last chunk; tools/server: `prompt_ms`
runs from the slot starting the prompt to its first token, `predicted_ms` from the first token to
the last):

    prefill_ms = timings.prompt_ms
    queue_ms   = client E2E - timings.prompt_ms - timings.predicted_ms
                 the time the server held the request without working on it: the wait for a free
                 slot, plus HTTP, tokenization and loopback (their fixed cost is the lightest step's)
    other_ms   = client TTFT - queue_ms - prefill_ms
               = timings.predicted_ms - (client E2E - client TTFT)
                 the first token's way to the client minus the last one's: near zero when the
                 server's clock and the client's describe the same request; a request whose
                 |other_ms| passes MISMATCH of its TTFT is counted as mismatched

Per step, from vLLM's /metrics (metrics.py: the histograms' change over the step):

    prefill_ms = vllm:request_prefill_time_seconds (scheduled to first token)
    queue_ms   = vllm:time_to_first_token_seconds - prefill: from the request's arrival in vLLM's
                 front end to its prefill's start. vLLM's own queue time
                 (vllm:request_queue_time_seconds) starts later: a request is stamped QUEUED when
                 the engine loop next takes new requests in, between two steps (vllm/v1/engine/
                 core.py run_busy_loop), so the wait for the step in progress lies before it; with
                 the front end's templating and tokenizing it is time the server held the request
                 without working on it, as llama-server's queue_ms above counts it. The scheduler's
                 own queue time is kept beside it (check: scheduler_queue_mean_ms).
    other_ms   = the client's mean TTFT - vLLM's: HTTP, loopback and the first chunk's way out.

Without vLLM's TTFT histogram, queue_ms is the scheduler's queue time and other_ms the rest of the
client's TTFT. Means are exact (sum / count); the scheduler's P50/P99 are known to a bucket and
carry its bounds; the arrival-based queue has a mean only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantkit.load.metrics import Histogram
from quantkit.load.request_timings import RequestRecord

PARTS = ("queue_ms", "prefill_ms", "other_ms")
# A request's parts must add up to its TTFT within this fraction; above it, "other" is no longer
# the small transport term and the server's timings do not describe what the client measured.
MISMATCH = 0.05

LLAMA_SOURCE = {
    "queue_ms": "client E2E - llama-server timings.prompt_ms - timings.predicted_ms (per request)",
    "prefill_ms": "llama-server timings.prompt_ms (per request)",
    "other_ms": "client TTFT - queue_ms - prefill_ms (per request)",
}
# vLLM's per-request histograms (vllm/v1/metrics/loggers.py), in seconds
VLLM_QUEUE = "vllm:request_queue_time_seconds"
VLLM_PREFILL = "vllm:request_prefill_time_seconds"
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_SOURCE = {
    "queue_ms": f"vLLM /metrics {VLLM_QUEUE}, its change over the step",
    "prefill_ms": f"vLLM /metrics {VLLM_PREFILL}, its change over the step",
    "other_ms": "client mean TTFT - the mean queue and prefill (step means)",
}
VLLM_ARRIVAL_SOURCE = {
    "queue_ms": f"vLLM /metrics {VLLM_TTFT} - {VLLM_PREFILL} (step means): arrival in vLLM to prefill start, "
    f"the wait for the step in progress before its scheduler's queue ({VLLM_QUEUE}) included",
    "prefill_ms": VLLM_SOURCE["prefill_ms"],
    "other_ms": f"client mean TTFT - vLLM's ({VLLM_TTFT}): HTTP, loopback, the first chunk's way out",
}
ABSENT = (
    "the server reported neither per-request timings (llama.cpp's `timings`) nor queue and "
    "prefill histograms at /metrics (vLLM's), so TTFT is not split"
)


@dataclass(frozen=True)
class PartStats:
    """One part's statistics over a step's requests (ms); a histogram's quantiles carry their bucket."""

    n: int | None = None
    mean: float | None = None
    p50: float | None = None
    p99: float | None = None
    p50_bucket_ms: list | None = None
    p99_bucket_ms: list | None = None
    bucketed: bool = False  # whether the JSON holds the bucket keys (a histogram's parts)

    def to_json(self) -> dict:
        out = {"n": self.n, "mean": self.mean, "p50": self.p50, "p99": self.p99}
        if self.bucketed:
            out.update(p50_bucket_ms=self.p50_bucket_ms, p99_bucket_ms=self.p99_bucket_ms)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "PartStats":
        return cls(**data, bucketed="p50_bucket_ms" in data)


@dataclass(frozen=True)
class PartShares:
    """Each part's share of TTFT."""

    queue: float | None = None
    prefill: float | None = None
    other: float | None = None

    def to_json(self) -> dict:
        return {"queue": self.queue, "prefill": self.prefill, "other": self.other}

    @classmethod
    def from_json(cls, data: dict) -> "PartShares":
        return cls(**data)


@dataclass(frozen=True)
class PartsCheck:
    """Whether the parts describe what the client measured: how it was checked, how many requests
    (or steps) did not fit, and what the source adds (the worst mismatch, the server's own TTFT)."""

    kind: str
    mismatched: int
    more: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, **self.more, "mismatched": self.mismatched}

    @classmethod
    def from_json(cls, data: dict) -> "PartsCheck":
        more = {k: v for k, v in data.items() if k not in ("kind", "mismatched")}
        return cls(kind=data["kind"], mismatched=data["mismatched"], more=more)


@dataclass(frozen=True)
class TtftParts:
    """A step's TTFT split into queue, prefill and other, or `absent` with the reason."""

    absent: str | None = None
    source: dict | None = None  # part -> where its numbers come from
    per_request: bool = False
    n: int = 0
    of: int = 0
    queue_ms: PartStats = PartStats()
    prefill_ms: PartStats = PartStats()
    other_ms: PartStats = PartStats()
    share: PartShares = PartShares()
    check: PartsCheck | None = None

    def part(self, name: str) -> PartStats:
        """One of PARTS by its name."""
        return getattr(self, name)

    def source_of(self, name: str) -> str | None:
        return (self.source or {}).get(name)

    def to_json(self) -> dict:
        if self.absent is not None:
            return {"absent": self.absent}
        return {
            "source": self.source,
            "per_request": self.per_request,
            "n": self.n,
            "of": self.of,
            **{name: self.part(name).to_json() for name in PARTS},
            "share": self.share.to_json(),
            "check": self.check.to_json() if self.check else None,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> "TtftParts":
        if not data:
            return cls(absent=ABSENT)
        if "absent" in data:
            return cls(absent=data["absent"])
        return cls(
            source=data.get("source"),
            per_request=data.get("per_request", False),
            n=data.get("n", 0),
            of=data.get("of", 0),
            **{name: PartStats.from_json(data.get(name) or {}) for name in PARTS},
            share=PartShares.from_json(data.get("share") or {}),
            check=PartsCheck.from_json(data["check"]) if data.get("check") else None,
        )


def request_parts(rec: RequestRecord) -> tuple[float, float, float] | None:
    """(queue_ms, prefill_ms, other_ms) of one answered request whose server sent its timings."""
    if not rec.ok or rec.server_prompt_ms is None or rec.server_predicted_ms is None:
        return None
    ttft, e2e = 1e3 * (rec.t_first - rec.t_send), 1e3 * (rec.t_end - rec.t_send)
    queue = e2e - rec.server_prompt_ms - rec.server_predicted_ms
    return queue, rec.server_prompt_ms, ttft - queue - rec.server_prompt_ms


def _stats(values: Sequence[float]) -> PartStats:
    arr = np.asarray(values, dtype=float)
    return PartStats(
        n=int(arr.size), mean=float(arr.mean()), p50=float(np.percentile(arr, 50)), p99=float(np.percentile(arr, 99))
    )


def from_records(ok: Sequence[RequestRecord]) -> TtftParts | None:
    """The step's parts from per-request server timings; None when no request carried them."""
    rows = [(parts, 1e3 * (r.t_first - r.t_send)) for r in ok if (parts := request_parts(r)) is not None]
    if not rows:
        return None
    stats = {name: _stats([parts[i] for parts, _ in rows]) for i, name in enumerate(PARTS)}
    # the mean over requests of each part's share of that request's TTFT
    share = {name[:-3]: float(np.mean([p[i] / t for p, t in rows if t > 0])) for i, name in enumerate(PARTS)}
    errors = [abs(p[2]) / t for p, t in rows if t > 0]
    check = PartsCheck(
        kind="per request: |other_ms| within 5% of TTFT",
        mismatched=sum(e > MISMATCH for e in errors),
        more={"worst_pct": 100 * max(errors) if errors else None},
    )
    return TtftParts(
        source=LLAMA_SOURCE, per_request=True, n=len(rows), of=len(ok), **stats, share=PartShares(**share), check=check
    )


def _bucketed(h: Histogram) -> PartStats:
    """Mean (exact) and P50/P99 (within a bucket, with its bounds) of a histogram in seconds, in ms."""
    found = {q: h.quantile(q / 100) for q in (50, 99)}
    return PartStats(
        n=int(round(h.count)),
        mean=1e3 * h.mean if h.mean is not None else None,
        p50=1e3 * found[50][0] if found[50] else None,
        p99=1e3 * found[99][0] if found[99] else None,
        p50_bucket_ms=[1e3 * found[50][1], 1e3 * found[50][2]] if found[50] else None,
        p99_bucket_ms=[1e3 * found[99][1], 1e3 * found[99][2]] if found[99] else None,
        bucketed=True,
    )


def from_histograms(delta: dict[str, Histogram], client: float | None, completed: int) -> TtftParts | None:
    """The step's parts from vLLM's histograms over the step; None when the server has none of them.
    `client` is the client's mean TTFT (ms) over the same step."""
    queue, prefill = delta.get(VLLM_QUEUE), delta.get(VLLM_PREFILL)
    if queue is None or prefill is None or not queue.count or client is None:
        return None
    n = int(round(queue.count))
    scheduler, prefill_ms = _bucketed(queue), _bucketed(prefill)
    server_ttft = delta.get(VLLM_TTFT)
    server_ms = 1e3 * server_ttft.mean if server_ttft is not None and server_ttft.count and server_ttft.mean else None
    if server_ms is not None:  # arrival in vLLM to prefill start (the module's docstring says why)
        queue_ms, source = PartStats(n=n, mean=max(0.0, server_ms - prefill_ms.mean)), VLLM_ARRIVAL_SOURCE
    else:
        queue_ms, source = scheduler, VLLM_SOURCE
    other = client - queue_ms.mean - prefill_ms.mean
    check = PartsCheck(
        kind="step means: the server's requests are the client's, and queue + prefill fit in TTFT",
        mismatched=int(other < -MISMATCH * client),
        more={
            # a count that differs: requests of another client, or of the warm-up, are in the histograms
            "requests_match": n == completed,
            "server_ttft_mean_ms": server_ms,
            "scheduler_queue_mean_ms": scheduler.mean,
        },
    )
    return TtftParts(
        source=source,
        per_request=False,
        n=n,
        of=completed,
        queue_ms=queue_ms,
        prefill_ms=prefill_ms,
        other_ms=PartStats(n=n, mean=other),
        share=PartShares(queue=queue_ms.mean / client, prefill=prefill_ms.mean / client, other=other / client),
        check=check,
    )


def absent() -> TtftParts:
    return TtftParts(absent=ABSENT)


def mean_of(parts: TtftParts | None, name: str) -> float | None:
    """A part's step mean, or None when the step has no parts."""
    if parts is None or parts.absent is not None:
        return None
    return parts.part(name).mean
