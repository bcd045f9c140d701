"""`quantkit run`: every variant of a recipe through convert -> verify -> eval -> bench, then a report.

Finished steps are reused on a re-run: each step's result is stored in the run directory under a
key hashed from its inputs (source checkpoint hash, the resolved variant, calibration and eval
settings, artifact hashes), so an interrupted run resumes and an unchanged one finishes at once.
A failed variant is recorded and the others go on.

The run directory is locked for the whole run (a second `quantkit run` on it gets one line,
exit 2). Every record is written with write-then-rename; a damaged one (an emptied steps.json
or artifact quantkit.json, say) means that step is done again, with a note, never that the run
stops.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from quantkit import __version__
from quantkit.artifacts.card import update_card_results
from quantkit.artifacts.staging import model_inputs, read_meta, text_input, verification_problem
from quantkit.core.atomic import exclusive, write_json, write_text
from quantkit.core.eval_results import EvalResult
from quantkit.core.integrity import problems
from quantkit.core.kv_cache import head_dims
from quantkit.core.outputs import made_above
from quantkit.costs.commands import memory_warning
from quantkit.data.calib import check_source
from quantkit.data.text import check_readable
from quantkit.errors import QuantkitError
from quantkit.evals.domains import default_texts, labelled
from quantkit.evals.eval_runner import run_eval
from quantkit.evals.eval_settings import EvalSettings
from quantkit.evals.scorers import scorer_named
from quantkit.export.export_registry import check_formats
from quantkit.models.checkpoint import checkpoint_hash, content_hash, read_config
from quantkit.models.resolve import resolve_path
from quantkit.pipeline import report, report_data, serving
from quantkit.pipeline.cache import StepCache, step_key, text_fingerprint
from quantkit.pipeline.report_content import ReportContent
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.progress import note
from quantkit.quantize.convert import convert
from quantkit.quantize.job import ConvertOptions, needs_calibration
from quantkit.quantize.preflight import check_context, check_not_inside
from quantkit.recipe.bench_options import FLASH_ATTN
from quantkit.recipe.schema import BASELINE_NAME, Recipe, Variant


@dataclass
class RunOptions:
    model: str | None = None
    out: Path | None = None
    calib: str | None = None
    eval_text: str | tuple | None = None  # --eval-text (repeatable): overrides the recipe's eval.texts
    skip_eval: bool = False
    skip_bench: bool = False
    rerun: bool = False
    debug: bool = False
    inputs: tuple = ()  # (path, what) pairs no artifact --out may be or contain (the recipe files)


def with_baseline(recipe: Recipe) -> tuple[Variant, ...]:
    """The recipe's variants, after the unmodified checkpoint unless one of them is it (recipe
    validation keeps its name, BASELINE_NAME, free for it)."""
    variants = recipe.all_variants()
    if any(v.baseline for v in variants):
        return variants
    return (Variant(name=BASELINE_NAME, description="the unmodified source checkpoint", baseline=True), *variants)


def _real(p: Path) -> Path:
    """An absolute path with its symlinks resolved (one that does not exist yet: as far as it does)."""
    return Path(os.path.abspath(Path(p).expanduser())).resolve()


def check_run_dir(run_dir: Path, src: Path, inputs) -> None:
    """A run directory is a directory of its own: not a file, not the root or home directory, and
    neither one of the run's inputs (the source checkpoint, the recipe files, the texts), nor
    inside the source checkpoint (whose hash, and so every cached step, would change under it),
    nor containing any of them."""

    if run_dir.exists() and not run_dir.is_dir():
        raise QuantkitError(
            f"--out {run_dir} exists and is not a directory; a run directory holds the report and artifacts"
        )
    here = _real(run_dir)
    if here in (Path(here.anchor), _real(Path.home())):
        raise QuantkitError(
            f"--out {run_dir} is the root or home directory; a run directory is a new directory of its own"
        )
    for p, what in [*model_inputs(src), *inputs]:
        if here == p or here in p.parents:
            raise QuantkitError(
                f"--out {run_dir} {'is' if here == p else 'contains'} {what} ({p}); "
                "a run directory is a new directory of its own (nothing was changed)"
            )
    check_not_inside(run_dir, src)
    artifact = made_above(here.parent)
    if artifact:
        raise QuantkitError(
            f"--out {run_dir} lies inside {artifact[1]} ({artifact[0]}); a run directory is a new directory of "
            "its own (nothing was changed)"
        )
    check_run_contents(run_dir)


def check_run_contents(run_dir: Path) -> None:
    """An existing run directory is one a run made (it holds steps.json, written first) or an
    empty one: `run` writes artifacts and reports into it, as `convert` refuses to into a foreign
    non-empty --out."""
    if (
        run_dir.is_dir()
        and not (run_dir / "steps.json").is_file()
        and not (run_dir / "report.json").is_file()
        and any(run_dir.iterdir())
    ):
        raise QuantkitError(
            f"--out {run_dir} is not a quantkit run directory (no steps.json) and is not empty; a run writes its "
            "artifacts and reports there: choose another --out, or empty it yourself (nothing was changed)"
        )


class Runner:
    """Construction makes every check of the run as a whole (the model, --out, the texts), so a
    bad one fails before anything is converted; `run --plan` builds the same Runner."""

    def __init__(self, recipe: Recipe, opts: RunOptions):
        self.recipe, self.opts = recipe, opts
        check_formats(recipe.export.formats)  # the exporter registry's formats (export/export_registry.py)
        ref = opts.model or recipe.model
        if not ref:
            raise QuantkitError(f"{recipe.name}: no model: pass --model or set `model:` in the recipe")
        self.src = resolve_path(ref)
        self.dir = Path(opts.out or Path("runs") / recipe.name)
        self.cache = StepCache(self.dir / "steps.json")  # read in run(), under the lock
        self.calib = opts.calib or recipe.calibration.source
        self.eval_texts = self._eval_texts() if not opts.skip_eval else ()
        self.eval_text = ", ".join(self.eval_texts) or None  # for the report's header
        self._check_windows()
        check_run_dir(self.dir, self.src, self.inputs())
        self.timings: dict[str, float] = {}
        self.variants: dict[str, VariantRecord] = {}

    @cached_property
    def src_hash(self) -> str:
        """Hashed when a step first needs it (never by `run --plan`)."""
        return checkpoint_hash(self.src)

    def inputs(self) -> tuple:
        """(path, what) pairs no run directory or artifact may be or contain: the recipe files and the texts."""
        texts = [i for t in self.eval_texts for i in text_input(t, "the evaluation text")]
        return (*self.opts.inputs, *texts, *text_input(self.calib, "the calibration text"))

    def _check_windows(self) -> None:
        """The texts' window lengths fit the model's context, and a calibration text that is given
        is read now (it exists, it is text), as the eval texts are; a calibrated variant without one
        fails on its own, and the others go on."""

        cfg = read_config(self.src)
        if self.eval_texts:
            check_context(cfg, self.recipe.eval.seq_len, "eval.seq_len")
        b = self.recipe.bench
        if b.depths and not self.opts.skip_bench:  # the deepest depth and its generated tokens fit the context
            check_context(cfg, max(b.depths) + b.gen_len, f"bench.depths {max(b.depths)} + bench.gen_len {b.gen_len} =")
        self._check_caches(cfg)
        if any(needs_calibration(v) or (v.gguf is not None and v.gguf.imatrix) for v in self.recipe.all_variants()):
            check_context(cfg, self.recipe.calibration.seq_len, "calibration.seq_len")
            if self.calib:
                check_source(self.calib, "--calib" if self.opts.calib else "calibration.source")

    def _check_caches(self, cfg: dict) -> None:
        """A variant's llama.cpp cache types (its quantize step's kv_cache.llamacpp) with the flash
        attention the bench asks of llama.cpp: a quantized V cache needs it on, and a quantized type
        holds whole blocks of each attention head (core/kv_cache.py check_heads)."""
        b = self.recipe.bench
        for v in self.recipe.all_variants():
            cache = v.kv_cache.llama_cache if v.kv_cache else None
            if cache is None:
                continue
            for fa in FLASH_ATTN[b.flash_attn] if not self.opts.skip_bench else (None,):
                cache.check_heads(
                    *head_dims(cfg), fa, f"variant {v.name}: kv_cache.llamacpp {cache.label} with bench.flash_attn"
                )

    def _eval_texts(self) -> tuple[str, ...]:
        """--eval-text, else the recipe's eval.texts, else (no tasks either) the default domains; each
        is read now, so a bad or unreachable text fails before any conversion rather than after."""
        given = self.opts.eval_text
        texts = tuple([given] if isinstance(given, str) else given or ()) or self.recipe.eval.texts
        if not texts and not self.recipe.eval.tasks:
            texts = tuple(default_texts())
        labelled(texts, "--eval-text" if given else "eval.texts")  # the same text twice is refused here
        for t in texts:
            check_readable(t)
        return texts

    def _timed(self, label: str, fn):
        t = time.perf_counter()
        try:
            return fn()
        finally:
            self.timings[label] = time.perf_counter() - t

    def conversion(self, v: Variant, meta: dict | None = None):
        """What `convert` gets for variant `v`: (the one-variant recipe, source, artifact directory, options)."""

        single = self.recipe.model_copy(update={"variants": (v,), "steps": ()})
        opts = ConvertOptions(
            calib=self.calib, force=True, inputs=self.inputs(), meta=meta, memory_check=memory_warning
        )
        return single, str(self.src), self.dir / "artifacts" / v.name, opts

    def convert(self, v: Variant) -> Path:
        if not v.steps:
            return self.src

        key = step_key(
            "convert",
            __version__,
            self.src_hash,
            [s.model_dump(mode="json") for s in v.steps],
            self.recipe.calibration.model_dump(mode="json"),
            text_fingerprint(self.calib),
        )
        single, src, out, opts = self.conversion(v, meta={"run_key": key})
        if not self.opts.rerun and self._reusable(v, out, key):
            note(f"[{v.name}] convert: reusing {out}")
            return out
        note(f"[{v.name}] convert")
        convert(single, src, out, opts, v.name)
        return out

    def _reusable(self, v: Variant, out: Path, key: str) -> bool:
        """The artifact this step made before, intact: same inputs, verified, every file its recorded size."""

        try:
            meta = read_meta(out)
        except QuantkitError as exc:
            note(f"[{v.name}] {exc}: converting again")
            return False
        if meta.get("run_key") != key or verification_problem(meta) is not None:
            return False
        files = meta.get("files")
        found = problems(out, files, deep=False) if isinstance(files, dict) and files else ["no integrity manifest"]
        if found:
            note(f"[{v.name}] {out}: {found[0]}: converting again")
        return not found

    def evaluate(self, v: Variant, path: Path, rec: VariantRecord) -> EvalResult | None:
        """The first of eval.engines' result (rec.eval: the report's main row and the model card);
        each further engine's in rec.evals[engine], where a failure (no llama.cpp, a grid GGUF
        cannot hold exactly) is recorded in rec.eval_errors and the variant goes on."""
        ev = self.recipe.eval
        if self.opts.skip_eval or (not self.eval_texts and not ev.tasks):
            return None
        first, *more = ev.engines
        result = self._evaluate(v, path, first)
        for engine in more:
            try:
                rec.evals[engine] = self._evaluate(v, path, engine)
            except QuantkitError as exc:
                rec.eval_errors[engine] = str(exc)
                note(f"[{v.name}] eval ({engine}) failed: {exc}")
        return result

    def _evaluate(self, v: Variant, path: Path, engine: str) -> EvalResult:
        ev = self.recipe.eval
        key = step_key(
            "eval",
            __version__,
            content_hash(path),
            self.src_hash,
            ev.model_dump(mode="json", exclude={"texts", "engines"} | ({"split"} if ev.split == "all" else set())),
            [(t, text_fingerprint(t)) for t in self.eval_texts],
            engine,
            *([kv] if (kv := self._eval_cache(v, engine)) else []),
        )
        what = "eval" if len(ev.engines) == 1 else f"eval ({engine})"
        result = None if self.opts.rerun else self.cache.read(key, EvalResult.from_json, f"[{v.name}] {what}")
        if result is not None:
            note(f"[{v.name}] {what}: reusing")
            return result
        note(f"[{v.name}] {what}")
        tasks = (
            ev.tasks if scorer_named(engine, "eval.engines").runs_tasks else ()
        )  # lm-eval tasks: only where the scorer runs them (transformers)
        settings = replace(
            EvalSettings.from_recipe(ev, engine, self.eval_texts, tasks), kv_cache=self._eval_cache(v, engine)
        )
        result = run_eval(path, self.src, settings)
        self.cache.put(key, result.to_json())
        return result

    def _eval_cache(self, v: Variant, engine: str) -> str | None:
        """The llama.cpp cache types the variant is scored with by a scorer that takes them (its
        kv_cache.llamacpp); None: the scorer's own cache (transformers applies the FP8 scales)."""
        kv = v.kv_cache
        return kv.llamacpp if kv and kv.llamacpp and scorer_named(engine, "eval.engines").kv_caches == "any" else None

    @property
    def stored(self) -> serving.Stored:
        """The step cache as the steps see it: read only, empty on --rerun."""
        return serving.Stored(self.cache, self.opts.rerun)

    def _folder(self, name: str) -> Path:
        """RUN_DIR/NAME, made: where a serving step writes its file."""
        out = self.dir / name
        out.mkdir(exist_ok=True)
        return out

    def gguf_variant(self, v: Variant, rec: VariantRecord) -> Path:
        """A `gguf:` variant: llama-quantize's type made from the source checkpoint (pipeline/serving.py),
        scored by the llama.cpp scorer whatever eval.engines says (a GGUF is what it reads)."""
        source = serving.GgufSource(self.src, self.src_hash, self.recipe.calibration, self.calib)

        def step() -> serving.Made:
            return serving.quantize_gguf(v, source, out_dir=self._folder("gguf"), stored=self.stored)

        made = self._record(self._timed(f"convert:{v.name}", step))
        rec.gguf_variant = made
        path = rec.gguf.path
        ev = self.recipe.eval
        if not self.opts.skip_eval and (self.eval_texts or ev.tasks):
            rec.eval = self._timed(f"eval:{v.name}", lambda: self._evaluate(v, path, "llamacpp"))
        return path

    def export(self, name: str, path: Path, rec: VariantRecord) -> None:
        """Each format of `export: {formats: [...]}` by its exporter (pipeline/serving.py), its record
        in rec.exports[FMT] (a GGUF's is what the llama.cpp engines bench: rec.gguf); a
        format that cannot hold the variant (a grid GGUF has no type for) fails that format only."""
        for fmt in self.recipe.export.formats:
            try:
                made = self._record(
                    self._timed(
                        f"export:{name}" + (f":{fmt}" if fmt != "gguf" else ""),
                        lambda: serving.export_format(fmt, name, path, out_dir=self._folder(fmt), stored=self.stored),
                    )
                )
            except QuantkitError as exc:
                rec.export_errors[fmt] = str(exc)
                note(f"[{name}] export {fmt} failed: {exc}")
                continue
            rec.exports[fmt] = made

    def bench(self, paths: dict[str, Path]) -> dict[str, serving.EngineBench]:
        """One bench per engine of bench.engines (pipeline/serving.py): engine -> its EngineBench."""
        if self.opts.skip_bench or not paths:
            return {}
        variants = self.recipe.all_variants()
        benches, store = serving.bench_engines(self.recipe.bench, variants, paths, self.variants, self.stored)
        for key, value in store.items():
            self.cache.put(key, value)
        self._record_benches(benches)  # a variant an engine failed on is a failed variant
        return benches

    def _record(self, made: serving.Made):
        """A serving step's result, stored under its key when it has one (not reused); returns its value."""
        if made.key is not None:
            self.cache.put(made.key, made.value)
        return made.value

    def _record_benches(self, benches: dict[str, serving.EngineBench]) -> None:
        """Each variant's row per engine into its record's benches; bench keeps the first engine's
        row (model cards and single-engine readers). A variant an engine failed on is failed."""
        engines = list(benches)
        for engine, eb in benches.items():
            for row in eb.rows:
                rec = self.variants[row.name]
                rec.benches[engine] = row
                if engine == engines[0]:
                    rec.bench = row
            for f in eb.failed:
                rec = self.variants[f.name]
                rec.bench_errors[engine] = f.error
                if len(self.recipe.bench.engines) == 1 and rec.error is None:
                    rec.error = f"bench: {f.error}"
                note(f"[{f.name}] bench ({engine}) failed: {f.error}")

    def run(self) -> ReportContent:
        with exclusive(self.dir, what=f"run directory {self.dir}"):
            check_run_contents(self.dir)  # again under the lock
            self.dir.mkdir(parents=True, exist_ok=True)
            self.cache = StepCache.open(self.dir)
            if not self.cache.path.is_file():  # first: an interrupted run's directory is still known as one
                write_json(self.cache.path, {})
            return self._run()

    def _run(self) -> ReportContent:
        t0 = time.perf_counter()
        paths: dict[str, Path] = {}
        for v in with_baseline(self.recipe):
            rec = self.variants.setdefault(
                v.name,
                VariantRecord(
                    v.name, v.description, tuple(s.model_dump(mode="json", exclude_none=True) for s in v.steps)
                ),
            )
            try:
                if v.gguf is not None:
                    paths[v.name] = self.gguf_variant(v, rec)
                    continue
                path = self._timed(f"convert:{v.name}", lambda: self.convert(v))
                rec.artifact = str(path)
                rec.eval = self._timed(f"eval:{v.name}", lambda: self.evaluate(v, path, rec))
                paths[v.name] = path
                self.export(v.name, path, rec)
            except Exception as exc:  # a failed variant is reported; the others go on
                if self.opts.debug:
                    raise
                user = isinstance(exc, QuantkitError)
                rec.failed(
                    str(exc) if user else f"{type(exc).__name__}: {exc}",
                    None if user else traceback.format_exc(limit=8),
                )
                note(f"[{v.name}] failed: {rec.error}")
        benches = self._timed("bench", lambda: self.bench(paths))
        total = time.perf_counter() - t0
        return self._timed("report", lambda: self._finish(benches, total))

    def _finish(self, benches: dict[str, serving.EngineBench], total_s: float) -> ReportContent:
        """The report (pipeline/report_data.py, pipeline/report.py) written: report.json, report.md, its plots, and each
        artifact's model card made in this run updated with its results."""
        rows = report_data.report_rows(self.variants, benches)
        plots = report.make_plots(self._folder("plots"), benches, rows) if report.has_plots(benches) else []
        for rec in self.variants.values():
            art = Path(rec.artifact or "")
            made_here = art.is_relative_to(self.dir) and art.resolve() != Path(self.src).resolve()  # never the source
            if rec.artifact and (art / "quantkit.json").is_file() and made_here:
                try:
                    update_card_results(art, report_data.card_results(rec))
                except QuantkitError as exc:  # the report still gets written; the card keeps its old table
                    note(f"[{rec.name}] model card not updated: {exc}")
        facts = report_data.run_facts(self.recipe, self.src, self.src_hash, self.eval_texts, self.calib, self.timings)
        content = report_data.build_report(facts, self.variants, benches, rows, plots, total_s)
        write_json(self.dir / "report.json", content.to_json(), default=str)
        write_text(self.dir / "report.md", report.render_markdown(content))
        return content
