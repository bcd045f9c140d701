"""What `quantkit compare` makes of load runs (compare.py), as typed records: one row per run, the
P99s at the levels every run measured, the verdicts. A lever study keeps it in its study.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from quantkit.core.record_checks import known_keys
from quantkit.load.intervals import KneeShift, P99Difference
from quantkit.load.runfile import SCHEMA_VERSION

KIND = "load-comparison"


@dataclass(frozen=True)
class CompareRow:
    """One run's knees, peak and what degraded first; its ratios against the baseline (the first run)."""

    label: str
    mode: str
    knee_offered: float | None = None
    knee_qps: float | None = None
    knee_tokens_per_s: float | None = None
    knee_ttft_p99_ms: float | None = None
    knee_tpot_p99_ms: float | None = None
    peak_offered: float | None = None
    peak_qps: float | None = None
    peak_tokens_per_s: float | None = None
    max_qps_within_slo: float | None = None
    slo_knee: float | None = None
    slo_knee_ci95: list | None = None
    slo_knee_censored: str | None = None
    slo_knee_bound: float | None = None
    slo_knee_qps: float | None = None
    degraded_first: str | None = None
    cause: str | None = None
    stopped: str | None = None
    knee_qps_ratio: float | None = None
    peak_qps_ratio: float | None = None
    peak_tokens_ratio: float | None = None
    slo_knee_shift: KneeShift | None = None

    def to_json(self) -> dict:
        shift = self.slo_knee_shift.to_json() if self.slo_knee_shift else None
        return {**asdict(self), "slo_knee_shift": shift}

    @classmethod
    def from_json(cls, data: dict) -> "CompareRow":
        data = known_keys(cls, data, "a compared run")
        shift = data.get("slo_knee_shift")
        return cls(**{**data, "slo_knee_shift": KneeShift.from_json(shift) if shift else None})


_VERSUS = ("ttft_p99_vs_base", "tpot_p99_vs_base", "class_ttft_p99_vs_base")


@dataclass(frozen=True)
class MatchedEntry:
    """One run at one matched level: its req/s and P99s, and (not the baseline) their difference
    from the baseline's with an interval, where both runs kept their requests."""

    achieved_qps: float | None
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    ttft_p99_vs_base: P99Difference | None = None
    tpot_p99_vs_base: P99Difference | None = None
    class_ttft_p99_vs_base: P99Difference | None = None  # the class the SLO is judged on

    def to_json(self) -> dict:
        out = {"achieved_qps": self.achieved_qps, "ttft_p99_ms": self.ttft_p99_ms, "tpot_p99_ms": self.tpot_p99_ms}
        for name in _VERSUS:
            diff = getattr(self, name)
            if diff is not None:
                out[name] = diff.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "MatchedEntry":
        data = known_keys(cls, data, "a matched level's run")
        for name in _VERSUS:
            if data.get(name) is not None:
                data[name] = P99Difference.from_json(data[name])
        return cls(**data)


@dataclass(frozen=True)
class MatchedLevel:
    offered: float
    runs: list[MatchedEntry]

    def to_json(self) -> dict:
        return {"offered": self.offered, "runs": [r.to_json() for r in self.runs]}

    @classmethod
    def from_json(cls, data: dict) -> "MatchedLevel":
        data = known_keys(cls, data, "a matched level")
        return cls(offered=data["offered"], runs=[MatchedEntry.from_json(r) for r in data["runs"]])


@dataclass(frozen=True)
class LoadComparison:
    baseline: str
    runs: list[CompareRow]
    matched_levels: list[MatchedLevel]
    verdicts: list[str]
    kind: str = KIND
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "baseline": self.baseline,
            "runs": [r.to_json() for r in self.runs],
            "matched_levels": [m.to_json() for m in self.matched_levels],
            "verdicts": list(self.verdicts),
        }

    @classmethod
    def from_json(cls, data: dict) -> "LoadComparison":
        data = known_keys(cls, data, "a load comparison")
        return cls(
            baseline=data["baseline"],
            runs=[CompareRow.from_json(r) for r in data["runs"]],
            matched_levels=[MatchedLevel.from_json(m) for m in data["matched_levels"]],
            verdicts=list(data["verdicts"]),
            kind=data.get("kind", KIND),
            schema_version=data.get("schema_version", SCHEMA_VERSION),
        )
