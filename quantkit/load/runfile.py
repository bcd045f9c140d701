"""A load run's file (`quantkit load --out`, a lever study's NN-LEVER.json) read back: checked and
brought to the current schema, so that compare and the lever table read one shape.

Schema 2 added per step: `ttft_parts`, `classes`, `samples` (each answered request's latencies,
for intervals), `phase`, `repeat`, `cpu`; per run: `levels` (steps pooled per level), `discarded`,
`cpu`, `p99_requests_needed`, and `analysis.slo_knee`. A schema-1 file reads with its steps as its
levels, its parts absent ("recorded before ..."), and no samples (so no intervals); the keys
schema 2 added to a step and to the analysis read as None.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from quantkit.load.config import LoadError, Slo
from quantkit.load.cpu import Placement
from quantkit.load.load_analysis import Analysis
from quantkit.load.step_record import Latency, Step

KIND = "load-run"
SCHEMA_VERSION = 2

_NUMBER = (int, float)
# keys every step of every schema has, with their types (None allowed where measured values may be missing)
_STEP_KEYS = {
    "offered": _NUMBER,
    "requests": int,
    "completed": int,
    "error_count": int,
    "ttft_ms": dict,
    "tpot_ms": dict,
}


def is_load_run(data: object) -> bool:
    """True for the JSON that `quantkit load --out` writes (how `quantkit compare` tells them apart)."""
    return isinstance(data, dict) and data.get("kind") == KIND


_ABSENT_V1 = "recorded before quantkit split TTFT (a schema-1 run file)"


@dataclass(frozen=True)
class RunClient:
    """The client's overhead over the run: parsing per request, the open loop's send lag, its CPU."""

    parse_ms: Latency
    send_lag_ms: Latency | None
    cpu_share_max: float | None
    note: str | None = None

    def to_json(self) -> dict:
        lag = self.send_lag_ms.to_json() if self.send_lag_ms else None
        return {
            "parse_ms": self.parse_ms.to_json(),
            "send_lag_ms": lag,
            "cpu_share_max": self.cpu_share_max,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict) -> "RunClient":
        lag = data.get("send_lag_ms")
        return cls(
            Latency.from_json(data["parse_ms"]),
            Latency.from_json(lag) if lag else None,
            data.get("cpu_share_max"),
            data.get("note"),
        )


@dataclass(frozen=True)
class LeverServer:
    """The server a lever study started for a run: its exact command, settings and how it ended."""

    engine: str
    command: list[str]
    model: str
    settings: dict
    body_fields: dict
    env: dict
    changes: str
    ready_s: float
    pid: int
    exit_code: int | None
    log: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "LeverServer":
        return cls(**data)


@dataclass(frozen=True)
class WorkloadShape:
    """What the readers show of a run's workload (its config's `workload`)."""

    name: str
    spec: str | None
    shared_prefix: int
    turns: int
    prompt_len_spec: str
    prompt_len_low: int | None


@dataclass(frozen=True)
class RunSettings:
    """What the readers need of a run's config: the loop, the SLO, whether it searched, the workload."""

    mode: str
    slo: Slo
    search: bool
    workload: WorkloadShape

    @property
    def has_slo(self) -> bool:
        return not self.slo.empty


