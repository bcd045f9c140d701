"""A load run's analysis as typed records: the saturation knee, the peak, the best level within
the SLO (load_stats.py), what degraded first (degrade.py) and the SLO's knee with its intervals
(intervals.py). A schema-1 run recorded fewer of their keys: they read as None."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from quantkit.core.record_checks import known_keys
from quantkit.load.degrade import DegradedFirst
from quantkit.load.intervals import SloKnee


@dataclass(frozen=True)
class Knee:
    """The last step that still scaled before the first saturated one."""

    offered: float
    achieved_qps: float | None
    output_tokens_per_s: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    saturated_step: int | None = None
    index: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Knee":
        return cls(**known_keys(cls, data, "the knee"))


@dataclass(frozen=True)
class Peak:
    """The step of the highest achieved req/s (a cut-short step too, at what it kept up)."""

    offered: float
    achieved_qps: float | None
    output_tokens_per_s: float | None = None
    partial: bool = False
    index: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Peak":
        return cls(**known_keys(cls, data, "the peak"))


@dataclass(frozen=True)
class SloBest:
    """The step of the highest achieved req/s whose P99s met the SLO."""

    offered: float
    achieved_qps: float | None
    partial: bool = False
    index: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "SloBest":
        return cls(**known_keys(cls, data, "max_qps_within_slo"))


@dataclass(frozen=True)
class Analysis:
    knee: Knee | None
    peak: Peak | None
    degraded_first: DegradedFirst
    max_qps_within_slo: SloBest | None
    saturated_steps: list[int] | None = field(default=None)
    slo_knee: SloKnee | None = None

    def to_json(self) -> dict:
        def plain(value):
            return value.to_json() if value is not None else None

        return {
            "knee": plain(self.knee),
            "peak": plain(self.peak),
            "saturated_steps": self.saturated_steps,
            "degraded_first": self.degraded_first.to_json(),
            "max_qps_within_slo": plain(self.max_qps_within_slo),
            "slo_knee": plain(self.slo_knee),
        }

    @classmethod
    def from_json(cls, data: dict) -> "Analysis":
        data = known_keys(cls, data, "the analysis")
        knee, peak, best, slo_knee = (data.get(k) for k in ("knee", "peak", "max_qps_within_slo", "slo_knee"))
        return cls(
            knee=Knee.from_json(knee) if knee else None,
            peak=Peak.from_json(peak) if peak else None,
            degraded_first=DegradedFirst.from_json(data["degraded_first"]),
            max_qps_within_slo=SloBest.from_json(best) if best else None,
            saturated_steps=data.get("saturated_steps"),
            slo_knee=SloKnee.from_json(slo_knee) if slo_knee else None,
        )
