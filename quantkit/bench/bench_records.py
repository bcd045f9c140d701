"""What `quantkit bench` hands on: typed, frozen records with one JSON form each and a schema version.

A bench result (BenchResult) holds a row per measurement (BenchRow: one model on one engine, at
one flash-attention setting and, with --depth, one KV depth), the models that could not be
benchmarked (FailedRow), the probed device (DeviceBlock), the rule-check fit (core/fits.py
RuleFit), the options as they ran (recipe/bench_options.py BenchOptions, its device by name) and
the load average. A row's timings, self-check and anchor are typed parts of their own
(row_parts.py).

`from_json` refuses unknown and missing keys with one line (core/record_checks.py), so a typo in a
script's result file is an error where it is read. Files of schema 2 (before depths and flash
attention were measured), 3 (before each row named its KV cache's type), 4 (before TPOT was
attributed) and 5 (before each row named its CPU variant) still read: `BenchResult.from_json`
migrates them.

A BenchRow field that shows in a table carries its columns (bench_columns.py) as its metadata:
`quantkit bench`'s table and CSV, the run report's table and the plots' axes read them from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from quantkit.bench import bench_columns as bc
from quantkit.bench.bench_columns import BENCH, REPORT, Column, shown_as
from quantkit.bench.row_parts import (
    Anchor,
    Distribution,
    EngineInfo,
    NoAnchor,
    SelfCheck,
    TimingStats,
    anchor_from_json,
)
from quantkit.core.attribution import Attribution
from quantkit.core.fits import PrefillFit, RuleFit, fit_rule
from quantkit.core.option_fields import bound_error, defaults
from quantkit.core.record_checks import (
    COUNT,
    COUNT_OR_NONE,
    FLAG_OR_NONE,
    LIST,
    NONNEG,
    NONNEG_OR_NONE,
    OBJECT,
    POSITIVE,
    POSITIVE_OR_NONE,
    TEXT,
    TEXT_OR_NONE,
    RecordError,
    Whole,
    check_values,
    checked,
)
from quantkit.recipe.bench_options import BenchOptions

SCHEMA_VERSION = 6
READS = (2, 3, 4, 5, 6)  # the schema versions from_json reads


@dataclass(frozen=True)
class SweepPoint:
    """TTFT at one prompt length of --sweep (the median of its samples) and the roofline's floor."""

    prompt_len: int
    ttft_ms: Distribution
    predicted_ttft_ms: float

    def to_json(self) -> dict:
        return {**self.__dict__, "ttft_ms": self.ttft_ms.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> "SweepPoint":
        what = "bench row's prompt_sweep point"
        d = checked(cls, data, what)
        return cls(**{**d, "ttft_ms": Distribution.from_json(d["ttft_ms"], f"{what}.ttft_ms")})


# A row's values as read back (core/record_checks.py): times above 0, byte counts and efficiencies not
# negative, lengths and depths whole numbers, so a damaged or edited result is one line where it is
# read (a run then benches again), never a negative TPOT in a report.
ROW_VALUES = {
    **dict.fromkeys(("model", "name", "kind", "kernel", "engine", "device"), TEXT),
    "cpu_variant": TEXT_OR_NONE,
    **dict.fromkeys(("prompt_sweep", "notes", "flags"), LIST),
    "prompt_len": COUNT,  # 0 in a row at depth 0: nothing prefilled
    "gen_len": Whole(1),
    "depth": COUNT_OR_NONE,
    "threads": COUNT_OR_NONE,
    "flash_attn": FLAG_OR_NONE,
    "warmups": COUNT,
    "warmups_requested": COUNT,
    "kv_cache_tokens": COUNT,
    **dict.fromkeys(("load_s", "compile_and_warmup_s", "bench_wall_s", "tpot_efficiency"), NONNEG),
    **dict.fromkeys(("weight_bytes_per_token", "kv_bytes_per_token", "bytes_per_token"), NONNEG),
    **dict.fromkeys(("kv_bytes_per_step", "ideal_bytes_per_token", "predicted_tpot_ms"), NONNEG),
    **dict.fromkeys(("predicted_ttft_ms", "ttft_efficiency"), NONNEG_OR_NONE),
    "tpot_ms": POSITIVE,
    "ttft_ms": POSITIVE_OR_NONE,
}


@dataclass(frozen=True)
class BenchRow:
    """One measurement: TTFT and TPOT of a model on an engine beside the roofline's prediction.

    Without --depth, each repeat prefills `prompt_len` tokens into an empty cache and decodes
    `gen_len` - 1 steps. With --depth, `depth` is the tokens in the KV cache when decode starts:
    the prefill of `depth` tokens runs once (its time is TTFT; none at depth 0) and each repeat
    decodes from it, the cache restored to the depth between repeats."""

    model: str
    name: str = shown_as(Column(BENCH, "variant", place=0))
    kind: str
    kernel: str = shown_as(Column(BENCH, "kernel", place=40))
    emulated: str | None
    engine: str
    device: str
    device_name: str | None
    dtype: str | None
    # the CPU code the row ran (variant_name): ggml's variant (`zen4`), `one CPU build` for a library
    # without run-time dispatch, ATen's kernels (`ATen AVX512`) in the torch engines; None on a GPU
    cpu_variant: str | None = shown_as(Column(BENCH, "runs on", place=50, cell=bc.runs_on))
    threads: int | None
    engine_info: EngineInfo
    prompt_len: int
    gen_len: int
    # tokens cached when decode starts (--depth); None: a fresh prefill per repeat
    depth: int | None = shown_as(Column(BENCH, "depth", place=10, cell=bc.depth, shown=bc.any_depth))
    # the engine's flash-attention setting, where it has the lever (llama.cpp)
    flash_attn: bool | None = shown_as(Column(BENCH, "flash attn", place=20, cell=bc.on_off, shown=bc.levers_vary))
    # the KV cache's element type as the engine held it (bench/engines/engine.py kv_cache_type): llama.cpp's
    # K/V types (`q8_0`, `q8_0/f16`), `fp8_e4m3` in vLLM for a checkpoint with FP8 K/V scales, the torch
    # engines' dtype; None in files written before it was recorded
    kv_cache: str | None = shown_as(Column(BENCH, "KV cache", place=30, shown=bc.varies("kv_cache")))
    load_s: float
    compile_and_warmup_s: float
    warmups: int
    warmups_requested: int
    weight_bytes_per_token: float
    stored_weight_bytes: int | None
    tied_lm_head: bool | None
    weight_bytes_by_type: dict | None  # GGUF tensor type -> bytes (llama.cpp)
    kv_bytes_per_token: float = shown_as(Column(BENCH, "KV", "kB/token", place=70, digits=2, divisor=1e3))
    kv_cache_tokens: int
    bytes_per_token: float = shown_as(Column(BENCH, "MB/token", place=60, digits=2, divisor=1e6))
    kv_bytes_per_step: float
    ideal_bytes_per_token: float
    # None at depth 0: nothing to prefill
    ttft_ms: float | None = shown_as(
        Column(BENCH, "TTFT", "ms", place=80, digits=1), Column(REPORT, "TTFT", "ms", place=10, fmt="{:.1f}")
    )
    tpot_ms: float = shown_as(
        Column(BENCH, "TPOT", "ms", place=90, digits=2), Column(REPORT, "TPOT", "ms", place=20, fmt="{:.2f}")
    )
    predicted_tpot_ms: float = shown_as(
        Column(BENCH, "pred TPOT", "ms", place=110, digits=2), Column(REPORT, "pred TPOT", "ms", place=30, fmt="{:.2f}")
    )
    predicted_ttft_ms: float | None = shown_as(Column(BENCH, "pred TTFT", "ms", place=100, digits=1))
    tpot_efficiency: float = shown_as(
        Column(BENCH, "TPOT eff", place=120, cell=bc.tpot_eff),
        Column(REPORT, "efficiency", place=40, fmt="{:.0f}%", key="tpot_efficiency_pct", cell=bc.tpot_pct),
    )
    ttft_efficiency: float | None = shown_as(Column(BENCH, "TTFT eff", place=130, cell=bc.ttft_eff))
    ttft_bound: str | None
    self_check: SelfCheck = shown_as(Column(BENCH, "self-check KL", place=170, cell=bc.self_check_kl))
    stats: TimingStats
    prompt_sweep: tuple[SweepPoint, ...]
    notes: tuple[str, ...]
    anchor: Anchor | NoAnchor | None  # the engine's own benchmark beside the row (None: it has none)
    bench_wall_s: float
    flags: tuple[str, ...] = ()
    fits_in_cache: bool = False
    accounting_error: bool = False
    # TPOT split into its causes (core/attribution.py); None where a term could not be measured on
    # this engine, `attribution_missing` saying why (and which terms a present one lacks)
    attribution: Attribution | None = shown_as(
        Column(BENCH, "TPOT goes to", place=140, cell=bc.split),
        Column(BENCH, "bound", place=150, cell=bc.bound),
        Column(BENCH, "attributed ms", place=160, cell=bc.attributed),
        Column(REPORT, "TPOT goes to", place=50, key="time_split", cell=bc.split_summed),
        Column(REPORT, "bound", place=60, key="bound", cell=bc.bound),
        default=None,
    )
    attribution_missing: tuple[str, ...] = ()
    disturbed: tuple[str, ...] = ()  # why another process seems to have taken the cores (rows.disturbance)
    prefill_fit: PrefillFit | None = None  # TTFT over the --sweep's prompt lengths: a + b*P + c*P^2

    def to_json(self) -> dict:
        return {
            **self.__dict__,
            "engine_info": self.engine_info.to_json(),
            "self_check": self.self_check.to_json(),
            "stats": self.stats.to_json(),
            "anchor": self.anchor.to_json() if self.anchor else None,
            "prompt_sweep": [p.to_json() for p in self.prompt_sweep],
            "notes": list(self.notes),
            "flags": list(self.flags),
            "attribution": self.attribution.to_json() if self.attribution else None,
            "attribution_missing": list(self.attribution_missing),
            "disturbed": list(self.disturbed),
            "prefill_fit": self.prefill_fit.to_json() if self.prefill_fit else None,
        }

    @classmethod
    def from_json(cls, data: dict) -> "BenchRow":
        what = f"bench row {data.get('name', '?')!r}" if isinstance(data, dict) else "bench row"
        d = check_values(checked(cls, data, what), ROW_VALUES, what)
        return cls(
            **{
                **d,
                "engine_info": EngineInfo.from_json(d["engine_info"], f"{what}.engine_info"),
                "self_check": SelfCheck.from_json(d["self_check"], f"{what}.self_check"),
                "stats": TimingStats.from_json(d["stats"], f"{what}.stats"),
                "anchor": anchor_from_json(d["anchor"], f"{what}.anchor"),
                "prompt_sweep": tuple(SweepPoint.from_json(p) for p in d["prompt_sweep"]),
                "notes": tuple(d["notes"]),
                "flags": tuple(d["flags"]),
                "attribution": Attribution.from_json(d["attribution"]) if d["attribution"] else None,
                "attribution_missing": tuple(d["attribution_missing"]),
                "disturbed": tuple(d["disturbed"]),
                "prefill_fit": PrefillFit.from_json(d["prefill_fit"]) if d["prefill_fit"] else None,
            }
        )


def bench_table(rows) -> list[dict]:
    """quantkit bench's table (and --csv) of `rows`: header -> cell, from BenchRow's columns."""
    return bc.table_rows(list(rows), BenchRow)


def report_columns() -> list[Column]:
    """The bench columns of the run report's table, from BenchRow's fields."""
    return bc.columns(BenchRow, REPORT)


def report_cells(row: BenchRow) -> dict:
    """The values of the run report's bench columns for `row`, by their report keys."""
    return bc.report_cells(row, BenchRow)


def axis(name: str) -> str:
    """A plot's axis for the BenchRow field `name` (its first column's header and unit)."""
    return next(c.axis for c in bc.columns(BenchRow, BENCH) if c.name == name)


@dataclass(frozen=True)
class FailedRow:
    """A model that was not benchmarked, and why (with the self-check's result where that failed)."""

    model: str
    name: str
    error: str
    self_check: SelfCheck | None = None

    def to_json(self) -> dict:
        return {**self.__dict__, "self_check": self.self_check.to_json() if self.self_check else None}

    @classmethod
    def from_json(cls, data: dict) -> "FailedRow":
        what = "bench failed entry"
        d = checked(cls, data, what)
        check = d["self_check"]
        return cls(**{**d, "self_check": None if check is None else SelfCheck.from_json(check, f"{what}.self_check")})


@dataclass(frozen=True)
class DeviceBlock:
    """The device the run timed on, as the probe before the timings measured it (and the one after)."""

    device: str
    type: str
    name: str
    device_name: str | None
    dtype: str | None
    threads: int | None
    bandwidth_gbps: float
    compute_tflops: float
    source: str
    llc_bytes: int | None
    probe: dict
    probe_after: dict | None
    drift: dict | None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> "DeviceBlock":
        return cls(**checked(cls, data, "bench device block"))


@dataclass(frozen=True)
class LoadAverage:
    """The machine's one-minute load average before and after the run, and its CPUs."""

    before: float
    after: float
    cpus: int | None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> "LoadAverage":
        return cls(**checked(cls, data, "bench load_average"))


@dataclass(frozen=True)
class BenchResult:
    """One `quantkit bench` run: every row between two probes of the device, and the fit across them."""

    settings: BenchOptions  # what ran, its device as it was asked (readable on any machine): ran_options()
    device: DeviceBlock
    rows: tuple[BenchRow, ...]
    failed: tuple[FailedRow, ...]
    fit: RuleFit
    load_average: LoadAverage
    plot: str | None = None  # the rule-check PNG (--plot)
    ttft_plot: str | None = None  # TTFT against prompt length (--plot with --sweep)
    depth_plot: str | None = None  # TPOT against KV depth (--plot with --depth)
    kind: str = field(default="bench", init=False)
    schema_version: int = field(default=SCHEMA_VERSION, init=False)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "settings": options_json(self.settings),
            "device": self.device.to_json(),
            "rows": [r.to_json() for r in self.rows],
            "failed": [f.to_json() for f in self.failed],
            "fit": self.fit.to_json(),
            "load_average": self.load_average.to_json(),
            "plot": self.plot,
            "ttft_plot": self.ttft_plot,
            "depth_plot": self.depth_plot,
        }

    @classmethod
    def from_json(cls, data: dict) -> "BenchResult":
        if not isinstance(data, dict) or data.get("kind") != "bench":
            raise RecordError("not a bench result (its JSON has no kind: bench)")
        version = data.get("schema_version")
        if version not in READS:
            raise RecordError(f"bench result of schema {version!r}: this quantkit reads {', '.join(map(str, READS))}")
        check_values(data, {"rows": LIST, "failed": LIST, "settings": OBJECT}, "bench result")
        if version == 2:
            data = migrate_v2(data)
        if data.get("schema_version") == 3:
            data = migrate_v3(data)
        if data.get("schema_version") == 4:
            data = migrate_v4(data)
        if data.get("schema_version") == 5:
            data = migrate_v5(data)
        d = checked(cls, data, "bench result")
        return cls(
            settings=options_from_json(d["settings"]),
            device=DeviceBlock.from_json(d["device"]),
            rows=tuple(BenchRow.from_json(r) for r in d["rows"]),
            failed=tuple(FailedRow.from_json(f) for f in d["failed"]),
            fit=RuleFit.from_json(d["fit"]),
            load_average=LoadAverage.from_json(d["load_average"]),
            plot=d["plot"],
            ttft_plot=d["ttft_plot"],
            depth_plot=d["depth_plot"],
        )


