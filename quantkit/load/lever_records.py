"""A lever study's results as typed records: one row per lever (levers_report.py), the prefix
cache's roofline reference, and the study itself (study.json, levers.py). Older study files hold
fewer of a row's keys: they read as None."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from quantkit.core.record_checks import known_keys
from quantkit.load.intervals import KneeShift
from quantkit.load.load_comparison import LoadComparison
from quantkit.load.runfile import LoadRun

KIND = "lever-study"
SCHEMA_VERSION = 1
# the figures a lever's row holds a ratio against the baseline's of (`NAME_ratio`)
RATIOS = ("knee_qps", "peak_qps", "goodput_qps", "knee_tpot_p99_ms", "first_ttft_p50_ms", "first_tpot_p50_ms")


@dataclass(frozen=True)
class LeverRow:
    """One lever's run in a line: its knees, goodput, the lightest and heaviest level's latencies,
    TTFT's queue share, the client's CPU and errors; ratios against the baseline lever."""

    lever: str
    changes: str | None = None
    mode: str | None = None
    knee_offered: float | None = None
    knee_qps: float | None = None
    knee_ttft_p99_ms: float | None = None
    knee_tpot_p99_ms: float | None = None
    goodput_qps: float | None = None
    max_qps_within_slo: float | None = None
    peak_offered: float | None = None
    peak_qps: float | None = None
    degraded_first: str | None = None
    first_ttft_p50_ms: float | None = None
    first_tpot_p50_ms: float | None = None
    first_cache_hit: float | None = None
    first_draft_acceptance: float | None = None  # speculative decoding: the share of drafts kept
    last_offered: float | None = None
    last_tpot_p50_ms: float | None = None
    last_ttft_p99_ms: float | None = None
    last_draft_acceptance: float | None = None
    first_queue_share: float | None = None
    last_queue_share: float | None = None
    first_prefill_ms: float | None = None
    last_prefill_ms: float | None = None
    cause: str | None = None
    slo_knee: float | None = None
    slo_knee_ci95: list | None = None
    slo_knee_censored: str | None = None
    slo_knee_bound: float | None = None
    slo_knee_qps: float | None = None
    slo_knee_qps_ci95: list | None = None
    class_ttft_p99_ms: dict | None = None  # class -> level -> TTFT-P99
    requests_per_level: list | None = None
    rejected: int | None = None
    client_cpu_max: float | None = None
    others_cpu_max: float | None = None
    discarded_steps: int | None = None
    errors: int | None = None
    stopped: str | None = None
    slo_knee_shift: KneeShift | None = None
    ratios: dict = field(default_factory=dict)  # NAME -> this lever's NAME / the baseline's (RATIOS)

    def ratio(self, name: str) -> float | None:
        return self.ratios.get(name)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("slo_knee_shift", "ratios")}
        out["slo_knee_shift"] = self.slo_knee_shift.to_json() if self.slo_knee_shift else None
        out.update({f"{name}_ratio": value for name, value in self.ratios.items()})
        return out

    @classmethod
    def from_json(cls, data: dict) -> "LeverRow":
        data = dict(data)
        ratios = {name: data.pop(f"{name}_ratio") for name in RATIOS if f"{name}_ratio" in data}
        data = known_keys(cls, data, "a lever's row")
        shift = data.pop("slo_knee_shift", None)
        return cls(**data, slo_knee_shift=KneeShift.from_json(shift) if shift else None, ratios=ratios)


@dataclass(frozen=True)
class PrefixRow:
    """A lever's shared prefix: its roofline prefill next to the TTFT-P50 it saved at the lightest step."""

    lever: str
    prefix_tokens: int
    suffix_tokens: int
    roofline_prefix_prefill_ms: float
    roofline_prefill_ms: float
    prefix_share: float
    baseline_ttft_p50_ms: float | None
    ttft_p50_ms: float | None
    saved_ms: float | None
    saved_vs_roofline: float | None
    ttft_ratio: float | None
    roofline_ttft_ratio: float | None = None  # the ratio if TTFT were prefill alone, the prefix skipped
    counted: str | None = None  # the server's cached tokens, or the workload's shared prefix

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "PrefixRow":
        return cls(**known_keys(cls, data, "a prefix reference's row"))


@dataclass(frozen=True)
class PrefixReference:
    shape: str
    device: str
    compute_tflops: float
    device_source: str | None
    levers: list[PrefixRow]
    baseline: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "levers": [r.to_json() for r in self.levers]}

    @classmethod
    def from_json(cls, data: dict) -> "PrefixReference":
        data = known_keys(cls, data, "the prefix reference")
        return cls(**{**data, "levers": [PrefixRow.from_json(r) for r in data["levers"]]})


@dataclass
class LeverStudy:
    """study.json: the study as given, every lever's run, and the table, comparison and reference
    made of them (rewritten after each lever)."""

    name: str
    source: str
    created: str
    study: dict  # the study file, validated (study.Study.model_dump())
    runs: list[LoadRun] = field(default_factory=list)
    stopped: str | None = None
    error: str | None = None
    table: list[LeverRow] | None = None
    comparison: LoadComparison | None = None
    prefix_reference: PrefixReference | None = None
    kind: str = KIND
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        out = {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "name": self.name,
            "source": self.source,
            "created": self.created,
            "study": self.study,
            "runs": [run.to_json() for run in self.runs],
            "stopped": self.stopped,
        }
        # what a study writes only once it has it
        if self.error is not None:
            out["error"] = self.error
        if self.table is not None:
            out["table"] = [row.to_json() for row in self.table]
        for name in ("comparison", "prefix_reference"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name).to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "LeverStudy":
        data = known_keys(cls, data, "a lever study")
        table, comparison, reference = (data.get(k) for k in ("table", "comparison", "prefix_reference"))
        return cls(
            **{
                **data,
                "runs": [LoadRun.from_json(run, f"runs[{i}]") for i, run in enumerate(data.get("runs") or [])],
                "table": [LeverRow.from_json(row) for row in table] if table is not None else None,
                "comparison": LoadComparison.from_json(comparison) if comparison else None,
                "prefix_reference": PrefixReference.from_json(reference) if reference else None,
            }
        )
