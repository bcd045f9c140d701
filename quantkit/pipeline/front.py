"""`quantkit pareto`'s records and its pure parts: the points of the front (one per variant that a
tool made, its bits per weight and its KL on every domain), the comparison at each size, the
markdown tables and the plot.

Bits per weight are counted the same way for every tool: bytes of the decoder layers' linear
weights as stored (packed codes, scales, zero points; a GGUF's blocks) × 8 ÷ their number of
weights (`bits_per_weight`). At a size S each line's point is its best one (lowest worst-domain KL)
of those at most S bits/weight (`compare`); quantkit's KL ÷ llama.cpp's on each domain and on the
worst domain say which is better and by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.core.outputs import save_png
from quantkit.core.record_checks import RecordError, checked
from quantkit.pipeline.plots import pyplot

SCHEMA_VERSION = 1
KIND = "quantkit-pareto"

# The command's defaults (cli/pareto_cmd.py shows them; pipeline/pareto.py ParetoSettings holds them).
DEFAULT_SIZES = (3.5, 4.0, 4.5, 5.0, 5.5)
# The sizes a front compares at: from about llama.cpp's Q3_K_M on a full-size model to Q8_0's 8.5 (a small
# model's rows that are no multiple of 256 fall back to larger types, so its Q6_K sits near 8).
SIZE_RANGE = (3.0, 8.5)
DEFAULT_ANCHORS = ("Q3_K_M", "IQ4_XS", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K")
DEFAULT_TEXTS = ("set:world-factbook", "set:shakespeare-plays", "set:python-stdlib-code")
DEFAULT_CT_RECIPE = "int4-w4a16-gptq-g64-mixed"


def bits_per_weight(layer_bytes: int, layer_weights: int) -> float:
    """Stored bits per weight of the decoder layers' linears: their bytes × 8 ÷ their weights."""
    if layer_weights <= 0:
        raise ValueError("no decoder-layer linear weights to count")
    return 8.0 * layer_bytes / layer_weights


@dataclass(frozen=True)
class Line:
    """One line of the front: what makes its points and what serves (and scores) them."""

    name: str  # the key in LINES, and in pareto.json
    label: str  # the plot's legend
    tool: str  # quantkit or llama.cpp
    format: str  # gguf or compressed-tensors
    engine: str  # the eval engine that scores its points (the engine that serves them)
    quantkit: bool  # one of quantkit's lines (compared against llama.cpp's)
    marker: str


LLAMACPP = "llamacpp"
LINES: dict[str, Line] = {
    LLAMACPP: Line(LLAMACPP, "llama.cpp K-quants + imatrix", "llama.cpp", "gguf", "llamacpp", False, "^"),
    "gguf-mixed": Line("gguf-mixed", "quantkit GGUF --mixed", "quantkit", "gguf", "llamacpp", True, "o"),
    "compressed-tensors": Line(
        "compressed-tensors",
        "quantkit compressed-tensors (auto)",
        "quantkit",
        "compressed-tensors",
        "transformers",
        True,
        "s",
    ),
}


