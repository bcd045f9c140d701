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

Per step, from vLLM's /metrics (metrics.py: the histograms' change over the step): the scheduler's
queue time (`vllm:request_queue_time_seconds`) and prefill time (`..._prefill_time_seconds`), and
other = the client's mean TTFT - their means (the front end: tokenizing, detokenizing, HTTP).
Means are exact (sum / count); P50/P99 are known to a bucket and carry its bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

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
ABSENT = (
    "the server reported neither per-request timings (llama.cpp's `timings`) nor queue and "
    "prefill histograms at /metrics (vLLM's), so TTFT is not split"
)


def request_parts(rec: RequestRecord) -> tuple[float, float, float] | None:
    """(queue_ms, prefill_ms, other_ms) of one answered request whose server sent its timings."""
    if not rec.ok or rec.server_prompt_ms is None or rec.server_predicted_ms is None:
        return None
    ttft, e2e = 1e3 * (rec.t_first - rec.t_send), 1e3 * (rec.t_end - rec.t_send)
    queue = e2e - rec.server_prompt_ms - rec.server_predicted_ms
    return queue, rec.server_prompt_ms, ttft - queue - rec.server_prompt_ms


def _stats(values: Sequence[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {
        "n": int(arr.size),
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
    }


def from_records(ok: Sequence[RequestRecord]) -> dict | None:
    """The step's parts from per-request server timings; None when no request carried them."""
    rows = [(parts, 1e3 * (r.t_first - r.t_send)) for r in ok if (parts := request_parts(r)) is not None]
    if not rows:
        return None
    out: dict = {"source": LLAMA_SOURCE, "per_request": True, "n": len(rows), "of": len(ok)}
    for i, name in enumerate(PARTS):
        out[name] = _stats([parts[i] for parts, _ in rows])
    # the mean over requests of each part's share of that request's TTFT
    out["share"] = {name[:-3]: float(np.mean([p[i] / t for p, t in rows if t > 0])) for i, name in enumerate(PARTS)}
    errors = [abs(p[2]) / t for p, t in rows if t > 0]
    out["check"] = {
        "kind": "per request: |other_ms| within 5% of TTFT",
        "mismatched": sum(e > MISMATCH for e in errors),
        "worst_pct": 100 * max(errors) if errors else None,
    }
    return out


def _bucketed(h: Histogram) -> dict:
    """Mean (exact) and P50/P99 (within a bucket, with its bounds) of a histogram in seconds, in ms."""
    out = {"n": int(round(h.count)), "mean": 1e3 * h.mean if h.mean is not None else None}
    for q in (50, 99):
        found = h.quantile(q / 100)
        out[f"p{q}"] = 1e3 * found[0] if found else None
        out[f"p{q}_bucket_ms"] = [1e3 * found[1], 1e3 * found[2]] if found else None
    return out


def from_histograms(delta: dict[str, Histogram], ttft_ms: dict, completed: int) -> dict | None:
    """The step's parts from vLLM's histograms over the step; None when the server has none of them.
    `ttft_ms` is the client's TTFT summary of the same step (stats.percentiles)."""
    queue, prefill = delta.get(VLLM_QUEUE), delta.get(VLLM_PREFILL)
    if queue is None or prefill is None or not queue.count or ttft_ms.get("mean") is None:
        return None
    out: dict = {"source": VLLM_SOURCE, "per_request": False, "n": int(round(queue.count)), "of": completed}
    out["queue_ms"], out["prefill_ms"] = _bucketed(queue), _bucketed(prefill)
    client = ttft_ms["mean"]
    other = client - out["queue_ms"]["mean"] - out["prefill_ms"]["mean"]
    out["other_ms"] = {"n": out["n"], "mean": other, "p50": None, "p99": None}
    out["share"] = {
        "queue": out["queue_ms"]["mean"] / client,
        "prefill": out["prefill_ms"]["mean"] / client,
        "other": other / client,
    }
    server_ttft = delta.get(VLLM_TTFT)
    out["check"] = {
        "kind": "step means: the server's requests are the client's, and queue + prefill fit in TTFT",
        # a count that differs: requests of another client, or of the warm-up, are in the histograms
        "requests_match": int(round(queue.count)) == completed,
        "server_ttft_mean_ms": 1e3 * server_ttft.mean if server_ttft is not None and server_ttft.mean else None,
        "mismatched": int(other < -MISMATCH * client),
    }
    return out


def absent() -> dict:
    return {"absent": ABSENT}


def mean_of(parts: dict | None, name: str) -> float | None:
    """A part's step mean, or None when the step has no parts."""
    if not parts or parts.get("absent"):
        return None
    return (parts.get(name) or {}).get("mean")


def pool(steps_parts: Sequence[dict]) -> dict:
    """One level's parts from its steps' histogram parts: means weighted by their requests (a
    histogram quantile does not pool; per-request parts are pooled from the requests instead)."""
    found = [p for p in steps_parts if p and not p.get("absent")]
    if not found:
        return absent()
    n = sum(p["n"] for p in found)
    out: dict = {"source": found[0]["source"], "per_request": False, "n": n, "of": sum(p["of"] for p in found)}
    for name in PARTS:
        mean = sum(p[name]["mean"] * p["n"] for p in found) / n if n else None
        out[name] = {"n": n, "mean": mean, "p50": None, "p99": None}
    total = sum(out[name]["mean"] or 0.0 for name in PARTS)
    out["share"] = {name[:-3]: (out[name]["mean"] / total if total else None) for name in PARTS}
    out["check"] = {"kind": "pooled step means", "mismatched": sum(p["check"]["mismatched"] for p in found)}
    return out
