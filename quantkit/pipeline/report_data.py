"""report.json's content built (pipeline/report_content.py's record): the run as a whole (RunFacts,
from the runner), each variant's rows (pipeline/report.py's), the engines, the plots, the timings.
The runner writes it, and report.md from it (Runner._finish)."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

from quantkit.models.checkpoint import read_config
from quantkit.pipeline.accuracy import accuracy_rows
from quantkit.pipeline.depths import context_rows, depth_rows
from quantkit.pipeline.report import fastest, position_rows, variant_row
from quantkit.pipeline.report_content import SCHEMA_VERSION, EngineSection, ReportContent
from quantkit.pipeline.run_report import ReportRow
from quantkit.pipeline.serving import EngineBench
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.recipe.schema import BASELINE_NAME, BenchConfig


def _engine_section(eb: EngineBench) -> EngineSection:
    res = eb.result
    return EngineSection(
        device=res.device if res else None,
        fit=res.fit if res else None,
        settings=res.settings if res else None,
        load_average=res.load_average if res else None,
        error=eb.error,
    )


@dataclass(frozen=True)
class RunFacts:
    """What the report says of the run as a whole, from the runner: its recipe's name, model, texts,
    bench section, baseline, the model's context and the steps' timings so far."""

    recipe: str
    model: Path
    model_sha256: str
    eval_text: str | None
    eval_texts: tuple[str, ...]
    calibration: str | None
    bench_settings: BenchConfig
    baseline: str
    context: int
    timings: dict[str, float]


def run_facts(recipe, src: Path, src_hash: str, eval_texts: tuple, calib: str | None, timings: dict) -> RunFacts:
    return RunFacts(
        recipe=recipe.name,
        model=src,
        model_sha256=src_hash,
        eval_text=", ".join(eval_texts) or None,
        eval_texts=tuple(eval_texts),
        calibration=calib,
        bench_settings=recipe.bench,
        baseline=next((v.name for v in recipe.all_variants() if v.baseline), BASELINE_NAME),
        context=read_config(src).get("max_position_embeddings") or 0,
        timings=timings,
    )


def report_rows(variants: dict[str, VariantRecord], benches: dict[str, EngineBench]) -> list[dict]:
    """`benches`: engine -> its EngineBench (serving.bench_engines); empty when the bench was skipped."""
    engines = [e for e, eb in benches.items() if not eb.error] or [None]  # an engine that could not run has no rows
    return [variant_row(rec, e) for rec in variants.values() for e in engines]


def card_results(rec: VariantRecord) -> dict:
    """What a variant's model card shows of its results: its eval and its first engine's bench row."""
    results = {"eval": rec.eval, "bench": rec.bench}
    return {k: v.to_json() for k, v in results.items() if v is not None}


def build_report(
    facts: RunFacts,
    variants: dict[str, VariantRecord],
    benches: dict[str, EngineBench],
    rows: list[dict],
    plots: list[str],
    total_s: float,
) -> ReportContent:
    """report.json's record (the runner writes its JSON, and report.md from it)."""
    first = next((eb.result for eb in benches.values() if eb.rows), None)
    steps_s = sum(facts.timings.values())
    bench_rows = [b for eb in benches.values() for b in eb.rows]
    typed = [ReportRow.from_json(r, SCHEMA_VERSION) for r in rows]
    bits = {r.name: r.bits_per_weight for r in typed}

    def of(rec: VariantRecord) -> list:  # a variant's bench rows on every engine
        return [b for b in bench_rows if b.name == rec.name]

    return ReportContent(
        recipe=facts.recipe,
        model=str(facts.model),
        model_sha256=facts.model_sha256,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        host=platform.node(),
        eval_text=facts.eval_text,
        eval_texts=facts.eval_texts,
        calibration=facts.calibration,
        accuracy=tuple(a for rec in variants.values() for a in accuracy_rows(rec)),
        positions=tuple(p for rec in variants.values() for p in position_rows(rec, of(rec))),
        depths=tuple(depth_rows(bench_rows, facts.baseline)),
        long_context=tuple(
            c for rec in variants.values() for c in context_rows(rec, of(rec), bits.get(rec.name), facts.context)
        ),
        bench_settings=facts.bench_settings if benches else None,
        device=first.device if first else None,
        fit=first.fit if first else None,
        engines={e: _engine_section(eb) for e, eb in benches.items()},
        fastest=fastest(rows),
        rows=tuple(rows),
        variants=dict(variants),
        plots=tuple(plots),
        timings=dict(facts.timings),
        wall_seconds=total_s,
        steps_seconds=steps_s,
        overhead_pct=100.0 * max(0.0, total_s - steps_s) / total_s if total_s else 0.0,
        failed=tuple(
            sorted(
                {r.name for r in typed if r.status == "failed"} | {n for n, v in variants.items() if v.export_errors},
                key=list(variants).index,
            )
        ),
    )
