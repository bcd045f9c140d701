"""The run report's accuracy rows: a row per variant per domain (and per eval engine), and a row per
position bucket of each, beside the decode time the bench measured at that KV depth.

Each is a frozen record with one JSON form (report.json's `accuracy` and `positions`, under the
report's schema_version) read back by `from_json`, so report.md renders from what report.json holds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from quantkit.core.eval_results import Interval95, PositionBucket, TextResult, check_kl_kind
from quantkit.core.record_checks import checked
from quantkit.pipeline.variant_record import VariantRecord


def kl_header(kinds) -> str:
    """A KL column's header naming its kind (every figure says which KL it is)."""
    kinds = set(kinds)
    if not kinds:
        return "KL"
    if kinds == {"exact"}:
        return "KL (exact)"
    if len(kinds) == 1:
        return f"KL ({kinds.pop().replace('topk-', 'top-')})"
    return "KL (exact or a bound: kl_kind per row in report.json)"


@dataclass(frozen=True)
class AccuracyRow:
    name: str  # the variant
    engine: str  # the eval engine that scored it
    domain: str
    text: str
    ppl: float
    baseline_ppl: float
    delta_ppl_pct: float
    ci95: Interval95
    kld_mean: float
    kld_p99: float
    kl_kind: str
    top1_pct: float
    tokens: int
    windows: int
    seq_len: int

    @classmethod
    def of(cls, name: str, engine: str, t: TextResult) -> "AccuracyRow":
        return cls(
            name=name,
            engine=engine,
            domain=t.label,
            text=t.text,
            ppl=t.ppl,
            baseline_ppl=t.baseline_ppl,
            delta_ppl_pct=t.delta_ppl_pct,
            ci95=t.ci95,
            kld_mean=t.kld.mean,
            kld_p99=t.kld.p99,
            kl_kind=t.kl_kind,
            top1_pct=t.top1_agreement * 100,
            tokens=t.tokens,
            windows=t.windows.count,
            seq_len=t.windows.seq_len,
        )

    def to_json(self) -> dict:
        return {
            f.name: (v.to_json() if hasattr(v, "to_json") else v) for f in fields(self) for v in [getattr(self, f.name)]
        }

    @classmethod
    def from_json(cls, data) -> "AccuracyRow":
        d = checked(cls, data, "report accuracy row")
        return cls(**{**d, "ci95": Interval95.from_json(d["ci95"]), "kl_kind": check_kl_kind(d["kl_kind"], "row")})


@dataclass(frozen=True)
class DecodeAt:
    """The bench's TPOT of a variant on one engine with `depth` tokens in the KV cache."""

    engine: str
    depth: int
    tpot_ms: float

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data) -> "DecodeAt":
        return cls(**checked(cls, data, "report position row's decode entry"))


@dataclass(frozen=True)
class PositionRow:
    """One position bucket of a variant's domain, and the decode times measured at depths inside it."""

    name: str
    engine: str
    domain: str
    kl_kind: str
    bucket: PositionBucket
    decode: tuple[DecodeAt, ...]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "engine": self.engine,
            "domain": self.domain,
            "kl_kind": self.kl_kind,
            "bucket": self.bucket.to_json(),
            "decode": [d.to_json() for d in self.decode],
        }

    @classmethod
    def from_json(cls, data) -> "PositionRow":
        d = checked(cls, data, "report position row")
        return cls(
            name=d["name"],
            engine=d["engine"],
            domain=d["domain"],
            kl_kind=check_kl_kind(d["kl_kind"], "report position row"),
            bucket=PositionBucket.from_json(d["bucket"]),
            decode=tuple(DecodeAt.from_json(x) for x in d["decode"]),
        )


def accuracy_rows(rec: VariantRecord) -> list[AccuracyRow]:
    """The variant's accuracy on each evaluation text: a row per variant per domain (and per eval engine)."""
    return [AccuracyRow.of(rec.name, ev.engine, t) for ev in rec.evaluations() for t in ev.texts]


def accuracy_table(rows: list[AccuracyRow]) -> str:
    """Markdown: variant, domain, PPL, ΔPPL and mean KL with their 95% bootstrap CIs, KL p99, top-1."""
    engines = len({r.engine for r in rows}) > 1  # several eval engines: the engine beside the variant
    kl = kl_header(r.kl_kind for r in rows)
    head = [
        "variant",
        *(["engine"] if engines else []),
        "domain",
        "PPL",
        "ΔPPL % [95% CI]",
        f"{kl} mean [95% CI]",
        f"{kl} p99",
        "top-1",
        "tokens",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        d, k = r.ci95.delta_ppl_pct, r.ci95.kld_mean
        who = f"{r.name} | {r.engine}" if engines else r.name
        lines.append(
            f"| {who} | {r.domain} | {r.ppl:.3f} | {r.delta_ppl_pct:+.2f} [{d[0]:+.2f}, {d[1]:+.2f}] | "
            f"{r.kld_mean:.4f} [{k[0]:.4f}, {k[1]:.4f}] | {r.kld_p99:.3f} | "
            f"{r.top1_pct:.1f}% | {r.tokens:,} |"
        )
    return "\n".join(lines)


def position_table(rows: list[PositionRow]) -> str:
    """Markdown: each variant's domains by position in the window, with the decode time the bench
    measured at a KV depth inside the bucket where it measured depths."""
    engines = len({r.engine for r in rows}) > 1
    decode = any(r.decode for r in rows)
    kl = kl_header(r.kl_kind for r in rows)
    head = [
        "variant",
        *(["engine"] if engines else []),
        "domain",
        "positions",
        "tokens",
        "ΔPPL % [95% CI]",
        f"{kl} mean [95% CI]",
        "top-1",
        *(["TPOT ms at depth"] if decode else []),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        b = r.bucket
        d, k = b.ci95.delta_ppl_pct, b.ci95.kld_mean
        who = f"{r.name} | {r.engine}" if engines else r.name
        tpot = [", ".join(f"{x.tpot_ms:.2f} @ {x.depth:,} ({x.engine})" for x in r.decode) or "—"] if decode else []
        lines.append(
            "| "
            + " | ".join(
                [
                    who,
                    r.domain,
                    b.label,
                    f"{b.tokens:,}",
                    f"{b.delta_ppl_pct:+.2f} [{d[0]:+.2f}, {d[1]:+.2f}]",
                    f"{b.kld.mean:.4f} [{k[0]:.4f}, {k[1]:.4f}]",
                    f"{b.top1_agreement * 100:.1f}%",
                    *tpot,
                ]
            )
            + " |"
        )
    return "\n".join(lines)
