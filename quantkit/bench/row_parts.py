"""The typed parts a bench row holds: what the engine said about itself (EngineInfo), a
distribution of times (Distribution), what a row's timings reduce to (TimingStats), the
self-check against the checkpoint (SelfCheck) and the engine's own benchmark beside the row
(Anchor, or NoAnchor where it could not run).

Each has one JSON form, the one bench results have always held (bench_records.py migrates what
older files lack), and a `from_json` that refuses unknown, missing and ill-typed keys with one
line. A part whose JSON leaves out what does not apply (a self-check that was skipped has no KL, a
depth's anchor no prefill) writes only the fields it has: `_present`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from quantkit.core.record_checks import (
    COUNT,
    COUNT_OR_NONE,
    FLAG,
    FLAG_OR_NONE,
    LIST,
    NONNEG,
    NONNEG_OR_NONE,
    POSITIVE,
    POSITIVE_OR_NONE,
    TEXT,
    TEXT_OR_NONE,
    Num,
    RecordError,
    check_values,
    checked,
)

# A KL that could not be computed is infinite (non-finite log-probabilities): the self-check failed.
KL = Num(low=0, none=True, infinite=True)


def _present(record) -> dict:
    """`record`'s fields as JSON, less those that default to None and are None (they do not apply)."""
    return {
        f.name: getattr(record, f.name)
        for f in fields(record)
        if not (f.default is None and getattr(record, f.name) is None)
    }


def _sparse(cls, data, what: str) -> dict:
    """`data` with every required field of `cls` and any of its optional ones; the others None."""
    if not isinstance(data, dict):
        raise RecordError(f"{what}: expected a JSON object, not {type(data).__name__}")
    optional = {f.name for f in fields(cls) if f.default is None}
    return checked(cls, {**dict.fromkeys(optional), **data}, what)


@dataclass(frozen=True)
class EngineInfo:
    """What the engine said about itself (Engine.describe) beyond what the row holds in columns of
    its own: the device it ran on, and the engine's own keys (`own`: llama.cpp's GGUF, context,
    batch and threadpool; vLLM's tensor parallelism; the torch engines' attention and why their
    dtype), which that engine alone writes and this record keeps as it gave them."""

    engine: str
    device: str
    type: str  # the device's type (torch.device.type)
    name: str | None  # the device's name
    dtype: str | None
    own: Mapping[str, Any]

    @classmethod
    def of(cls, described: dict) -> "EngineInfo":
        """An engine's describe() dict (less what the row takes into its own columns) as the record."""
        d = dict(described)
        common = {f: d.pop(f, None) for f in ("engine", "device", "type", "name", "dtype")}
        return cls(**common, own=MappingProxyType(d))

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "device": self.device,
            "type": self.type,
            "name": self.name,
            "dtype": self.dtype,
            **self.own,
        }

    @classmethod
    def from_json(cls, data: dict, what: str = "engine_info") -> "EngineInfo":
        if not isinstance(data, dict):
            raise RecordError(f"{what}: expected a JSON object, not {type(data).__name__}")
        missing = [k for k in ("engine", "device", "type") if k not in data]
        if missing:
            raise RecordError(f"{what}: missing key {missing[0]!r}")
        check_values(
            {"name": None, "dtype": None, **data},
            {**dict.fromkeys(("engine", "device", "type"), TEXT), **dict.fromkeys(("name", "dtype"), TEXT_OR_NONE)},
            what,
        )
        return cls.of(data)


@dataclass(frozen=True)
class Distribution:
    """Times in milliseconds: their median, mean, P90, P99, sample standard deviation, best, count."""

    median: float
    mean: float
    p90: float
    p99: float
    std: float
    min: float
    n: int

    @property
    def spread(self) -> float | None:
        """(P90 - best) / best: how far the slow samples sit from the best (None: one sample or a zero best)."""
        return (self.p90 - self.min) / self.min if self.n > 1 and self.min else None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict, what: str = "distribution") -> "Distribution":
        d = checked(cls, data, what)
        return cls(
            **check_values(
                d, {**dict.fromkeys(("median", "mean", "p90", "p99", "std", "min"), NONNEG), "n": COUNT}, what
            )
        )


