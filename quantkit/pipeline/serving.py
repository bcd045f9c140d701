"""`quantkit run`'s serving side: each variant in the recipe's serving formats (`export: {formats:
[gguf, ...]}`, by the exporter registry), a `gguf:` variant by llama-quantize, and one bench
per engine of `bench.engines`, so the report has a row per variant and engine and a rule-check
fit per engine.

Each step takes the few inputs it uses (the run directory it writes its file into, the step cache
as a read-only `Stored`, the recipe's section it reads) and returns what it made with the cache key
to store it under (`Made`); it never sees the runner: the runner alone records results
(pipeline/run.py).

Each engine is benched in its own `bench_many` (its own probes before and after, its own fit),
one engine after the other in this process. The llama.cpp engine benches the run's GGUF when the
recipe exports one, else the artifact itself (exported into QUANTKIT_HOME's GGUF cache).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from quantkit import __version__
from quantkit.bench.bench_records import BenchResult, BenchRow, FailedRow
from quantkit.bench.bench_runner import bench_many
from quantkit.bench.bench_settings import BenchSettings, check_settings
from quantkit.bench.engines import engine_class
from quantkit.core.record_checks import COUNT, OBJECT_OR_NONE, TEXT, check_values
from quantkit.errors import QuantkitError
from quantkit.export.export_registry import EXPORTERS, exporter_for
from quantkit.export.exporter import ExportSettings
from quantkit.gguf.llama_quantize import DEFAULT_CALIB
from quantkit.models.checkpoint import content_hash
from quantkit.pipeline.cache import StepCache, step_key, text_fingerprint
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.progress import note
from quantkit.quantize import kquant_chooser
from quantkit.recipe.schema import BenchConfig, CalibrationConfig, Variant


@dataclass(frozen=True)
class Stored:
    """The step cache as a step sees it: read only, and empty on --rerun (every step done again)."""

    cache: StepCache
    rerun: bool = False

    def read(self, key: str, reader, what: str):
        return None if self.rerun else self.cache.read(key, reader, what)


@dataclass(frozen=True)
class GgufSource:
    """What llama-quantize makes a `gguf:` variant from: the source checkpoint and its hash, and the
    run's calibration (its settings and text) for an importance matrix."""

    src: Path
    src_hash: str
    calibration: CalibrationConfig
    calib: str | None


@dataclass(frozen=True)
class Made:
    """What a step made (a record, a BenchResult) and the step-cache key to store it under; key is
    None when nothing is to be stored (the step reused a stored result, or failed in a way that may not recur)."""

    value: object
    key: str | None = None


@dataclass(frozen=True)
class EngineBench:
    """One engine's part of a run: its bench result, the variants it could not bench, or why it
    could not run here at all (`error`: llama-cpp-python not installed, say; then no result)."""

    engine: str
    result: BenchResult | None = None
    failed: tuple[FailedRow, ...] = ()  # every variant not benchmarked (the result's own and the run's)
    error: str | None = None

    @property
    def rows(self) -> tuple[BenchRow, ...]:
        return self.result.rows if self.result else ()


def export_format(fmt: str, name: str, path: Path, *, out_dir: Path, stored: Stored) -> Made:
    """The variant in serving format `fmt` (a recipe's `export: {formats: [...]}`), by its exporter
    (export/export_registry.py) into RUN_DIR/FMT/ under the exporter's name for it (GGUF: RUN_DIR/gguf/NAME.gguf,
    its export record beside it, which lets the llama.cpp self-check find the artifact); Made's value is
    what the exporter says a run keeps of its record. Reused while the output matches the stored hash."""

    settings = ExportSettings(force=True)
    exporter = exporter_for(fmt, settings)
    out = out_dir / exporter.out_name(name, settings)
    key = step_key("export", __version__, exporter.name, content_hash(path), asdict(settings))
    hit = _reusable(stored, key, out)
    if hit is not None:
        note(f"[{name}] export {fmt}: reusing {out}")
        return Made(hit)
    note(f"[{name}] export {fmt}")
    return Made(exporter.kept(exporter.export(path, out, settings)), key)


def quantize_gguf(v: Variant, source: GgufSource, *, out_dir: Path, stored: Stored) -> Made:
    """A `gguf: {type, imatrix}` variant: RUN_DIR/gguf/NAME.gguf made by llama-quantize from the source
    checkpoint (the gguf-kquant exporter, export/gguf_kquant.py), the importance matrix over the run's
    calibration windows (its source, samples, seq_len, seed and region); Made's value is what the
    exporter says a run keeps of its record. Reused while the file matches the stored hash."""

    c = source.calibration
    calib = source.calib or DEFAULT_CALIB
    settings = ExportSettings(
        qtype=v.gguf.type,
        imatrix=v.gguf.imatrix,
        calib=calib,
        samples=c.samples,
        seq_len=c.seq_len,
        seed=c.seed,
        region=c.region,
        mixed=",".join(v.gguf.mixed_types or kquant_chooser.DEFAULT_TYPES) if v.gguf.mixed else None,
        force=True,
    )
    out = out_dir / f"{v.name}.gguf"
    key = step_key(
        "gguf-quantize",
        __version__,
        source.src_hash,
        v.gguf.model_dump(mode="json"),
        c.model_dump(mode="json") if v.gguf.imatrix else None,
        text_fingerprint(calib) if v.gguf.imatrix else None,
    )
    hit = _reusable(stored, key, out)
    if hit is not None:
        note(f"[{v.name}] llama-quantize {v.gguf.type}: reusing {out}")
        return Made(hit)
    note(f"[{v.name}] llama-quantize {v.gguf.type}{' with an importance matrix' if v.gguf.imatrix else ''}")
    exporter = EXPORTERS["gguf-kquant"]
    return Made(exporter.kept(exporter.export(source.src, out, settings)), key)


