"""One step of a load run (or one level, its steps pooled) as a typed record: what load_stats.py
summarizes from the requests, and what the search, the intervals, the terminal, the lever table,
compare and the plot read, as attributes. A step's JSON is its `to_json`; `from_json` reads what
every schema wrote (a schema-1 step lacks the keys schema 2 added: they read as None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from quantkit.load.cpu import CpuShares
from quantkit.load.parts import TtftParts


@dataclass(frozen=True)
class Latency:
    """P50/P90/P99 and the mean of one latency over a step's requests (ms); None where none was measured."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict | None) -> "Latency":
        return cls(**data) if data else cls()


@dataclass(frozen=True)
class Samples:
    """Each answered request's TTFT, TPOT and E2E (ms) and its class: what intervals.py resamples."""

    ttft_ms: list
    tpot_ms: list
    e2e_ms: list | None = None
    cls: list | None = None

    def of(self, metric: str) -> list:
        """The values of `metric` ("ttft_ms", "tpot_ms" or "e2e_ms")."""
        return getattr(self, metric)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Samples":
        return cls(**data)


@dataclass(frozen=True)
class Goodput:
    """Requests per second that met every SLO, and their fraction of the requests sent."""

    qps: float | None
    fraction: float | None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Goodput":
        return cls(**data)


@dataclass(frozen=True)
class StepClient:
    """The client's own cost in a step: parsing per request, the open loop's send lag, its CPU share."""

    parse_ms: Latency
    send_lag_ms: Latency | None = None
    cpu_share: float | None = None

    def to_json(self) -> dict:
        lag = self.send_lag_ms.to_json() if self.send_lag_ms else None
        return {"parse_ms": self.parse_ms.to_json(), "send_lag_ms": lag, "cpu_share": self.cpu_share}

    @classmethod
    def from_json(cls, data: dict) -> "StepClient":
        lag = data.get("send_lag_ms")
        return cls(Latency.from_json(data["parse_ms"]), Latency.from_json(lag) if lag else None, data.get("cpu_share"))


@dataclass(frozen=True)
class ClassStats:
    """One workload class's latencies in a step (long-short: `short`, `long`)."""

    requests: int
    completed: int
    ttft_ms: Latency
    tpot_ms: Latency
    e2e_ms: Latency
    goodput_fraction: float | None
    ttft_parts: TtftParts

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "ttft_ms": self.ttft_ms.to_json(),
            "tpot_ms": self.tpot_ms.to_json(),
            "e2e_ms": self.e2e_ms.to_json(),
            "goodput_fraction": self.goodput_fraction,
            "ttft_parts": self.ttft_parts.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "ClassStats":
        return cls(
            requests=data["requests"],
            completed=data["completed"],
            ttft_ms=Latency.from_json(data["ttft_ms"]),
            tpot_ms=Latency.from_json(data["tpot_ms"]),
            e2e_ms=Latency.from_json(data["e2e_ms"]),
            goodput_fraction=data.get("goodput_fraction"),
            ttft_parts=TtftParts.from_json(data.get("ttft_parts")),
        )


_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
# keys a step's JSON holds only where they have a value: a step's samples (a pooled level or a
# discarded step keeps none), a pooled level's number of steps
_WHERE_SET = ("samples", "steps")


@dataclass(frozen=True)
class Step:
    """A staircase step, or a level (its full steps pooled: `phase` "pooled", `steps` their number)."""

    offered: float
    mode: str | None = None
    partial: bool = False
    requests: int = 0
    completed: int = 0
    unfinished: int | None = None
    errors: dict | None = None  # error kind -> count (request_timings.ERROR_KINDS)
    error_count: int = 0
    error_examples: dict | None = None  # error kind -> the first message seen
    timeouts: int = 0
    duration_s: float | None = None
    achieved_qps: float | None = None
    output_tokens_per_s: float | None = None
    output_tokens_mean: float | None = None
    prompt_tokens_mean: float | None = None
    prompt_words_mean: float | None = None
    cached_tokens_mean: float | None = None
    cache_hit_fraction: float | None = None
    draft_tokens_mean: float | None = None
    draft_acceptance: float | None = None
    tokens_from_usage: bool = False
    ttft_ms: Latency = Latency()
    tpot_ms: Latency = Latency()
    itl_ms: Latency = Latency()
    e2e_ms: Latency = Latency()
    ttft_parts: TtftParts | None = None
    classes: dict[str, ClassStats] | None = None
    goodput: Goodput | None = None
    client: StepClient | None = None
    samples: Samples | None = None
    phase: str | None = None
    repeat: int | None = None
    cpu: CpuShares | None = None
    steps: int | None = None

    def latency(self, metric: str) -> Latency:
        """One of ttft_ms, tpot_ms, itl_ms, e2e_ms by its name."""
        return getattr(self, metric)

    def errors_of(self, kind: str) -> int:
        return (self.errors or {}).get(kind, 0)

    @property
    def parts(self) -> TtftParts | None:
        """Its TTFT parts where the server split TTFT, else None."""
        return self.ttft_parts if self.ttft_parts is not None and self.ttft_parts.absent is None else None

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _WHERE_SET:
                continue
            if f.name == "classes" and value is not None:
                value = {name: c.to_json() for name, c in value.items()}
            elif hasattr(value, "to_json"):
                value = value.to_json()
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Step":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} in a load step")
        d = dict(data)
        for name in _LATENCIES:
            if name in d:
                d[name] = Latency.from_json(d[name])
        for name, record in (
            ("goodput", Goodput),
            ("client", StepClient),
            ("samples", Samples),
            ("cpu", CpuShares),
            ("ttft_parts", TtftParts),
        ):
            if d.get(name) is not None:
                d[name] = record.from_json(d[name])
        if d.get("classes") is not None:
            d["classes"] = {name: ClassStats.from_json(c) for name, c in d["classes"].items()}
        return cls(**d)