def _num(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordError(f"{what}: expected a number, not {type(v).__name__}")
    return float(v)


@dataclass(frozen=True)
class DomainKL:
    """A point's figures on one text: mean KL against the baseline with its 95% bootstrap interval."""

    text: str  # the SPEC
    label: str
    kl: float
    ci95: tuple[float, float]
    delta_ppl_pct: float
    top1: float  # agreement with the baseline's most likely token, 0..1
    tokens: int

    def to_json(self) -> dict:
        return {**self.__dict__, "ci95": list(self.ci95)}

    @classmethod
    def from_json(cls, data, what: str = "domains[]") -> "DomainKL":
        d = checked(cls, data, what)
        ci = d["ci95"]
        if not isinstance(ci, list) or len(ci) != 2:
            raise RecordError(f"{what}.ci95: expected [low, high]")
        return cls(
            str(d["text"]),
            str(d["label"]),
            _num(d["kl"], f"{what}.kl"),
            (_num(ci[0], f"{what}.ci95"), _num(ci[1], f"{what}.ci95")),
            _num(d["delta_ppl_pct"], f"{what}.delta_ppl_pct"),
            _num(d["top1"], f"{what}.top1"),
            int(d["tokens"]),
        )


@dataclass(frozen=True)
class Point:
    """One variant on the front: the line that made it, its size, and its KL on every domain
    (none, with `error`, where it failed)."""

    line: str
    name: str  # the variant's name in the run
    target: str  # what it was made to: a llama.cpp type (Q4_K_M) or a budget (4.5 bits/weight)
    tool: str
    format: str
    engine: str
    path: str | None  # the GGUF file or the artifact directory
    file_bytes: int | None  # the GGUF file, or the artifact's weight files
    layer_bytes: int | None  # the decoder layers' linear weights as stored
    layer_weights: int | None
    bits_per_weight: float | None
    kl_kind: str | None  # what the eval reported: exact, or a top-k lower bound
    domains: tuple[DomainKL, ...] = ()
    error: str | None = None
    detail: dict = field(default_factory=dict)  # the types chosen, the units raised, ...

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.domains) and self.bits_per_weight is not None

    @property
    def worst(self) -> DomainKL | None:
        """The domain of the largest KL."""
        return max(self.domains, key=lambda d: d.kl) if self.domains else None

    def kl(self, text: str) -> float | None:
        return next((d.kl for d in self.domains if d.text == text), None)

    def to_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "domains"}
        w = self.worst
        return out | {
            "domains": [d.to_json() for d in self.domains],
            "worst_kl": w.kl if w else None,
            "worst_text": w.text if w else None,
        }

    @classmethod
    def from_json(cls, data, what: str = "points[]") -> "Point":
        if not isinstance(data, dict):
            raise RecordError(f"{what}: expected an object")
        d = checked(cls, {k: v for k, v in data.items() if k not in ("worst_kl", "worst_text")}, what)
        if not isinstance(d["domains"], list):
            raise RecordError(f"{what}.domains: expected a list")
        num = {k: None if d[k] is None else int(d[k]) for k in ("file_bytes", "layer_bytes", "layer_weights")}
        return cls(
            line=str(d["line"]),
            name=str(d["name"]),
            target=str(d["target"]),
            tool=str(d["tool"]),
            format=str(d["format"]),
            engine=str(d["engine"]),
            path=d["path"],
            bits_per_weight=None if d["bits_per_weight"] is None else _num(d["bits_per_weight"], what),
            kl_kind=d["kl_kind"],
            domains=tuple(DomainKL.from_json(x, f"{what}.domains[{i}]") for i, x in enumerate(d["domains"])),
            error=d["error"],
            detail=dict(d["detail"] or {}),
            **num,
        )


@dataclass(frozen=True)
class Side:
    """A line's point at a size, and its KL against llama.cpp's point there (None for llama.cpp's own)."""

    line: str
    name: str
    bits_per_weight: float
    worst_kl: float
    kl: dict  # text -> KL
    ratio: dict | None = None  # text -> this KL ÷ llama.cpp's
    worst_ratio: float | None = None  # worst-domain KL ÷ llama.cpp's worst-domain KL

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data, what: str = "side") -> "Side":
        d = checked(cls, data, what)
        return cls(**d)


@dataclass(frozen=True)
class SizeComparison:
    """At `size` bits/weight: each line's best point no larger, and which line is better."""

    size: float
    sides: dict  # line -> Side, or None where the line has no point this small
    best: str | None  # the line of the lowest worst-domain KL
    quantkit: str | None  # quantkit's better line here (by worst-domain KL)
    verdict: str  # one sentence

    def side(self, line: str) -> Side | None:
        return self.sides.get(line)

    def to_json(self) -> dict:
        return {
            "size": self.size,
            "sides": {k: None if v is None else v.to_json() for k, v in self.sides.items()},
            "best": self.best,
            "quantkit": self.quantkit,
            "verdict": self.verdict,
        }

    @classmethod
    def from_json(cls, data, what: str = "comparisons[]") -> "SizeComparison":
        d = checked(cls, data, what)
        if not isinstance(d["sides"], dict):
            raise RecordError(f"{what}.sides: expected an object")
        sides = {k: None if v is None else Side.from_json(v, f"{what}.sides.{k}") for k, v in d["sides"].items()}
        return cls(_num(d["size"], f"{what}.size"), sides, d["best"], d["quantkit"], str(d["verdict"]))


def best_at(points: list[Point], line: str, size: float) -> Point | None:
    """`line`'s point of the lowest worst-domain KL among those of at most `size` bits/weight."""
    fit = [p for p in points if p.line == line and p.ok and p.bits_per_weight <= size + 1e-9]
    return min(fit, key=lambda p: (p.worst.kl, p.bits_per_weight)) if fit else None


