"""`quantkit run`'s serving side: each variant's GGUF (`export: {formats: [gguf]}`) and one bench
per engine of `bench.engines`, so the report has a row per variant and engine and a rule-check
fit per engine.

Each engine is benched in its own `bench_many` (its own probes before and after, its own fit),
one engine after the other in this process. The llama.cpp engine benches the run's GGUF when the
recipe exports one, else the artifact itself (exported into QUANTKIT_HOME's GGUF cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantkit import __version__
from quantkit.bench.engines import engine_class
from quantkit.bench.records import BenchResult, BenchRow, FailedRow
from quantkit.bench.runner import bench_many
from quantkit.bench.settings import BenchSettings, check_settings
from quantkit.core.integrity import sha256_file
from quantkit.errors import QuantkitError
from quantkit.export.registry import EXPORTERS
from quantkit.gguf.exporter import GgufOptions
from quantkit.gguf.exporter import export_gguf as export
from quantkit.gguf.kquant import DEFAULT_CALIB, KquantOptions, export_kquant
from quantkit.models.checkpoint import checkpoint_hash, content_hash
from quantkit.pipeline.cache import step_key, text_fingerprint
from quantkit.progress import note
from quantkit.quantize import ggufmix


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


def export_gguf(runner, name: str, path: Path) -> dict | None:
    """The variant's exact GGUF in RUN_DIR/gguf/NAME.gguf (its export record beside it, which lets
    the llama.cpp self-check find the artifact); reused while the file matches the stored hash."""
    if "gguf" not in runner.recipe.export.formats:
        return None

    out = runner.dir / "gguf" / f"{name}.gguf"
    key = step_key("gguf", __version__, checkpoint_hash(path), GgufOptions().__dict__)
    hit = _reusable(runner, key, out)
    if hit is not None:
        note(f"[{name}] export gguf: reusing {out}")
        return hit
    note(f"[{name}] export gguf")
    out.parent.mkdir(exist_ok=True)
    rec = export(path, out, GgufOptions(force=True))
    kept = {k: rec.get(k) for k in ("gguf", "sha256", "bytes", "lossless", "tensor_types", "mapping")}
    runner.cache.put(key, kept)
    return kept


def quantize_gguf(runner, v) -> dict:
    """A `gguf: {type, imatrix}` variant: RUN_DIR/gguf/NAME.gguf made by llama-quantize from the source
    checkpoint (gguf/kquant.py), the importance matrix over the run's calibration windows (its
    source, samples, seq_len, seed and region); reused while the file matches the stored hash."""

    c = runner.recipe.calibration
    calib = runner.calib or DEFAULT_CALIB
    opts = KquantOptions(
        qtype=v.gguf.type,
        imatrix=v.gguf.imatrix,
        calib=calib,
        samples=c.samples,
        seq_len=c.seq_len,
        seed=c.seed,
        region=c.region,
        force=True,
    )
    out = runner.dir / "gguf" / f"{v.name}.gguf"
    key = step_key(
        "gguf-quantize",
        __version__,
        runner.src_hash,
        v.gguf.model_dump(mode="json"),
        c.model_dump(mode="json") if v.gguf.imatrix else None,
        text_fingerprint(calib) if v.gguf.imatrix else None,
    )
    hit = _reusable(runner, key, out)
    if hit is not None:
        note(f"[{v.name}] llama-quantize {v.gguf.type}: reusing {out}")
        return hit
    note(f"[{v.name}] llama-quantize {v.gguf.type}{' with an importance matrix' if v.gguf.imatrix else ''}")
    out.parent.mkdir(exist_ok=True)
    chooser = ggufmix.chooser(ggufmix.parse_types(",".join(v.gguf.mixed_types or ggufmix.DEFAULT_TYPES)))
    rec = export_kquant(runner.src, out, opts, chooser if v.gguf.mixed else None)
    kept = EXPORTERS["gguf-kquant"].kept(rec)  # what the exporter says a run keeps of its record
    kept["imatrix_sha256"] = (rec.get("imatrix") or {}).get("sha256")
    if rec.get("mixed"):  # the choice's summary; every weight's type and cost stay in the GGUF's own record
        kept["mixed"] = {k: v for k, v in rec["mixed"].items() if k not in ("weights", "windows")}
    runner.cache.put(key, kept)
    return kept


def _sources(runner, engine: str, paths: dict[str, Path]) -> tuple[dict[str, Path], dict[str, str]]:
    """What `engine` benches for each variant, and the variants it cannot (their GGUF export failed).
    An engine that runs GGUF files gets the run's GGUF, when the recipe exports one."""

    if not engine_class(engine).takes_gguf:  # a `gguf:` variant exists only as a GGUF
        made = {n for n in paths if runner.variants[n].get("gguf_variant")}
        return (
            {n: p for n, p in paths.items() if n not in made},
            {n: f"a llama-quantize GGUF runs on GGUF engines only, not {engine}" for n in made},
        )
    srcs, failed = {}, {}
    for name, path in paths.items():
        rec = runner.variants[name]
        if rec.get("gguf_error"):
            failed[name] = f"export gguf: {rec['gguf_error']}"
        else:
            srcs[name] = Path(rec["gguf"]["gguf"]) if rec.get("gguf") else path
    return srcs, failed


