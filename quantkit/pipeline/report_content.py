"""report.json as one record: the run as a whole, its rows, accuracy, depths, engines and variants,
each part a record of its own module. pipeline/report_data.py builds it, the runner writes its
JSON and report.md renders from it (pipeline/report.py); `quantkit compare` reads the files of every
schema through pipeline/run_report.py's checks instead.

Schema versions (SCHEMA_VERSION is the one written): 2: accuracy rows name their kl_kind; positions
(by position in the window). 3: depths and long_context. 4: a variant's exports by format (exports,
export_errors: FMT -> record, message; was gguf_error). 5: a variant is a VariantRecord's JSON
(pipeline/variant_record.py): every key written, null or empty where nothing; its GGUF held once
(gguf_variant or exports.gguf: no `gguf` key). from_json reads the version written; older files
are compare's (run_report.read_report).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantkit.bench.bench_records import DeviceBlock, LoadAverage, options_from_json, options_json
from quantkit.core.fits import RuleFit
from quantkit.core.record_checks import TEXT_OR_NONE, RecordError, check_values, checked
from quantkit.pipeline.accuracy import AccuracyRow, PositionRow
from quantkit.pipeline.depths import ContextRow, DepthRow
from quantkit.pipeline.run_report import KIND, Fastest, ReportRow
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.recipe.bench_options import BenchOptions
from quantkit.recipe.schema import BenchConfig

SCHEMA_VERSION = 5


@dataclass(frozen=True)
class EngineSection:
    """An engine's part of a run (report.json `engines.ENGINE`): its device probe and rule-check fit,
    the bench options it ran and the machine's load (its bench result's parts), all None with the
    error where it did not run."""

    device: DeviceBlock | None
    fit: RuleFit | None
    settings: BenchOptions | None
    load_average: LoadAverage | None
    error: str | None

    def to_json(self) -> dict:
        return {
            "device": self.device.to_json() if self.device else None,
            "fit": self.fit.to_json() if self.fit else None,
            "settings": options_json(self.settings) if self.settings else None,
            "load_average": self.load_average.to_json() if self.load_average else None,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data, what: str = "engines[]") -> EngineSection:
        d = check_values(checked(cls, data, what), {"error": TEXT_OR_NONE}, what)
        return cls(
            device=DeviceBlock.from_json(d["device"]) if d["device"] else None,
            fit=RuleFit.from_json(d["fit"]) if d["fit"] else None,
            settings=options_from_json(d["settings"]) if d["settings"] else None,
            load_average=LoadAverage.from_json(d["load_average"]) if d["load_average"] else None,
            error=d["error"],
        )


@dataclass(frozen=True)
class ReportContent:
    """A run's report.json: its recipe, model, date and host, the texts it scored, the bench section
    it ran (None: bench skipped), the device and rule-check fit of its first engine, each engine's
    section, the fastest engine per variant, the table's rows (a dict per variant and engine: the
    table's columns by key; `typed_rows` reads them), the variants whole, plots and timings."""

    recipe: str
    model: str
    model_sha256: str
    date: str
    host: str
    eval_text: str | None
    eval_texts: tuple[str, ...]
    calibration: str | None
    accuracy: tuple[AccuracyRow, ...]
    positions: tuple[PositionRow, ...]
    depths: tuple[DepthRow, ...]
    long_context: tuple[ContextRow, ...]
    bench_settings: BenchConfig | None
    device: DeviceBlock | None
    fit: RuleFit | None
    engines: dict[str, EngineSection]
    fastest: dict[str, Fastest]
    rows: tuple[dict, ...]
    variants: dict[str, VariantRecord]
    plots: tuple[str, ...]
    timings: dict[str, float]
    wall_seconds: float
    steps_seconds: float
    overhead_pct: float
    failed: tuple[str, ...]
    schema_version: int = SCHEMA_VERSION
    kind: str = field(default=KIND, init=False)

    def typed_rows(self) -> tuple[ReportRow, ...]:
        """The rows as the report's text reads them: name, engine, figures, error, kernel, lever."""
        return tuple(ReportRow.from_json(r, self.schema_version) for r in self.rows)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "recipe": self.recipe,
            "model": self.model,
            "model_sha256": self.model_sha256,
            "date": self.date,
            "host": self.host,
            "eval_text": self.eval_text,
            "eval_texts": list(self.eval_texts),
            "calibration": self.calibration,
            "accuracy": [a.to_json() for a in self.accuracy],
            "positions": [p.to_json() for p in self.positions],
            "depths": [d.to_json() for d in self.depths],
            "long_context": [c.to_json() for c in self.long_context],
            "bench_settings": self.bench_settings.model_dump(mode="json") if self.bench_settings else None,
            "device": self.device.to_json() if self.device else None,
            "fit": self.fit.to_json() if self.fit else None,
            "engines": {e: s.to_json() for e, s in self.engines.items()},
            "fastest": {n: f.to_json() for n, f in self.fastest.items()},
            "rows": [dict(r) for r in self.rows],
            "variants": {n: v.to_json() for n, v in self.variants.items()},
            "plots": list(self.plots),
            "timings": dict(self.timings),
            "wall_seconds": self.wall_seconds,
            "steps_seconds": self.steps_seconds,
            "overhead_pct": self.overhead_pct,
            "failed": list(self.failed),
        }

    @classmethod
    def from_json(cls, data: dict, where: str = "report.json") -> ReportContent:
        """The record of a report.json this quantkit writes (its schema version); RecordError names
        `where` and what is wrong."""
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise RecordError(f"{where}: not a quantkit run report")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise RecordError(f"{where}: schema_version {version!r}: this record reads {SCHEMA_VERSION}")
        try:
            bench = data["bench_settings"]
            return cls(
                recipe=data["recipe"],
                model=data["model"],
                model_sha256=data["model_sha256"],
                date=data["date"],
                host=data["host"],
                eval_text=data["eval_text"],
                eval_texts=tuple(data["eval_texts"]),
                calibration=data["calibration"],
                accuracy=tuple(AccuracyRow.from_json(a) for a in data["accuracy"]),
                positions=tuple(PositionRow.from_json(p) for p in data["positions"]),
                depths=tuple(DepthRow.from_json(d) for d in data["depths"]),
                long_context=tuple(ContextRow.from_json(c) for c in data["long_context"]),
                bench_settings=BenchConfig.model_validate(bench) if bench is not None else None,
                device=DeviceBlock.from_json(data["device"]) if data["device"] else None,
                fit=RuleFit.from_json(data["fit"]) if data["fit"] else None,
                engines={e: EngineSection.from_json(s, f"engines.{e}") for e, s in data["engines"].items()},
                fastest={n: Fastest.from_json(f, f"fastest.{n}") for n, f in data["fastest"].items()},
                rows=tuple(dict(r) for r in data["rows"]),
                variants={n: VariantRecord.from_json(v, f"variants.{n}") for n, v in data["variants"].items()},
                plots=tuple(data["plots"]),
                timings=dict(data["timings"]),
                wall_seconds=data["wall_seconds"],
                steps_seconds=data["steps_seconds"],
                overhead_pct=data["overhead_pct"],
                failed=tuple(data["failed"]),
                schema_version=version,
            )
        except KeyError as exc:
            raise RecordError(f"{where}: missing key {exc.args[0]!r} in a run report") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"{where}: {exc}") from None