def _side(p: Point, anchor: Point | None) -> Side:
    kl = {d.text: d.kl for d in p.domains}
    ratio = worst = None
    if anchor is not None and p.line != LLAMACPP:
        ratio = {t: v / anchor.kl(t) if anchor.kl(t) else math.inf for t, v in kl.items() if anchor.kl(t) is not None}
        worst = p.worst.kl / anchor.worst.kl if anchor.worst.kl else math.inf
    return Side(p.line, p.name, p.bits_per_weight, p.worst.kl, kl, ratio, worst)


def compare(points: list[Point], sizes: tuple[float, ...]) -> list[SizeComparison]:
    """At each size, every line's best point no larger than it, quantkit's lines against llama.cpp's."""
    lines = [n for n in LINES if any(p.line == n for p in points)]
    out = []
    for size in sizes:
        best = {n: best_at(points, n, size) for n in lines}
        anchor = best.get(LLAMACPP)
        sides = {n: None if p is None else _side(p, anchor) for n, p in best.items()}
        found = {n: s for n, s in sides.items() if s is not None}
        lead = min(found, key=lambda n: found[n].worst_kl) if found else None
        ours = {n: s for n, s in found.items() if LINES[n].quantkit}
        qk = min(ours, key=lambda n: ours[n].worst_kl) if ours else None
        out.append(SizeComparison(size, sides, lead, qk, _verdict(size, sides, qk, anchor)))
    return out


def _verdict(size: float, sides: dict, qk: str | None, anchor: Point | None) -> str:
    if qk is None and anchor is None:
        return f"no line has a point of at most {size:g} bits/weight"
    if anchor is None:
        return f"llama.cpp has no point of at most {size:g} bits/weight; quantkit's best is {sides[qk].name}"
    if qk is None:
        return f"quantkit has no point of at most {size:g} bits/weight; llama.cpp's best is {anchor.name}"
    s = sides[qk]
    lo, hi = min(s.ratio.values()), max(s.ratio.values())
    if s.worst_ratio < 1:
        who = f"quantkit ({s.name}) is better than llama.cpp ({anchor.name})"
    else:
        who = f"llama.cpp ({anchor.name}) is better than quantkit ({s.name})"
    return (
        f"{who}: worst-domain KL × {s.worst_ratio:.2f} ({100 * (1 - s.worst_ratio):+.0f}% lower), "
        f"× {lo:.2f}–{hi:.2f} on each domain"
    )


def is_front(data: object) -> bool:
    """Whether parsed JSON says it is a front (its kind), before its checks."""
    return isinstance(data, dict) and data.get("kind") == KIND


@dataclass(frozen=True)
class ParetoResult:
    """DIR/pareto.json: the settings, every point, the comparison at each size."""

    model: str
    source_sha256: str
    calib: str
    settings: dict
    split: str
    texts: tuple[str, ...]
    kl_kinds: tuple[str, ...]  # every kl_kind the evals reported
    points: tuple[Point, ...]
    comparisons: tuple[SizeComparison, ...]
    accounting: str
    notes: tuple[str, ...]
    seconds: float
    kind: str = field(default=KIND, init=False)
    schema_version: int = field(default=SCHEMA_VERSION, init=False)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "model": self.model,
            "source_sha256": self.source_sha256,
            "calib": self.calib,
            "settings": self.settings,
            "split": self.split,
            "texts": list(self.texts),
            "kl_kinds": list(self.kl_kinds),
            "points": [p.to_json() for p in self.points],
            "comparisons": [c.to_json() for c in self.comparisons],
            "accounting": self.accounting,
            "notes": list(self.notes),
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data, what: str = "pareto.json") -> "ParetoResult":
        if not isinstance(data, dict):
            raise RecordError(f"{what}: expected a JSON object")
        if data.get("kind") != KIND or data.get("schema_version") != SCHEMA_VERSION:
            raise RecordError(
                f"{what}: kind {data.get('kind')!r} schema {data.get('schema_version')!r}, "
                f"not {KIND!r} schema {SCHEMA_VERSION}"
            )
        d = checked(cls, data, what)
        return cls(
            model=str(d["model"]),
            source_sha256=str(d["source_sha256"]),
            calib=str(d["calib"]),
            settings=dict(d["settings"]),
            split=str(d["split"]),
            texts=tuple(d["texts"]),
            kl_kinds=tuple(d["kl_kinds"]),
            points=tuple(Point.from_json(p, f"{what}: points[{i}]") for i, p in enumerate(d["points"])),
            comparisons=tuple(
                SizeComparison.from_json(c, f"{what}: comparisons[{i}]") for i, c in enumerate(d["comparisons"])
            ),
            accounting=str(d["accounting"]),
            notes=tuple(d["notes"]),
            seconds=_num(d["seconds"], f"{what}.seconds"),
        )