def ran_options(settings: BenchOptions) -> BenchOptions:
    """The options a bench ran with, as a result keeps them: a built BenchSettings' device as its
    name, so the result reads back on a machine without that device."""
    given = {f.name: getattr(settings, f.name) for f in fields(BenchOptions)}
    return BenchOptions(**{**given, "device": str(settings.device)})


def options_json(o: BenchOptions) -> dict:
    """The options as a result's JSON holds them (BenchSettings' too): the device by name, lists for tuples."""
    given = {f.name: getattr(o, f.name) for f in fields(BenchOptions)}
    return {**{k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}, "device": str(o.device)}


# bench options that files written before them lack: read as their defaults, which is what ran
ADDED_OPTIONS = ("depths", "flash_attn", "kv_caches", "dtype")


def options_from_json(data) -> BenchOptions:
    what = "bench result's settings"
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in defaults(BenchOptions).items() if k in ADDED_OPTIONS}
    d = checked(BenchOptions, {**given, **data} if isinstance(data, dict) else data, what)
    check_values(d, {"device": TEXT, "engine": TEXT, "prompt_sweep": LIST, "depths": LIST, "kv_caches": LIST}, what)
    o = BenchOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
    error = bound_error(o, lambda f: f"{what}.{f.name}")
    if error:
        raise RecordError(error)
    return o