def engine_settings(runner, engine: str) -> BenchSettings:
    """The bench settings of `engine`, from the recipe's whole `bench:` section, checked: an engine
    that cannot run here (not installed, no such device) raises QuantkitError before any model loads."""

    settings = BenchSettings.from_recipe(runner.recipe.bench, engine)
    check_settings(settings)
    return settings


def bench_engine(runner, settings: BenchSettings, sources: dict[str, Path]) -> BenchResult:
    """One engine over every variant, in one bench_many; a finished result is reused on a re-run."""

    engine = settings.engine
    shared = runner.recipe.bench.model_dump(
        mode="json", exclude={"engine", "engines"}
    )  # adding an engine keeps the others' results
    caches = variant_caches(runner, settings, sources)
    key = step_key(
        "bench",
        __version__,
        engine,
        sorted((n, content_hash(p)) for n, p in sources.items()),
        shared,
        *([sorted((n, c.label) for n, c in caches.items())] if caches else []),
    )
    hit = runner.cache.get(key)
    if hit is not None and not runner.opts.rerun:
        try:
            result = BenchResult.from_json(hit)
            note(f"bench ({engine}): reusing")
            return result
        except QuantkitError as exc:  # a record this version cannot read: bench again
            note(f"bench ({engine}): the stored result does not read ({exc}); benchmarking again")
    note(f"bench: {len(sources)} variants in one run ({engine}, {settings.device})")
    result = bench_many(list(sources.values()), settings, names=list(sources), caches=caches)
    if not result.failed:  # a failure (out of memory, say) may not recur: try again next run
        runner.cache.put(key, result.to_json())
    return result


def variant_caches(runner, settings: BenchSettings, sources: dict[str, Path]) -> dict:
    """name -> the llama.cpp cache types a variant's recipe names (its kv_cache.llamacpp), on an
    engine whose cache types are a setting; elsewhere none (the engine holds its own)."""
    if not engine_class(settings.engine).kv_cache_lever:
        return {}
    variants = {v.name: v for v in runner.recipe.all_variants()}
    found = {n: variants[n].kv_cache.llama_cache for n in sources if n in variants and variants[n].kv_cache}
    return {n: c for n, c in found.items() if c is not None}


def bench_engines(runner, paths: dict[str, Path]) -> dict[str, EngineBench]:
    """engine -> its EngineBench. One of several engines that cannot run here at all
    (llama-cpp-python not installed, say) gets its error and no rows: the report says so and
    the other engines' results stand (the quickstart works without llama.cpp); a run's only engine
    fails every variant instead. A variant an engine that runs fails on is a failed row."""
    out = {}
    engines = runner.recipe.bench.engines
    for engine in engines:
        try:
            settings = engine_settings(runner, engine)
        except QuantkitError as exc:
            if len(engines) == 1:
                out[engine] = EngineBench(
                    engine, failed=tuple(FailedRow(str(p), n, str(exc)) for n, p in paths.items())
                )
            else:
                note(f"bench ({engine}): not run: {exc}")
                out[engine] = EngineBench(engine, error=str(exc))
            continue
        sources, failed = _sources(runner, engine, paths)
        try:
            result = bench_engine(runner, settings, sources) if sources else None
            own = result.failed if result else ()
        except QuantkitError as exc:
            result, own = None, tuple(FailedRow(str(p), n, str(exc)) for n, p in sources.items())
        out[engine] = EngineBench(engine, result, (*own, *(FailedRow(str(paths[n]), n, e) for n, e in failed.items())))
    return out


def record_benches(runner, benches: dict[str, EngineBench]) -> None:
    """Each variant's row per engine into runner.variants[name]["benches"]; "bench" keeps the first
    engine's row (model cards and single-engine readers). A variant an engine failed on is failed."""
    engines = list(benches)
    for engine, eb in benches.items():
        for row in eb.rows:
            rec = runner.variants[row.name]
            rec.setdefault("benches", {})[engine] = row
            if engine == engines[0]:
                rec["bench"] = row
        for f in eb.failed:
            rec = runner.variants[f.name]
            rec.setdefault("bench_errors", {})[engine] = f.error
            if len(runner.recipe.bench.engines) == 1:
                rec.setdefault("error", f"bench: {f.error}")
            note(f"[{f.name}] bench ({engine}) failed: {f.error}")


def _reusable(runner, key: str, out) -> dict | None:
    """The cached record of a GGUF step whose file is still the one it recorded (size and sha256)."""

    hit = runner.cache.get(key)
    if (
        hit is not None
        and not runner.opts.rerun
        and out.is_file()
        and out.stat().st_size == hit.get("bytes")
        and sha256_file(out) == hit.get("sha256")
    ):
        return hit
    return None