def _distribution(data, what: str) -> Distribution | None:
    return None if data is None else Distribution.from_json(data, what)


@dataclass(frozen=True)
class PerStep:
    """Whether a row's per-step times are per-token times; `reason` why not (an engine that
    delivers several tokens from one step)."""

    measured: bool
    reason: str | None = None

    def to_json(self) -> dict:
        return _present(self)

    @classmethod
    def from_json(cls, data: dict, what: str = "per_step") -> "PerStep":
        d = check_values(_sparse(cls, data, what), {"measured": FLAG, "reason": TEXT_OR_NONE}, what)
        return cls(**d)


@dataclass(frozen=True)
class TimingStats:
    """What a row's timings reduce to (harness.Timings.summary): TTFT over the repeats (None at
    depth 0: no prompt), TPOT over the repeats (each repeat's decode time over its tokens), the
    steps' own distribution and times where they are per-token times."""

    ttft_ms: Distribution | None
    tpot_ms: Distribution
    repeats: int
    warmups: int
    step_ms: Distribution | None
    per_step: PerStep
    step_times_ms: tuple[tuple[float, ...], ...] | None  # per repeat, per decode step

    def to_json(self) -> dict:
        return {
            "ttft_ms": self.ttft_ms.to_json() if self.ttft_ms else None,
            "tpot_ms": self.tpot_ms.to_json(),
            "repeats": self.repeats,
            "warmups": self.warmups,
            "step_ms": self.step_ms.to_json() if self.step_ms else None,
            "per_step": self.per_step.to_json(),
            "step_times_ms": None if self.step_times_ms is None else [list(rep) for rep in self.step_times_ms],
        }

    @classmethod
    def from_json(cls, data: dict, what: str = "stats") -> "TimingStats":
        d = check_values(checked(cls, data, what), {"repeats": COUNT, "warmups": COUNT}, what)
        times = d["step_times_ms"]
        if times is not None and not (isinstance(times, list) and all(isinstance(r, list) for r in times)):
            raise RecordError(f"{what}.step_times_ms: expected a list of lists or null")
        return cls(
            ttft_ms=_distribution(d["ttft_ms"], f"{what}.ttft_ms"),
            tpot_ms=Distribution.from_json(d["tpot_ms"], f"{what}.tpot_ms"),
            repeats=d["repeats"],
            warmups=d["warmups"],
            step_ms=_distribution(d["step_ms"], f"{what}.step_ms"),
            per_step=PerStep.from_json(d["per_step"], f"{what}.per_step"),
            step_times_ms=None if times is None else tuple(tuple(rep) for rep in times),
        )


PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class SelfCheck:
    """The engine's next-token log-probabilities against the checkpoint's own load (selfcheck.py):
    `status` passed, failed or skipped (`reason` why, where it did not run or could not compare);
    what the reference was and how the comparison came out where it ran."""

    status: str
    reason: str | None = None
    reference: str | None = None  # what computed the reference ("transformers 4.x load of the checkpoint")
    reference_dtype: str | None = None
    reference_kv_cache: str | None = None  # a checkpoint's FP8 K/V rounding, on or off
    reference_checkpoint: str | None = None  # a GGUF's: the artifact it was exported from
    reference_s: float | None = None
    passed: bool | None = None
    mean_kl: float | None = None
    max_kl: float | None = None
    top1_agreement: float | None = None
    positions: int | None = None
    threshold: float | None = None
    exact: bool | None = None  # False: the engine reports some tokens per position, the KL a lower bound
    check_s: float | None = None

    @classmethod
    def skipped(cls, reason: str) -> "SelfCheck":
        return cls(SKIPPED, reason)

    def to_json(self) -> dict:
        return _present(self)

    @classmethod
    def from_json(cls, data: dict, what: str = "self_check") -> "SelfCheck":
        d = _sparse(cls, data, what)
        check_values(
            d,
            {
                "status": TEXT,
                **dict.fromkeys(
                    ("reason", "reference", "reference_dtype", "reference_kv_cache", "reference_checkpoint"),
                    TEXT_OR_NONE,
                ),
                **dict.fromkeys(("reference_s", "check_s", "threshold", "top1_agreement"), NONNEG_OR_NONE),
                **dict.fromkeys(("mean_kl", "max_kl"), KL),
                **dict.fromkeys(("passed", "exact"), FLAG_OR_NONE),
                "positions": COUNT_OR_NONE,
            },
            what,
        )
        if d["status"] not in (PASSED, FAILED, SKIPPED):
            raise RecordError(f"{what}.status: {d['status']!r} is not passed, failed or skipped")
        return cls(**d)


