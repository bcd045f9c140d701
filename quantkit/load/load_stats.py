"""The numbers of a load run, as pure functions of recorded request timings.

Definitions (all per request, in the client's clock):
  TTFT = first generated chunk - send;  E2E = end - send;
  TPOT = (E2E - TTFT) / (output tokens - 1), the mean time per output token after the first;
  ITL  = the gaps between successive chunks that carried generated text (pooled over requests);
  goodput = requests per second that met every SLO (TTFT <= ttft and TPOT <= tpot).
A step's achieved QPS counts completed requests over the step's wall time (first send to last end).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from quantkit.load import parts
from quantkit.load.config import Slo
from quantkit.load.degrade import DeviceBound, degraded_first
from quantkit.load.load_analysis import Analysis, Knee, Peak, SloBest
from quantkit.load.metrics import Scrape
from quantkit.load.parts import TtftParts
from quantkit.load.request_timings import ERROR_KINDS, RequestRecord
from quantkit.load.step_record import ClassStats, Goodput, Latency, Samples, Step, StepClient

PERCENTILES = (50, 90, 99)
# A step is saturated when its throughput grew by less than this fraction of the load increase
# (doubling the load bought less than +50% req/s) ...
FLAT_FRACTION = 0.5
# ... while its TTFT-P99 rose by more than this factor. Both are judgment calls, set well above the
# +-10-20% step-to-step jitter of the loaded 2-core machine the runs in docs/LOAD.md come from.
TTFT_RISE = 1.25


def percentiles(values: Iterable[float], scale: float = 1000.0) -> Latency:
    """P50/P90/P99 and the mean (linear interpolation, numpy's default), times `scale` (s -> ms)."""
    arr = np.asarray(list(values), dtype=float) * scale
    if arr.size == 0:
        return Latency()
    p50, p90, p99 = (float(np.percentile(arr, q)) for q in PERCENTILES)
    return Latency(n=int(arr.size), mean=float(arr.mean()), p50=p50, p90=p90, p99=p99)


def ttft_s(rec: RequestRecord) -> float:
    return rec.t_first - rec.t_send


def e2e_s(rec: RequestRecord) -> float:
    return rec.t_end - rec.t_send


def tpot_s(rec: RequestRecord) -> float | None:
    """Mean time per output token after the first; None for a single-token answer."""
    if not rec.output_tokens or rec.output_tokens < 2:
        return None
    return (rec.t_end - rec.t_first) / (rec.output_tokens - 1)


def itls_s(rec: RequestRecord) -> list[float]:
    times = rec.chunk_times
    return [b - a for a, b in zip(times, times[1:])]


def meets_slo(rec: RequestRecord, slo: Slo) -> bool:
    if not rec.ok:
        return False
    if slo.ttft_ms is not None and ttft_s(rec) * 1000 > slo.ttft_ms:
        return False
    tpot = tpot_s(rec)
    return slo.tpot_ms is None or tpot is None or tpot * 1000 <= slo.tpot_ms


def count_errors(records: Sequence[RequestRecord]) -> dict:
    counts = {kind: 0 for kind in ERROR_KINDS}
    for rec in records:
        if rec.error is not None:
            counts[rec.error] = counts.get(rec.error, 0) + 1
    return counts


def error_examples(records: Sequence[RequestRecord]) -> dict:
    """The first message seen per error kind: what a misbehaving server actually sent."""
    examples: dict[str, str] = {}
    for rec in records:
        if rec.error is not None and rec.error not in examples:
            examples[rec.error] = rec.detail or ""
    return examples


def prompt_cache(ok: Sequence[RequestRecord]) -> dict:
    """The server's prompt token counts and, where it reports them, tokens served from its prefix cache."""
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    words = [r.prompt_words for r in ok if r.prompt_words is not None]
    both = [(r.prompt_tokens, r.cached_tokens) for r in ok if r.prompt_tokens and r.cached_tokens is not None]
    return {
        "prompt_tokens_mean": (sum(prompt) / len(prompt)) if prompt else None,
        "prompt_words_mean": (sum(words) / len(words)) if words else None,  # what the client sent
        "cached_tokens_mean": (sum(c for _, c in both) / len(both)) if both else None,
        # cached / prompt tokens, summed over the requests that report both
        "cache_hit_fraction": (sum(c for _, c in both) / sum(p for p, _ in both)) if both else None,
    }


# vLLM's speculative decoding counters (vllm/v1/spec_decode/metrics.py)
VLLM_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def speculation(ok: Sequence[RequestRecord], counters: dict[str, float] | None = None) -> dict:
    """Where the server decodes speculatively and says so: draft tokens per request and the share it
    kept, per answer (llama.cpp's timings) or from the server's counters over the step (vLLM's)."""
    both = [
        (r.draft_tokens, r.draft_accepted) for r in ok if r.draft_tokens is not None and r.draft_accepted is not None
    ]
    drafted = sum(d for d, _ in both)
    if not both and counters and counters.get(VLLM_DRAFTED):
        drafted = counters[VLLM_DRAFTED]
        return {
            "draft_tokens_mean": drafted / len(ok) if ok else None,
            "draft_acceptance": counters.get(VLLM_ACCEPTED, 0.0) / drafted,
        }
    return {
        "draft_tokens_mean": (drafted / len(both)) if both else None,
        # accepted / drafted tokens, summed over the requests that report both
        "draft_acceptance": (sum(a for _, a in both) / drafted) if drafted else None,
    }


def _client_overhead(records: Sequence[RequestRecord], cpu_s: float | None, duration: float) -> StepClient:
    lags = [r.t_send - r.t_scheduled for r in records if r.t_scheduled is not None]
    return StepClient(
        parse_ms=percentiles(r.client_s for r in records),
        send_lag_ms=percentiles(lags) if lags else None,
        cpu_share=(cpu_s / duration) if cpu_s is not None and duration > 0 else None,
    )


def _samples(ok: Sequence[RequestRecord]) -> Samples:
    """Each answered request's TTFT, TPOT and E2E in ms (and its class): what an interval over
    requests resamples (intervals.py), kept with the step so that stored runs can be compared."""
    return Samples(
        ttft_ms=[round(1e3 * ttft_s(r), 3) for r in ok],
        tpot_ms=[None if (t := tpot_s(r)) is None else round(1e3 * t, 3) for r in ok],
        e2e_ms=[round(1e3 * e2e_s(r), 3) for r in ok],
        cls=[r.cls for r in ok] if any(r.cls for r in ok) else None,
    )


def _latencies(records: Sequence[RequestRecord], ok: Sequence[RequestRecord], slo: Slo, found: TtftParts) -> ClassStats:
    """A step's (or one class's of the workload: long-short) latency percentiles and goodput fraction."""
    good = sum(meets_slo(r, slo) for r in records) if not slo.empty else None
    return ClassStats(
        requests=len(records),
        completed=len(ok),
        ttft_ms=percentiles(ttft_s(r) for r in ok),
        tpot_ms=percentiles(t for t in (tpot_s(r) for r in ok) if t is not None),
        e2e_ms=percentiles(e2e_s(r) for r in ok),
        goodput_fraction=(good / len(records)) if good is not None and records else None,
        ttft_parts=found,
    )


def _classes(records: Sequence[RequestRecord], slo: Slo) -> dict[str, ClassStats] | None:
    names = sorted({r.cls for r in records if r.cls})
    if not names:
        return None
    out = {}
    for name in names:
        mine = [r for r in records if r.cls == name]
        ok = [r for r in mine if r.ok]
        out[name] = _latencies(mine, ok, slo, parts.from_records(ok) or parts.absent())
    return out


def ttft_parts(ok: Sequence[RequestRecord], ttft_ms: Latency, server_delta: Scrape | None) -> TtftParts:
    """The step's TTFT parts: per request from the answers' timings, else from the server's
    histograms over the step, else absent with the reason."""
    found = parts.from_records(ok)
    if found is None and server_delta:
        found = parts.from_histograms(server_delta.histograms, ttft_ms.mean, len(ok))
    return found or parts.absent()


def summarize_step(
    records: Sequence[RequestRecord],
    *,
    mode: str,
    offered: float,
    t_start: float,
    slo: Slo,
    cpu_s: float | None = None,
    partial: bool = False,
    t_stop: float | None = None,
    duration: float | None = None,
    server_delta: Scrape | None = None,
) -> Step:
    """One staircase step: throughput, latency percentiles, TTFT parts, errors, goodput, client overhead.

    A step cut short (`partial`, with `t_stop` when it was cut) ran from `t_start` to `t_stop`:
    its throughput is what it completed over that time, and requests still in flight then are
    counted as `unfinished` (neither completed nor failed). `duration` overrides the wall time
    (a level pooled over repeats: the sum of its steps'). `server_delta`: the server's /metrics
    metrics' change over the step (vLLM's queue and prefill times, its speculative decoding counters)."""
    ok = [r for r in records if r.ok]
    ends = [r.t_end for r in records if r.t_end is not None]
    if duration is None:
        duration = (t_stop - t_start) if t_stop is not None else ((max(ends) - t_start) if ends else 0.0)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: None)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    errors = count_errors(records)
    latencies = _latencies(records, ok, slo, parts.absent())
    goodput = None
    if not slo.empty:
        good = sum(meets_slo(r, slo) for r in records)
        goodput = Goodput(qps=per_s(good), fraction=good / len(records) if records else None)
    return Step(
        mode=mode,
        offered=offered,
        partial=partial,
        requests=len(records),
        completed=len(ok),
        unfinished=sum(not r.finished for r in records),
        errors=errors,
        error_count=sum(errors.values()),
        error_examples=error_examples(records),
        timeouts=errors["timeout"],
        duration_s=duration,
        achieved_qps=per_s(len(ok)),
        output_tokens_per_s=per_s(out_tokens),
        output_tokens_mean=(out_tokens / len(ok)) if ok else None,
        **prompt_cache(ok),
        **speculation(ok, server_delta.counters if server_delta else None),
        tokens_from_usage=bool(ok) and all(r.tokens_from_usage for r in ok),
        ttft_ms=latencies.ttft_ms,
        tpot_ms=latencies.tpot_ms,
        itl_ms=percentiles(gap for r in ok for gap in itls_s(r)),
        e2e_ms=latencies.e2e_ms,
        ttft_parts=ttft_parts(ok, latencies.ttft_ms, server_delta),
        classes=_classes(records, slo),
        goodput=goodput,
        client=_client_overhead(records, cpu_s, duration),
        samples=_samples(ok),
    )