def migrate_v2(data: dict) -> dict:
    """A schema-2 result as schema 3 holds it. Schema 3 added: each row's `depth` (None: a fresh
    prefill per repeat, all schema 2 measured) and `flash_attn` (llama.cpp's, from its engine_info;
    off in every schema-2 run), `weight_bytes_by_type` on every row (only llama.cpp's had it),
    `self_check` on every failed entry, the fit's `measured_over_line`, the plot keys always."""

    def row(r: dict) -> dict:
        info = r.get("engine_info") or {}
        return {
            "depth": None,
            "flash_attn": info.get("flash_attn"),
            "weight_bytes_by_type": None,
            **r,
        }

    fit = data.get("fit") or {}
    return {
        **data,
        "schema_version": 3,
        "rows": [row(r) for r in data.get("rows", [])],
        "failed": [{"self_check": None, **f} for f in data.get("failed", [])],
        "fit": {"slope_s_per_byte": None, "measured_over_line": [], **fit},
        "plot": data.get("plot"),
        "ttft_plot": data.get("ttft_plot"),
        "depth_plot": None,
    }


def migrate_v3(data: dict) -> dict:
    """A schema-3 result as schema 4 holds it. Schema 4 added each row's `kv_cache`: llama.cpp's
    from its engine_info (`kv_cache_type`, f16 in every schema-3 run), None for the other engines
    (their cache type was not recorded)."""

    def row(r: dict) -> dict:
        kind = (r.get("engine_info") or {}).get("kv_cache_type")  # gguf-py's name then: "F16"
        return {"kv_cache": kind.lower() if isinstance(kind, str) else None, **r}

    return {**data, "schema_version": 4, "rows": [row(r) for r in data.get("rows", [])]}