@dataclass(frozen=True)
class LoadRun:
    label: str
    config: dict  # LoadConfig.to_dict(), as the run wrote it; `settings` is what readers use of it
    steps: list[Step]
    levels: list[Step]
    analysis: Analysis
    stopped: str | None
    schema_version: int = SCHEMA_VERSION
    created: str | None = None
    stop_detail: str | None = None
    interrupted: bool = False
    prompt_tokens_reported: int | None = None
    server_context: dict | None = None
    discarded: list[Step] = field(default_factory=list)
    cpu: Placement | None = None
    p99_requests_needed: int | None = None
    client_overhead: RunClient | None = None
    tool: dict | None = None
    requests: list | None = None  # --keep-requests
    server: LeverServer | None = None  # a lever study's: the server it started
    file: str | None = None  # a lever study's: the run's file name
    kind: str = KIND

    @property
    def settings(self) -> RunSettings:
        config = self.config
        slo, workload = config.get("slo") or {}, config.get("workload") or {}
        return RunSettings(
            mode=config["mode"],
            slo=Slo(ttft_ms=slo.get("ttft_ms"), tpot_ms=slo.get("tpot_ms"), cls=slo.get("cls")),
            search=bool(config.get("search")),
            workload=WorkloadShape(
                name=workload.get("name", "synthetic"),
                spec=workload.get("spec"),
                shared_prefix=workload.get("shared_prefix") or 0,
                turns=workload.get("turns", 1),
                prompt_len_spec=workload.get("prompt_len_spec", ""),
                prompt_len_low=(workload.get("prompt_len") or {}).get("low"),
            ),
        )

    @property
    def full_levels(self) -> list[Step]:
        """Its levels (a schema-1 run: its steps) that were not cut short."""
        return [s for s in (self.levels or self.steps) if not s.partial]

    def to_json(self) -> dict:
        def plain(value):
            return value.to_json() if value is not None else None

        data = {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "label": self.label,
            "created": self.created,
            "config": self.config,
            "prompt_tokens_reported": self.prompt_tokens_reported,
            "server_context": self.server_context,
            "stopped": self.stopped,
            "stop_detail": self.stop_detail,
            "interrupted": self.interrupted,
            "steps": [s.to_json() for s in self.steps],
            "levels": [s.to_json() for s in self.levels],
            "discarded": [s.to_json() for s in self.discarded],
            "analysis": self.analysis.to_json(),
            "cpu": plain(self.cpu),
            "p99_requests_needed": self.p99_requests_needed,
            "client_overhead": plain(self.client_overhead),
            "tool": self.tool,
            "requests": self.requests,
            "server": plain(self.server),
            "file": self.file,
        }
        return {k: v for k, v in data.items() if v is not None or k not in ("requests", "server", "file")}

    @classmethod
    def from_json(cls, data, where: str) -> "LoadRun":
        """A run file's JSON, checked (one LoadError naming what is wrong) and migrated."""
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise LoadError(f'{where} is not a quantkit load run (no "kind": "{KIND}")')
        version = data.get("schema_version")
        if version not in (1, SCHEMA_VERSION):
            raise LoadError(f"{where} ({data.get('label')}): schema_version {version!r}, this quantkit reads 1 and 2")
        for key, kind in (("steps", list), ("analysis", dict), ("config", dict)):  # before a migration fills them
            if key not in data:
                raise LoadError(f"{where}: missing key {key!r} in a load run")
            if not isinstance(data[key], kind):
                raise LoadError(f"{where}: {key} must be {'a list' if kind is list else 'an object'}")
        data = _migrate(dict(data)) if version == 1 else dict(data)
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LoadError(f"{where}: unknown key {unknown[0]!r} in a load run")
        for key in ("label", "config", "steps", "levels", "analysis"):
            if key not in data:
                raise LoadError(f"{where}: missing key {key!r} in a load run")
        if not isinstance(data["config"], dict) or data["config"].get("mode") not in ("concurrency", "rate"):
            raise LoadError(f"{where}: config.mode must be concurrency or rate")
        for name in ("steps", "levels"):
            if not isinstance(data[name], list):
                raise LoadError(f"{where}: {name} must be a list")
            for i, step in enumerate(data[name]):
                _check_step(step, f"{where}: {name}[{i}]")
        if not isinstance(data["analysis"], dict):
            raise LoadError(f"{where}: analysis must be an object")
        _check_analysis(data["analysis"], f"{where}: analysis")
        try:
            return cls(**_typed(data))
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(f"{where}: not a load run this quantkit reads ({type(exc).__name__}: {exc})") from None


def _typed(data: dict) -> dict:
    """The JSON's values as the records that hold them."""
    out = dict(data)
    for name in ("steps", "levels", "discarded"):
        out[name] = [Step.from_json(s) for s in data.get(name) or []]
    out["analysis"] = Analysis.from_json(data["analysis"])
    for name, record in (("cpu", Placement), ("client_overhead", RunClient), ("server", LeverServer)):
        if data.get(name) is not None:
            out[name] = record.from_json(data[name])
    return out


def _check_analysis(analysis: dict, where: str) -> None:
    """What compare reads of it: the knee, the peak and the SLO's best level (objects, or null where
    none was found), and which latency degraded first."""
    for key in ("knee", "peak", "max_qps_within_slo"):
        if key not in analysis or not isinstance(analysis[key], (dict, type(None))):
            raise LoadError(f"{where}.{key} must be an object or null")
    if not isinstance(analysis.get("degraded_first"), dict) or "first" not in analysis["degraded_first"]:
        raise LoadError(f"{where}.degraded_first must be an object with its 'first'")


def _check_step(step, where: str) -> None:
    if not isinstance(step, dict):
        raise LoadError(f"{where} is not an object")
    for key, kind in _STEP_KEYS.items():
        value = step.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise LoadError(f"{where}.{key} is {value!r:.40}, not a {getattr(kind, '__name__', 'number')}")
    if not math.isfinite(step["offered"]) or step["offered"] <= 0:
        raise LoadError(f"{where}.offered must be a positive number")
    samples = step.get("samples")
    if samples is not None:
        if not isinstance(samples, dict) or not all(isinstance(samples.get(k), list) for k in ("ttft_ms", "tpot_ms")):
            raise LoadError(f"{where}.samples must hold ttft_ms and tpot_ms lists")
        for key in ("ttft_ms", "tpot_ms"):
            bad = [v for v in samples[key] if v is not None and (not isinstance(v, _NUMBER) or not math.isfinite(v))]
            if bad:
                raise LoadError(f"{where}.samples.{key} holds {bad[0]!r:.40}, not a time in ms")


def _migrate(data: dict) -> dict:
    """Schema 1 -> 2: what a schema-1 run did not record is absent, never invented."""
    steps = []
    for step in data.get("steps") or []:
        if isinstance(step, dict):
            step = {
                "ttft_parts": {"absent": _ABSENT_V1},
                "classes": None,
                "samples": None,
                "phase": None,
                "repeat": 0,
                "cpu": None,
                **step,
            }
        steps.append(step)
    analysis = dict(data.get("analysis") or {})
    analysis.setdefault("slo_knee", None)
    return {**data, "schema_version": SCHEMA_VERSION, "steps": steps, "levels": steps, "analysis": analysis}