def _sources(
    engine: str, paths: dict[str, Path], records: dict[str, VariantRecord]
) -> tuple[dict[str, Path], dict[str, str]]:
    """What `engine` benches for each variant, and the variants it cannot (their GGUF export failed).
    An engine that runs GGUF files gets the run's GGUF, when the recipe exports one."""

    if not engine_class(engine).takes_gguf:  # a `gguf:` variant exists only as a GGUF
        made = {n for n in paths if records[n].gguf_variant}
        return (
            {n: p for n, p in paths.items() if n not in made},
            {n: f"a llama-quantize GGUF runs on GGUF engines only, not {engine}" for n in made},
        )
    srcs, failed = {}, {}
    for name, path in paths.items():
        rec = records[name]
        if rec.export_errors.get("gguf"):
            failed[name] = f"export gguf: {rec.export_errors['gguf']}"
        else:
            srcs[name] = rec.gguf.path if rec.gguf else path
    return srcs, failed


def engine_settings(bench: BenchConfig, engine: str) -> BenchSettings:
    """The bench settings of `engine`, from the recipe's whole `bench:` section, checked: an engine
    that cannot run here (not installed, no such device) raises QuantkitError before any model loads."""

    settings = BenchSettings.from_recipe(bench, engine)
    check_settings(settings)
    return settings


def bench_engine(
    settings: BenchSettings,
    sources: dict[str, Path],
    *,
    bench: BenchConfig,
    variants: tuple[Variant, ...],
    stored: Stored,
) -> Made:
    """One engine over every variant, in one bench_many (Made's value: its BenchResult); a finished
    result is reused on a re-run, one with a failure is not stored (it may not recur)."""

    engine = settings.engine
    shared = bench.model_dump(mode="json", exclude={"engine", "engines"})  # adding an engine keeps the others' results
    caches = variant_caches(settings, sources, variants)
    key = step_key(
        "bench",
        __version__,
        engine,
        sorted((n, content_hash(p)) for n, p in sources.items()),
        shared,
        *([sorted((n, c.label) for n, c in caches.items())] if caches else []),
    )
    hit = stored.read(key, BenchResult.from_json, f"bench ({engine})")
    if hit is not None:
        note(f"bench ({engine}): reusing")
        return Made(hit)
    note(f"bench: {len(sources)} variants in one run ({engine}, {settings.device})")
    result = bench_many(list(sources.values()), settings, names=list(sources), caches=caches)
    return Made(result, None if result.failed else key)  # a failure (out of memory, say) may not recur


def variant_caches(settings: BenchSettings, sources: dict[str, Path], variants: tuple[Variant, ...]) -> dict:
    """name -> the llama.cpp cache types a variant's recipe names (its kv_cache.llamacpp), on an
    engine whose cache types are a setting; elsewhere none (the engine holds its own)."""
    if not engine_class(settings.engine).kv_cache_lever:
        return {}
    variants = {v.name: v for v in variants}
    found = {n: variants[n].kv_cache.llama_cache for n in sources if n in variants and variants[n].kv_cache}
    return {n: c for n, c in found.items() if c is not None}


def bench_engines(
    bench: BenchConfig,
    variants: tuple[Variant, ...],
    paths: dict[str, Path],
    records: dict[str, VariantRecord],
    stored: Stored,
) -> tuple[dict[str, EngineBench], dict]:
    """(engine -> its EngineBench, the step-cache entries to store: key -> JSON). One of several
    engines that cannot run here at all (llama-cpp-python not installed, say) gets its error and no
    rows: the report says so and the other engines' results stand (the quickstart works without
    llama.cpp); a run's only engine fails every variant instead. A variant an engine that runs
    fails on is a failed row."""
    out, store = {}, {}
    engines = bench.engines
    for engine in engines:
        try:
            settings = engine_settings(bench, engine)
        except QuantkitError as exc:
            if len(engines) == 1:
                out[engine] = EngineBench(
                    engine, failed=tuple(FailedRow(str(p), n, str(exc)) for n, p in paths.items())
                )
            else:
                note(f"bench ({engine}): not run: {exc}")
                out[engine] = EngineBench(engine, error=str(exc))
            continue
        sources, failed = _sources(engine, paths, records)
        try:
            made = (
                bench_engine(settings, sources, bench=bench, variants=variants, stored=stored)
                if sources
                else Made(None)
            )
            result = made.value
            if made.key:
                store[made.key] = result.to_json()
            own = result.failed if result else ()
        except QuantkitError as exc:
            result, own = None, tuple(FailedRow(str(p), n, str(exc)) for n, p in sources.items())
        out[engine] = EngineBench(engine, result, (*own, *(FailedRow(str(paths[n]), n, e) for n, e in failed.items())))
    return out, store


def made_record(hit: dict) -> dict:
    """An export or llama-quantize step's stored record, checked by value where a run reads it: the
    file's sha256 and bytes, its path and type (core/record_checks.py)."""
    rules = {"sha256": TEXT, "bytes": COUNT}
    rules |= {k: TEXT for k in ("gguf", "gguf_type") if k in hit}
    return check_values(hit, rules | ({"fallback_types": OBJECT_OR_NONE} if "fallback_types" in hit else {}), "record")


def _reusable(stored: Stored, key: str, out: Path) -> dict | None:
    """The cached record of an export step whose output is still the one it recorded (a file: its
    size, then its sha256; a directory: its checkpoint hash)."""

    hit = stored.read(key, made_record, f"{out.name}")
    if hit is None or not out.exists():
        return None
    if out.is_file() and out.stat().st_size != hit.get("bytes"):
        return None
    return hit if content_hash(out) == hit.get("sha256") else None