def is_saturated(prev: Step, cur: Step) -> bool:
    """Throughput flattened (grew < FLAT_FRACTION of the load increase) while TTFT-P99 rose."""
    qps_prev, qps_cur = prev.achieved_qps, cur.achieved_qps
    if not qps_prev:
        return False
    offered_gain = cur.offered / prev.offered - 1
    flat = (qps_cur or 0.0) / qps_prev - 1 < FLAT_FRACTION * offered_gain
    ttft_prev, ttft_cur = prev.ttft_ms.p99, cur.ttft_ms.p99
    if ttft_prev is None:
        return False
    rising = ttft_cur is None or ttft_cur > TTFT_RISE * ttft_prev
    return flat and rising


def saturated_flags(steps: Sequence[Step]) -> list[bool]:
    return [False] + [is_saturated(a, b) for a, b in zip(steps, steps[1:])]


def should_stop(steps: Sequence[Step], patience: int) -> bool:
    """True once the last `patience` steps were each saturated against the one before."""
    flags = saturated_flags(steps)
    return patience > 0 and len(flags) > patience and all(flags[-patience:])


def find_knee(steps: Sequence[Step]) -> Knee | None:
    """The last step that still scaled before the first saturated one; None if none saturated."""
    flags = saturated_flags(steps)
    if True not in flags:
        return None
    index = flags.index(True) - 1
    step = steps[index]
    return Knee(
        index=index,
        offered=step.offered,
        achieved_qps=step.achieved_qps,
        output_tokens_per_s=step.output_tokens_per_s,
        ttft_p99_ms=step.ttft_ms.p99,
        tpot_p99_ms=step.tpot_ms.p99,
        saturated_step=index + 1,
    )


