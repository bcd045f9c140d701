"""The run report's tables of decode at KV depth: each variant's TPOT at each depth beside the
baseline's (the measured ratio and the roofline's, the ratio of the bytes the two steps read), and
the long-context table a server's operator reads (bits per weight, the cache's bytes per token and
its size at the model's context, TPOT at each depth, the accuracy of the deepest position bucket).

Both are built from the bench rows of a run with `bench: {depths: [...]}`; each row is a frozen
record with one JSON form (report.json's `depths` and `long_context`), read back by `from_json`.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.bench.engines import engine_class
from quantkit.core.eval_results import EvalResult, PositionBucket
from quantkit.core.record_checks import checked
from quantkit.evals.scorers import scorer_named
from quantkit.pipeline.accuracy import DecodeAt, kl_header
from quantkit.pipeline.variant_record import VariantRecord


def depth_pairs(buckets, bench_rows) -> list[tuple]:
    """Each position bucket [lo, hi) with the bench rows whose KV depth lies in it: the decode time
    at the context length where the bucket's accuracy was measured. Bench rows are read by
    attribute and may have no `depth` (a bench without --depth): then no bucket has a pair."""
    rows = [r for r in bench_rows if getattr(r, "depth", None) is not None]
    return [(b, [r for r in rows if b.lo <= r.depth < b.hi]) for b in buckets]


@dataclass(frozen=True)
class DepthRow:
    """A variant's TPOT at one KV depth on one engine, beside the baseline's at the same depth and
    settings: `tpot_ratio` measured, `predicted_ratio` the roofline's (bytes per step over the
    baseline's, as each engine's cache reads them)."""

    name: str
    engine: str
    depth: int
    flash_attn: bool | None
    kv_cache: str | None
    kv_bytes_per_token: float
    bytes_per_token: float
    tpot_ms: float
    reference: str | None
    tpot_ratio: float | None
    predicted_ratio: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> "DepthRow":
        return cls(**checked(cls, data, "report depth row"))


def depth_rows(bench_rows, baseline: str | None) -> list[DepthRow]:
    """A DepthRow per bench row at a depth; the reference is the baseline's row on the same engine
    at the same depth and flash-attention setting (None where the baseline has none)."""
    at = [r for r in bench_rows if r.depth is not None]
    ref = {(r.engine, r.depth, r.flash_attn): r for r in at if r.name == baseline}
    out = []
    for r in at:
        b = ref.get((r.engine, r.depth, r.flash_attn))
        out.append(
            DepthRow(
                name=r.name,
                engine=r.engine,
                depth=r.depth,
                flash_attn=r.flash_attn,
                kv_cache=r.kv_cache,
                kv_bytes_per_token=r.kv_bytes_per_token,
                bytes_per_token=r.bytes_per_token,
                tpot_ms=r.tpot_ms,
                reference=b.name if b else None,
                tpot_ratio=r.tpot_ms / b.tpot_ms if b else None,
                predicted_ratio=r.bytes_per_token / b.bytes_per_token if b else None,
            )
        )
    return out


def depth_table(rows: list[DepthRow]) -> str:
    """Markdown: TPOT at each depth, and its ratio to the baseline's beside the roofline's."""
    head = ["variant", "engine", "depth", "KV cache", "MB/step", "TPOT ms", "TPOT ÷ baseline", "bytes ÷ baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r.engine, r.depth)):
        ratio = f"{r.tpot_ratio:.3f}" if r.tpot_ratio is not None else "—"
        pred = f"{r.predicted_ratio:.3f}" if r.predicted_ratio is not None else "—"
        fa = "" if r.flash_attn is None else f", flash attention {'on' if r.flash_attn else 'off'}"
        lines.append(
            f"| {r.name} | {r.engine}{fa} | {r.depth:,} | {r.kv_cache or '—'} | {r.bytes_per_token / 1e6:.1f} | "
            f"{r.tpot_ms:.2f} | {ratio} | {pred} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class ContextRow:
    """One variant on one bench engine at long context: its weights' bits, its cache as that engine
    holds it (type, bytes per token, MB at `context` tokens), TPOT at each depth, and the accuracy
    of the deepest position bucket the paired eval engine measured (`eval_engine`, `bucket`)."""

    name: str
    engine: str
    bits_per_weight: float | None
    kv_cache: str | None
    kv_bytes_per_token: float
    context: int
    kv_cache_mb: float
    decode: tuple[DecodeAt, ...]
    eval_engine: str | None
    domain: str | None
    kl_kind: str | None
    bucket: PositionBucket | None

    def to_json(self) -> dict:
        return {
            **self.__dict__,
            "decode": [d.to_json() for d in self.decode],
            "bucket": self.bucket.to_json() if self.bucket else None,
        }

    @classmethod
    def from_json(cls, data) -> "ContextRow":
        d = checked(cls, data, "report long-context row")
        return cls(
            **{
                **d,
                "decode": tuple(DecodeAt.from_json(x) for x in d["decode"]),
                "bucket": PositionBucket.from_json(d["bucket"]) if d["bucket"] else None,
            }
        )


def paired_eval(rec: VariantRecord, bench_engine: str) -> EvalResult | None:
    """The evaluation that scored the variant as `bench_engine` runs it: a GGUF engine's by a scorer
    of GGUF files (llama.cpp's cache types), the others' by the first eval engine (transformers,
    which applies the checkpoint's FP8 K/V scales)."""
    evals = rec.evaluations()
    gguf = engine_class(bench_engine).takes_gguf
    return next((ev for ev in evals if scorer_named(ev.engine).takes_gguf == gguf), evals[0] if evals else None)


def context_rows(rec: VariantRecord, bench_rows, bits: float | None, context: int) -> list[ContextRow]:
    """The variant's ContextRow on each engine that benched it at depths (its rows in `bench_rows`)."""
    out = []
    for engine in dict.fromkeys(r.engine for r in bench_rows if r.depth is not None):
        rows = sorted((r for r in bench_rows if r.engine == engine and r.depth is not None), key=lambda r: r.depth)
        ev = paired_eval(rec, engine)
        t = next((t for t in ev.texts if t.positions), None) if ev else None
        # the deepest bucket holding a depth the bench decoded at (where TPOT and accuracy meet), else the deepest
        paired = [b for b, at in depth_pairs(t.positions, rows) if at] if t else []
        bucket = (paired or list(t.positions))[-1] if t else None
        first = rows[0]
        out.append(
            ContextRow(
                name=rec.name,
                engine=engine,
                bits_per_weight=bits,
                kv_cache=first.kv_cache,
                kv_bytes_per_token=first.kv_bytes_per_token,
                context=context,
                kv_cache_mb=first.kv_bytes_per_token * context / 1e6,
                decode=tuple(DecodeAt(r.engine, r.depth, r.tpot_ms) for r in rows),
                eval_engine=ev.engine if t else None,
                domain=t.label if t else None,
                kl_kind=t.kl_kind if t else None,
                bucket=bucket,
            )
        )
    return out


def context_table(rows: list[ContextRow]) -> str:
    """Markdown: a row per variant and engine; a TPOT column per depth, the deepest bucket's accuracy."""
    depths = sorted({d.depth for r in rows for d in r.decode})
    buckets = {r.bucket.label for r in rows if r.bucket}
    where = f" at positions {buckets.pop()}" if len(buckets) == 1 else " in the deepest bucket"
    kl = kl_header(r.kl_kind for r in rows if r.kl_kind)
    context = max((r.context for r in rows), default=0)
    head = [
        "variant",
        "engine",
        "bits/weight",
        "KV cache",
        "KV B/token",
        f"KV MB at {context:,}",
        *(f"TPOT ms at {d:,}" for d in depths),
        f"ΔPPL %{where}",
        f"{kl}{where}",
        "top-1",
        "scored by",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tpot = {d.depth: d.tpot_ms for d in r.decode}
        b = r.bucket
        cells = [
            r.name,
            r.engine,
            f"{r.bits_per_weight:.2f}" if r.bits_per_weight is not None else "—",
            r.kv_cache or "—",
            f"{r.kv_bytes_per_token:,.0f}",
            f"{r.kv_cache_mb:.1f}",
            *(f"{tpot[d]:.2f}" if d in tpot else "—" for d in depths),
            f"{b.delta_ppl_pct:+.2f}" if b else "—",
            f"{b.kld.mean:.4f}" if b else "—",
            f"{b.top1_agreement * 100:.1f}%" if b else "—",
            r.eval_engine or "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def depth_sections(context: tuple[ContextRow, ...], depths: tuple[DepthRow, ...]) -> list[str]:
    """The long-context table and TPOT at each depth against the baseline, where the bench measured depths."""
    out = []
    if context:
        out += [
            "**Long context** (each variant as each engine runs it: its KV cache's type and bytes, the cache at the "
            "model's context, TPOT at each KV depth, and the accuracy of the deepest position bucket holding a "
            "bench depth, scored by the eval engine that runs it so: llama.cpp with its cache types, transformers "
            "with the checkpoint's FP8 K/V rounding):",
            "",
            context_table(list(context)),
            "",
        ]
    if any(d.reference for d in depths):
        out += [
            "**TPOT at depth against the baseline** (measured TPOT ÷ the baseline's on the same engine and depth, "
            "beside the roofline's prediction: the bytes each step reads ÷ the baseline's):",
            "",
            depth_table(list(depths)),
            "",
        ]
    return out
