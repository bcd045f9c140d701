"""A run's report.json read back (`quantkit compare`): checked where it is read, one line naming the
file and the key (exit 2), never a KeyError or a TypeError further on.

What is checked: the kind and the schema version (a whole number this quantkit reads, never `"4"`
or `true`), no key that no schema wrote, and the values `compare` shows: the recipe, date and host
as text; the rows as a list of objects, each with its name, and its figures finite numbers (or null
where not measured), its KL's kind and status text; the device and the fit as objects. What
compare reads of it is a RunReport: its rows as ReportRows, their figures as attributes (a row of
schema 1, written before eval named its KL, holds the top-256 bound: its kind is filled in here).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from quantkit.core.record_checks import (
    LIST,
    NONNEG_OR_NONE,
    OBJECT_OR_NONE,
    TEXT,
    TEXT_OR_NONE,
    Num,
    RecordError,
    check_values,
    checked,
)

KIND = "quantkit-run"
READS = (1, 2, 3, 4, 5)  # report.py's schema versions; a file without one is schema 1
# every top-level key a report of any schema holds (pipeline/report.py build_report)
KEYS = frozenset(
    (
        "kind schema_version recipe model model_sha256 date host eval_text eval_texts calibration accuracy "
        "positions depths long_context bench_settings device fit engines fastest rows variants plots timings "
        "wall_seconds steps_seconds overhead_pct failed"
    ).split()
)
REQUIRED = ("recipe", "date", "host", "rows")
NUMBER_OR_NONE = Num(none=True)
ROW_VALUES = {
    "tpot_ms": NONNEG_OR_NONE,
    "ttft_ms": NONNEG_OR_NONE,
    "predicted_tpot_ms": NONNEG_OR_NONE,
    "tpot_efficiency_pct": NONNEG_OR_NONE,
    "delta_ppl_pct": NUMBER_OR_NONE,
    "kld_mean": NONNEG_OR_NONE,
    "bits_per_weight": NONNEG_OR_NONE,
    "kl_kind": TEXT_OR_NONE,
    "status": TEXT_OR_NONE,
    "engine": TEXT_OR_NONE,
}
FIT_VALUES = {"effective_gbps": NUMBER_OR_NONE, "overhead_ms": NUMBER_OR_NONE, "r2": NUMBER_OR_NONE}


# A report row's figures that compare sets side by side, in its JSON's order.
FIGURES = (
    "tpot_ms",
    "ttft_ms",
    "predicted_tpot_ms",
    "tpot_efficiency_pct",
    "delta_ppl_pct",
    "kld_mean",
    "kl_kind",
    "top1_pct",
    "bits_per_weight",
    "status",
)


@dataclass(frozen=True)
class ReportRow:
    """A report row's name and engine, the figures compare sets side by side (None: not measured),
    and what the report's text says of the row beside its table (its error, kernel, lever,
    disturbances, accounting error)."""

    name: str
    engine: str | None = None
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    predicted_tpot_ms: float | None = None
    tpot_efficiency_pct: float | None = None
    delta_ppl_pct: float | None = None
    kld_mean: float | None = None
    kl_kind: str | None = None
    top1_pct: float | None = None
    bits_per_weight: float | None = None
    status: str | None = None
    error: str | None = None
    kernel: str | None = None
    lever: str | None = None
    disturbed: list[str] | None = None
    accounting_error: bool | None = None

    def figures(self) -> dict:
        """The compared figures by name (compare's JSON)."""
        return {name: getattr(self, name) for name in FIGURES}

    @classmethod
    def from_json(cls, row: dict, version: int = READS[-1]) -> ReportRow:
        """A row of a report of schema `version` (by default the schema this quantkit writes)."""
        kept = {f.name: row.get(f.name) for f in fields(cls)}
        if kept["kl_kind"] is None and kept["kld_mean"] is not None and version < 2:
            kept["kl_kind"] = "topk-256 lower bound"
        return cls(**kept)


@dataclass(frozen=True)
class Fastest:
    """A variant's fastest engine by TPOT and by TTFT among those that benched it (report.json
    `fastest.VARIANT`), the slowest engine's TPOT over the fastest's, and each engine's figures."""

    tpot: str
    ttft: str
    tpot_speedup: float
    tpot_ms: dict  # engine -> ms
    ttft_ms: dict

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data, what: str = "fastest") -> Fastest:
        return cls(**checked(cls, data, what))


@dataclass(frozen=True)
class RunReport:
    """A run's report.json as compare reads it: where and when it ran, and its rows."""

    schema_version: int
    recipe: str
    date: str
    host: str
    device_name: str | None
    fit: dict | None  # the rule check's fit as report.json holds it (core/fits.py RuleFit)
    rows: tuple[ReportRow, ...]


def is_run_report(data: object) -> bool:
    """Whether parsed JSON says it is a run report (its kind), before its checks."""
    return isinstance(data, dict) and data.get("kind") == KIND


def read_report(data, where: str) -> RunReport:
    """`data` (a parsed report.json) after its checks; RecordError names `where` and the key."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected a JSON object, not {type(data).__name__}")
    if data.get("kind") != KIND:
        raise RecordError(f"{where}: kind {data.get('kind')!r}, not {KIND!r}")
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or version not in READS:
        raise RecordError(f"{where}: schema_version {version!r}: this quantkit reads {', '.join(map(str, READS))}")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise RecordError(f"{where}: unknown key {unknown[0]!r} in a run report")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise RecordError(f"{where}: missing key {missing[0]!r} in a run report")
    rules = dict.fromkeys(("recipe", "date", "host"), TEXT) | {"rows": LIST}
    optional = {k: OBJECT_OR_NONE for k in ("device", "fit") if k in data}  # a schema-1 report may have neither
    check_values(data, rules | optional, where)
    if data.get("device"):
        check_values(data["device"], {"name": TEXT_OR_NONE} if "name" in data["device"] else {}, f"{where}: device")
    fit = data.get("fit") or {}
    check_values(fit, {k: r for k, r in FIT_VALUES.items() if k in fit}, f"{where}: fit")
    if fit.get("effective_gbps") and any(fit.get(k) is None for k in ("overhead_ms", "r2")):
        raise RecordError(f"{where}: fit: an effective bandwidth without its overhead_ms and r2")
    for i, row in enumerate(data["rows"]):
        what = f"{where}: rows[{i}]"
        if not isinstance(row, dict):
            raise RecordError(f"{what}: expected a JSON object, not {type(row).__name__}")
        if "name" not in row:
            raise RecordError(f"{what}: missing key 'name'")
        check_values(row, {"name": TEXT} | {k: r for k, r in ROW_VALUES.items() if k in row}, what)
    return RunReport(
        schema_version=version,
        recipe=data["recipe"],
        date=data["date"],
        host=data["host"],
        device_name=(data.get("device") or {}).get("name"),
        fit=data.get("fit"),
        rows=tuple(ReportRow.from_json(row, version) for row in data["rows"]),
    )