# ---------------------------------------------------------------- views


def _kl(d: DomainKL | None) -> str:
    return "—" if d is None else f"{d.kl:.4f} ({d.ci95[0]:.4f}–{d.ci95[1]:.4f})"


def points_table(r: ParetoResult) -> list[str]:
    head = ["line", "point", "bits/weight", "MB"] + [_label(r, t) for t in r.texts] + ["worst"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in sorted(r.points, key=lambda p: (list(LINES).index(p.line), p.bits_per_weight or 0)):
        if not p.ok:
            lines.append(f"| {p.line} | {p.name} | — | — | " + " | ".join(["—"] * len(r.texts)) + f" | {p.error} |")
            continue
        by = {d.text: d for d in p.domains}
        cells = [_kl(by.get(t)) for t in r.texts]
        mb = f"{p.file_bytes / 1e6:.1f}" if p.file_bytes else "—"
        lines.append(
            f"| {p.line} | {p.name} | {p.bits_per_weight:.2f} | {mb} | " + " | ".join(cells) + f" | {p.worst.kl:.4f} |"
        )
    return lines


def _label(r: ParetoResult, text: str) -> str:
    for p in r.points:
        for d in p.domains:
            if d.text == text:
                return d.label
    return text


def comparison_table(r: ParetoResult) -> list[str]:
    head = ["size ≤ b/w", "llama.cpp", "quantkit GGUF --mixed", "quantkit compressed-tensors", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in r.comparisons:
        cells = [f"{c.size:g}"]
        for line in (LLAMACPP, "gguf-mixed", "compressed-tensors"):
            s = c.side(line)
            if s is None:
                cells.append("—")
                continue
            txt = f"{s.name} ({s.bits_per_weight:.2f}): {s.worst_kl:.4f}"
            if s.worst_ratio is not None:
                each = ", ".join(f"{v:.2f}" for v in s.ratio.values())
                txt += f", × {s.worst_ratio:.2f} (each domain × {each})"
            cells.append(txt)
        lines.append("| " + " | ".join(cells + [c.verdict]) + " |")
    return lines


def markdown(r: ParetoResult) -> str:
    kinds = ", ".join(r.kl_kinds) or "—"
    out = [
        f"# Accuracy per bit: {r.model}",
        "",
        f"KL against the 16-bit model on the {r.split} windows of each text (KL: {kinds}), each point on "
        "the engine that serves it; bits/weight: " + r.accounting + ".",
        "",
        "## Points (KL, 95% CI)",
        "",
        *points_table(r),
        "",
        "## At each size",
        "",
        "Each line's best point of at most the size (lowest worst-domain KL); × is its KL ÷ llama.cpp's.",
        "",
        *comparison_table(r),
    ]
    if r.notes:
        out += ["", *[f"- {n}" for n in r.notes]]
    return "\n".join(out) + "\n"


def plot(r: ParetoResult, out: Path) -> Path:
    """Worst-domain KL against bits/weight on a log axis, one line per tool, the worst domain's 95% CI as bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, line) in enumerate(LINES.items()):
        pts = sorted((p for p in r.points if p.line == name and p.ok), key=lambda p: p.bits_per_weight)
        if not pts:
            continue
        xs = [p.bits_per_weight for p in pts]
        ys = [p.worst.kl for p in pts]
        lo = [max(0.0, y - p.worst.ci95[0]) for y, p in zip(ys, pts)]
        hi = [max(0.0, p.worst.ci95[1] - y) for y, p in zip(ys, pts)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker=line.marker, color=f"C{i}", capsize=3, label=line.label)
        for p, x, y in zip(pts, xs, ys):
            ax.annotate(
                p.target.removesuffix(" bits/weight"),
                (x, y),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
                color=f"C{i}",
            )
    for c in r.comparisons:
        ax.axvline(c.size, color="gray", alpha=0.15, lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight (decoder-layer linears, as stored)")
    ax.set_ylabel(f"worst-domain KL vs 16-bit ({r.split} windows)")
    ax.set_title(f"{r.model}: KL per bit", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, out, dpi=90)
    plt.close(fig)
    return out