COMPARISON = ("ratio_ttft", "ratio_tpot", "disagree", "tolerance")  # what llama_bench.compare adds


@dataclass(frozen=True)
class Anchor:
    """llama-bench on the GGUF a row timed, at its threads, lengths, depth, flash attention and
    cache types (llama_bench.py), and quantkit's figures over it. A row at a KV depth has the
    decode run alone: no prefill figures, no TTFT ratio."""

    tpot_ms: float
    tg_tokens_per_s: float
    tg_tokens: int
    tg_depth: int
    flash_attn: bool
    kv_cache: str  # "K/V" types
    repeats: int | None
    build_commit: str | None
    build_number: int | None
    cpu_info: str | None
    backends: str | None
    threads: int | None
    command: str
    ratio_ttft: float | None
    ratio_tpot: float
    disagree: tuple[str, ...]  # the figures beyond `tolerance` ("ttft", "tpot")
    tolerance: float
    ttft_ms: float | None = None
    pp_tokens_per_s: float | None = None
    pp_tokens: int | None = None

    def to_json(self) -> dict:
        return {**_present(self), "disagree": list(self.disagree)}

    def figures(self) -> dict:
        """llama-bench's own figures (what llama_bench.measure returned), without quantkit's ratios to them."""
        return {k: v for k, v in self.to_json().items() if k not in COMPARISON}

    @classmethod
    def from_json(cls, data: dict, what: str = "anchor") -> "Anchor":
        d = _sparse(cls, data, what)
        check_values(
            d,
            {
                **dict.fromkeys(("tpot_ms", "tg_tokens_per_s", "ratio_tpot"), POSITIVE),
                **dict.fromkeys(("ttft_ms", "pp_tokens_per_s", "ratio_ttft"), POSITIVE_OR_NONE),
                "tolerance": NONNEG,
                **dict.fromkeys(("tg_tokens", "tg_depth"), COUNT),
                **dict.fromkeys(("repeats", "build_number", "threads", "pp_tokens"), COUNT_OR_NONE),
                "flash_attn": FLAG,
                **dict.fromkeys(("kv_cache", "command"), TEXT),
                **dict.fromkeys(("build_commit", "cpu_info", "backends"), TEXT_OR_NONE),
                "disagree": LIST,
            },
            what,
        )
        return cls(**{**d, "disagree": tuple(d["disagree"])})


@dataclass(frozen=True)
class NoAnchor:
    """The engine's own benchmark could not run beside the row (not installed, failed): why."""

    error: str

    def to_json(self) -> dict:
        return {"error": self.error}

    @classmethod
    def from_json(cls, data: dict, what: str = "anchor") -> "NoAnchor":
        return cls(**check_values(checked(cls, data, what), {"error": TEXT}, what))


def anchor_from_json(data, what: str = "anchor") -> Anchor | NoAnchor | None:
    """A row's `anchor` key: null (the engine has no benchmark of its own), {"error"} or the figures."""
    if data is None:
        return None
    if isinstance(data, dict) and "error" in data:
        return NoAnchor.from_json(data, what)
    return Anchor.from_json(data, what)