def max_qps_within_slo(steps: Sequence[Step], slo: Slo) -> SloBest | None:
    """The highest achieved QPS among steps whose TTFT-P99 and TPOT-P99 met the SLO."""
    if slo.empty:
        return None
    best = None
    for i, step in enumerate(steps):
        ttft, tpot = step.ttft_ms.p99, step.tpot_ms.p99
        if ttft is None or not step.achieved_qps:
            continue
        if slo.ttft_ms is not None and ttft > slo.ttft_ms:
            continue
        if slo.tpot_ms is not None and tpot is not None and tpot > slo.tpot_ms:
            continue
        if best is None or step.achieved_qps > best.achieved_qps:
            best = SloBest(index=i, offered=step.offered, achieved_qps=step.achieved_qps, partial=bool(step.partial))
    return best


def analyze(steps: Sequence[Step], slo: Slo, attribution: DeviceBound | None = None) -> Analysis:
    """The knee, saturation and what degraded first come from the full steps (a cut-short step
    cannot be judged against the one before); the peak and the best req/s within the SLO count a
    partial step too, at the throughput it kept up until it was cut (summarize_step's t_stop)."""
    full = [s for s in steps if not s.partial]
    measured = [i for i, s in enumerate(steps) if s.achieved_qps is not None]
    peak = max(measured, key=lambda i: steps[i].achieved_qps) if measured else None
    top = steps[peak] if peak is not None else None
    return Analysis(
        knee=find_knee(full),
        peak=None
        if top is None
        else Peak(top.offered, top.achieved_qps, top.output_tokens_per_s, bool(top.partial), index=peak),
        saturated_steps=[i for i, flag in enumerate(saturated_flags(full)) if flag],
        degraded_first=degraded_first(full, attribution),
        max_qps_within_slo=max_qps_within_slo(steps, slo),
    )