# the rule check's fields up to schema 4: a line TPOT = overhead + bytes / bandwidth
V4_FIT = ("effective_gbps", "overhead_ms", "r2", "points", "slope_s_per_byte", "measured_over_line")


def migrate_v4(data: dict) -> dict:
    """A schema-4 result as schema 5 holds it. Schema 5 added each row's `attribution` (None: it
    was not measured then), `attribution_missing`, `disturbed` (nothing was checked then: empty)
    and `prefill_fit` (None), and replaced the rule check's one-term line, whose intercept could
    be negative, by the non-negative fit (core/fits.py): refitted here from the rows' bytes, the
    only terms a schema-4 row holds (no fit where a row lacks them: the row's own check says why)."""
    fit = data.get("fit")
    if isinstance(fit, dict):
        unknown = [k for k in fit if k not in V4_FIT]
        if unknown:
            raise RecordError(f"rule-check fit: unknown key {unknown[0]!r} (known: {', '.join(V4_FIT)})")
    missing = ["measured by a quantkit that did not attribute TPOT"]
    rows = [
        {"attribution": None, "attribution_missing": missing, "disturbed": [], "prefill_fit": None, **r}
        if isinstance(r, dict)
        else r
        for r in data.get("rows") or []
    ]
    keys = ("weight_bytes_per_token", "kv_bytes_per_step", "tpot_ms")
    whole = all(isinstance(r, dict) and all(_number(r.get(k)) for k in keys) for r in rows)
    points = (
        [{"weight_bytes": r["weight_bytes_per_token"], "kv_bytes": r["kv_bytes_per_step"]} for r in rows]
        if whole
        else []
    )
    tpots = [r["tpot_ms"] / 1e3 for r in rows] if whole else []
    return {**data, "schema_version": 5, "rows": rows, "fit": fit_rule(points, tpots).to_json()}


def variant_name(described) -> str | None:
    """The CPU variant's name from an engine's description of it (llama.cpp's `zen4 (fallback);
    sapphirerapids died of SIGILL` -> `zen4`, `one CPU build (no run-time dispatch)` -> `one CPU build`)."""
    if not isinstance(described, str) or not described.strip():
        return None
    return described.split(";")[0].split(" (")[0].strip()


def migrate_v5(data: dict) -> dict:
    """A schema-5 result as schema 6 holds it. Schema 6 added each row's `cpu_variant`: from its
    engine_info where llama.cpp recorded the variant it chose, None for the others (not recorded)."""

    def row(r):
        if not isinstance(r, dict):
            return r
        info = r.get("engine_info")
        return {"cpu_variant": variant_name(info.get("cpu_variant") if isinstance(info, dict) else None), **r}

    return {**data, "schema_version": SCHEMA_VERSION, "rows": [row(r) for r in data.get("rows") or []]}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
