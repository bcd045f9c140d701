"""report.json's content: the run as a whole (RunFacts, from the runner), each variant's rows
(pipeline/report.py's), the engines, the plots, the timings. The runner writes it, and report.md
from it (Runner._finish)."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

from quantkit.models.checkpoint import read_config
from quantkit.pipeline.accuracy import accuracy_rows
from quantkit.pipeline.depths import context_rows, depth_rows
from quantkit.pipeline.report import fastest, position_rows, variant_row
from quantkit.pipeline.run_report import EngineSection, ReportRow
from quantkit.pipeline.serving import EngineBench
from quantkit.pipeline.variant_record import VariantRecord
from quantkit.recipe.schema import BASELINE_NAME

SCHEMA_VERSION = 5  # report.json's schema: build_report says what each version added


def _engine_json(eb: EngineBench) -> dict:
    res = eb.result
    return EngineSection(
        device=res.device.to_json() if res else None,
        fit=res.fit.to_json() if res else None,
        settings=res.settings if res else None,
        load_average=res.load_average.to_json() if res else None,
        error=eb.error,
    ).to_json()


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
    bench_settings: dict
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
        bench_settings=recipe.bench.model_dump(mode="json"),
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
) -> dict:
    """report.json's content (the runner writes it, and report.md from it)."""
    first = next((eb.result for eb in benches.values() if eb.rows), None)
    steps_s = sum(facts.timings.values())
    bench_rows = [b for eb in benches.values() for b in eb.rows]
    typed = [ReportRow.from_json(r, SCHEMA_VERSION) for r in rows]
    bits = {r.name: r.bits_per_weight for r in typed}
    return {
        "kind": "quantkit-run",
        # 2: accuracy rows name their kl_kind; positions (by position in the window). 3: depths and long_context
        # 4: a variant's exports by format (exports, export_errors: FMT -> record, message; was gguf_error)
        # 5: a variant is a VariantRecord's JSON (pipeline/variant_record.py): every key written, null or
        # empty where nothing; its GGUF held once (gguf_variant or exports.gguf: no `gguf` key)
        "schema_version": SCHEMA_VERSION,
        "recipe": facts.recipe,
        "model": str(facts.model),
        "model_sha256": facts.model_sha256,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "eval_text": facts.eval_text,
        "eval_texts": list(facts.eval_texts),
        "calibration": facts.calibration,
        "accuracy": [a.to_json() for rec in variants.values() for a in accuracy_rows(rec)],
        "positions": [
            p.to_json()
            for rec in variants.values()
            for p in position_rows(rec, [b for b in bench_rows if b.name == rec.name])
        ],
        "depths": [d.to_json() for d in depth_rows(bench_rows, facts.baseline)],
        "long_context": [
            c.to_json()
            for rec in variants.values()
            for c in context_rows(rec, [b for b in bench_rows if b.name == rec.name], bits.get(rec.name), facts.context)
        ],
        "bench_settings": facts.bench_settings if benches else None,
        "device": first.device.to_json() if first else None,
        "fit": first.fit.to_json() if first else None,
        "engines": {e: _engine_json(eb) for e, eb in benches.items()},
        "fastest": fastest(rows),
        "rows": rows,
        "variants": {n: rec.to_json() for n, rec in variants.items()},
        "plots": plots,
        "timings": facts.timings,
        "wall_seconds": total_s,
        "steps_seconds": steps_s,
        "overhead_pct": 100.0 * max(0.0, total_s - steps_s) / total_s if total_s else 0.0,
        "failed": sorted(
            {r.name for r in typed if r.status == "failed"} | {n for n, v in variants.items() if v.export_errors},
            key=list(variants).index,
        ),
    }
