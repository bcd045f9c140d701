"""What `quantkit eval` hands on: typed, frozen records with one JSON form each and a schema version.

An evaluation (EvalResult) holds one result per text domain (TextResult: PPL, ΔPPL, KL and top-1
with their bootstrap intervals, the same by position within the window, the windows scored) and
the lm-eval task deltas (TaskDelta). The CLI's `--json`, the model card (quantkit.json
`results.eval`), a run's step cache and report.json all hold `EvalResult.to_json()`, and every
reader goes through `from_json`: an unknown or missing key is one line where the file is read.

The records live below `evals/` because the model card (artifacts/, a lower layer) reads them too.

Schema 1 is the untyped result before the KL's kind and the position buckets were recorded; it
still reads (`migrate_v1`): its `kl_method` sentence becomes `kl_kind`, and it has no buckets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

from quantkit.core.record_checks import (
    COUNT,
    FRACTION,
    NONNEG,
    OBJECT,
    OBJECT_OR_NONE,
    POSITIVE,
    TEXT,
    TEXT_OR_NONE,
    Num,
    RecordError,
    Whole,
    check_values,
    checked,
)

SCHEMA_VERSION = 2
READS = (1, 2)
KIND = "quantkit-eval"

KL_EXACT = "exact"  # KL(base || model) over the whole vocabulary
_TOPK_KIND = re.compile(r"topk-(\d+) lower bound")


def topk_kind(k: int) -> str:
    """The kind of a KL taken over the baseline's top-k tokens plus one tail bucket: a lower bound."""
    return f"topk-{k} lower bound"


def check_kl_kind(kind, what: str) -> str:
    if kind != KL_EXACT and not (isinstance(kind, str) and _TOPK_KIND.fullmatch(kind)):
        raise RecordError(f"{what}: kl_kind {kind!r}: expected {KL_EXACT!r} or 'topk-K lower bound'")
    return kind


def _number(v, what: str) -> float:
    """A figure; null is how strict JSON holds a non-finite one (an interval of a single window: NaN)."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordError(f"{what}: expected a number, not {type(v).__name__}")
    return float(v)


def _integer(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordError(f"{what}: expected a whole number, not {type(v).__name__}")
    return v


def _pair(v, what: str) -> tuple[float, float]:
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise RecordError(f"{what}: expected [low, high]")
    return (_number(v[0], what), _number(v[1], what))


# The figures of a text or a position bucket, as read back (a stored result can be damaged or
# edited): perplexities above 0, ΔPPL above -100%, top-1 agreement a fraction, tokens counted;
# the KL's own rule is in KLSummary (never negative: each token's KL is clamped at 0).
FIGURES = {
    "ppl": POSITIVE,
    "baseline_ppl": POSITIVE,
    "delta_ppl_pct": Num(low=-100, above=True),
    "top1_agreement": FRACTION,
    "tokens": Whole(1),
}


@dataclass(frozen=True)
class KLSummary:
    """Per-token KL(base || model) over the scored positions."""

    mean: float
    median: float
    p99: float
    max: float

    def to_json(self) -> dict:
        return {"mean": self.mean, "median": self.median, "p99": self.p99, "max": self.max}

    @classmethod
    def from_json(cls, data, what: str = "kld") -> "KLSummary":
        d = check_values(checked(cls, data, what), dict.fromkeys(("mean", "median", "p99", "max"), NONNEG), what)
        return cls(**{k: float(v) for k, v in d.items()})


@dataclass(frozen=True)
class Interval95:
    """95% bootstrap intervals of ΔPPL % and mean KL, whole windows resampled (NaN under two windows)."""

    delta_ppl_pct: tuple[float, float]
    kld_mean: tuple[float, float]

    def to_json(self) -> dict:
        return {"delta_ppl_pct": list(self.delta_ppl_pct), "kld_mean": list(self.kld_mean)}

    @classmethod
    def from_json(cls, data, what: str = "ci95") -> "Interval95":
        d = checked(cls, data, what)
        return cls(_pair(d["delta_ppl_pct"], f"{what}.delta_ppl_pct"), _pair(d["kld_mean"], f"{what}.kld_mean"))


def figures_of(f: dict) -> dict:
    """The record fields of accuracy_stats.summarize()'s figures (the same names; kld and ci95 as
    records), for a TextResult or a PositionBucket being built from a fresh score."""
    ci = f["ci95"]
    return {
        "ppl": f["ppl"],
        "baseline_ppl": f["baseline_ppl"],
        "delta_ppl_pct": f["delta_ppl_pct"],
        "kld": KLSummary(**f["kld"]),
        "top1_agreement": f["top1_agreement"],
        "ci95": Interval95(tuple(ci["delta_ppl_pct"]), tuple(ci["kld_mean"])),
        "tokens": f["tokens"],
    }


@dataclass(frozen=True)
class PositionBucket:
    """The figures of the positions [lo, hi) of every window: row i predicts token i + 1 from the
    i + 1 tokens before it, so a bucket is a range of context lengths (KV-cache depths)."""

    lo: int
    hi: int
    tokens: int
    ppl: float
    baseline_ppl: float
    delta_ppl_pct: float
    kld: KLSummary
    top1_agreement: float
    ci95: Interval95

    def to_json(self) -> dict:
        return {
            "lo": self.lo,
            "hi": self.hi,
            "tokens": self.tokens,
            "ppl": self.ppl,
            "baseline_ppl": self.baseline_ppl,
            "delta_ppl_pct": self.delta_ppl_pct,
            "kld": self.kld.to_json(),
            "top1_agreement": self.top1_agreement,
            "ci95": self.ci95.to_json(),
        }

    @classmethod
    def from_json(cls, data, what: str = "positions[]") -> "PositionBucket":
        d = check_values(checked(cls, data, what), FIGURES | {"lo": COUNT, "hi": Whole(1)}, what)
        if d["lo"] >= d["hi"]:
            raise RecordError(f"{what}: lo {d['lo']} is not below hi {d['hi']}")
        return cls(
            lo=_integer(d["lo"], f"{what}.lo"),
            hi=_integer(d["hi"], f"{what}.hi"),
            tokens=_integer(d["tokens"], f"{what}.tokens"),
            ppl=_number(d["ppl"], f"{what}.ppl"),
            baseline_ppl=_number(d["baseline_ppl"], f"{what}.baseline_ppl"),
            delta_ppl_pct=_number(d["delta_ppl_pct"], f"{what}.delta_ppl_pct"),
            kld=KLSummary.from_json(d["kld"], f"{what}.kld"),
            top1_agreement=_number(d["top1_agreement"], f"{what}.top1_agreement"),
            ci95=Interval95.from_json(d["ci95"], f"{what}.ci95"),
        )

    @classmethod
    def from_figures(cls, b: dict) -> "PositionBucket":
        """A bucket of accuracy_stats.position_buckets: its range and its figures (figures_of)."""
        return cls(lo=b["lo"], hi=b["hi"], **figures_of(b))

    @property
    def label(self) -> str:
        return f"{self.lo}–{self.hi}"


# The windows' own keys; every other key of `windows` is the text source's provenance (data/text.py:
# source, sha256, bytes, set, ...), which differs from one kind of source to another.
WINDOW_KEYS = ("seq_len", "count", "requested", "window_starts")


@dataclass(frozen=True)
class WindowsInfo:
    """The windows a text was scored on, and where they came from. JSON: one flat object (the
    text's provenance beside the window keys, as scripts have read `windows.source`)."""

    seq_len: int
    count: int
    requested: int
    window_starts: tuple[int, ...]
    provenance: dict = field(default_factory=dict)  # the text's: source, sha256, region, split, token_range, ...

    def to_json(self) -> dict:
        return {
            **self.provenance,
            "seq_len": self.seq_len,
            "count": self.count,
            "requested": self.requested,
            "window_starts": list(self.window_starts),
        }

    @classmethod
    def from_json(cls, data, what: str = "windows") -> "WindowsInfo":
        if not isinstance(data, dict):
            raise RecordError(f"{what}: expected a JSON object, not {type(data).__name__}")
        missing = [k for k in WINDOW_KEYS if k not in data]
        if missing:
            raise RecordError(f"{what}: missing key {missing[0]!r}")
        return cls(
            seq_len=_integer(data["seq_len"], f"{what}.seq_len"),
            count=_integer(data["count"], f"{what}.count"),
            requested=_integer(data["requested"], f"{what}.requested"),
            window_starts=tuple(_integer(s, f"{what}.window_starts") for s in data["window_starts"]),
            provenance={k: v for k, v in data.items() if k not in WINDOW_KEYS},
        )

    def get(self, key: str, default=None):
        """A provenance key (region, split, token_range, source, ...), or a window key."""
        if key in WINDOW_KEYS:
            return getattr(self, key)
        return self.provenance.get(key, default)

    @property
    def region(self) -> str:
        """The region of the text the windows were drawn from ('' where the source records none)."""
        return self.provenance.get("region", "")

    @property
    def split(self) -> str:
        """The part of the region scored: 'all', 'selection' or 'confirmation'."""
        return self.provenance.get("split", "all")

    @property
    def token_range(self) -> list[int] | None:
        """The [first, last) tokens of the part scored, where a split was asked for."""
        return self.provenance.get("token_range")


@dataclass(frozen=True)
class TextResult:
    """One text domain's figures: the model under test against the baseline on its windows."""

    label: str
    text: str  # the SPEC
    ppl: float
    baseline_ppl: float
    delta_ppl_pct: float
    kld: KLSummary
    kl_kind: str  # KL_EXACT, or topk_kind(k): a lower bound
    top1_agreement: float
    ci95: Interval95
    tokens: int
    positions: tuple[PositionBucket, ...]  # by position within the window (stats.position_buckets)
    score_seconds: float
    baseline_cached: bool
    windows: WindowsInfo
    overlap_check: dict  # evals/checks.py's record of the texts the model was fitted on

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "positions":
                v = [b.to_json() for b in v]
            elif hasattr(v, "to_json"):
                v = v.to_json()
            out[f.name] = v
        return out

    @classmethod
    def from_json(cls, data, what: str = "texts[]") -> "TextResult":
        d = checked(cls, data, what)
        if not isinstance(d["positions"], list):
            raise RecordError(f"{what}.positions: expected a list")
        rules = {
            "label": TEXT,
            "text": TEXT,
            "score_seconds": NONNEG,
            "windows": OBJECT,
            "overlap_check": OBJECT_OR_NONE,
        }
        check_values(d, FIGURES | rules, what)
        return cls(
            label=str(d["label"]),
            text=str(d["text"]),
            ppl=_number(d["ppl"], f"{what}.ppl"),
            baseline_ppl=_number(d["baseline_ppl"], f"{what}.baseline_ppl"),
            delta_ppl_pct=_number(d["delta_ppl_pct"], f"{what}.delta_ppl_pct"),
            kld=KLSummary.from_json(d["kld"], f"{what}.kld"),
            kl_kind=check_kl_kind(d["kl_kind"], what),
            top1_agreement=_number(d["top1_agreement"], f"{what}.top1_agreement"),
            ci95=Interval95.from_json(d["ci95"], f"{what}.ci95"),
            tokens=_integer(d["tokens"], f"{what}.tokens"),
            positions=tuple(PositionBucket.from_json(b, f"{what}.positions[]") for b in d["positions"]),
            score_seconds=_number(d["score_seconds"], f"{what}.score_seconds"),
            baseline_cached=bool(d["baseline_cached"]),
            windows=WindowsInfo.from_json(d["windows"], f"{what}.windows"),
            overlap_check=dict(d["overlap_check"] or {}),
        )


@dataclass(frozen=True)
class TaskDelta:
    """An lm-eval task's score and its paired delta against the baseline (evals/lmeval.py)."""

    metric: str
    value: float
    stderr: float | None
    baseline: float
    baseline_stderr: float | None
    delta: float
    delta_stderr: float | None
    n: int
    delta_stderr_kind: str

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data, what: str = "tasks[]") -> "TaskDelta":
        return cls(**checked(cls, data, what))


# The first text's keys that the one-text format keeps at the top level of an EvalResult's JSON
# (scripts written for one text read `ppl`, `kld.mean`, `windows` there).
PRIMARY_KEYS = tuple(f.name for f in fields(TextResult) if f.name not in ("label", "text"))


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: the model under test against its baseline on every text, and its tasks."""

    model: str
    baseline: str
    engine: str  # the scorer of the model under test (evals/scorers)
    baseline_engine: str
    split: str
    dtype: str
    device: dict  # device.describe
    baseline_check: dict  # evals/checks.py: the baseline is the model's source
    kl_kind: str | None  # the texts' KL kind (None without texts)
    texts: tuple[TextResult, ...]
    tasks: dict  # task name -> TaskDelta
    tasks_backend: str | None
    scorer: dict | None  # what scored the model (the scorer's describe()); None without texts
    primary_text: str | None  # the first text's label: its figures are the top-level ones
    seconds: float
    world_size: int = 1
    kind: str = field(default=KIND, init=False)
    schema_version: int = field(default=SCHEMA_VERSION, init=False)

    @property
    def device_id(self) -> str | None:
        """The torch device it ran on, as device.describe recorded it ('cuda:0'); None where not recorded."""
        return self.device.get("device")

    @property
    def device_name(self) -> str | None:
        """That device's name ('NVIDIA H100 80GB HBM3'); None where not recorded."""
        return self.device.get("name")

    @property
    def device_label(self) -> str:
        """Where it ran: 'cuda:0 (NVIDIA H100 80GB HBM3)'."""
        return f"{self.device_id} ({self.device_name})"

    @property
    def primary(self) -> TextResult | None:
        return self.texts[0] if self.texts else None

    def text(self, label: str) -> TextResult:
        return next(t for t in self.texts if t.label == label)

    def to_json(self) -> dict:
        out = {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "model": self.model,
            "baseline": self.baseline,
            "engine": self.engine,
            "baseline_engine": self.baseline_engine,
            "split": self.split,
            "dtype": self.dtype,
            "device": self.device,
            "baseline_check": self.baseline_check,
            "kl_kind": self.kl_kind,
            "texts": [t.to_json() for t in self.texts],
            "tasks": {n: t.to_json() for n, t in self.tasks.items()},
            "tasks_backend": self.tasks_backend,
            "scorer": self.scorer,
            "primary_text": self.primary_text,
            "seconds": self.seconds,
            "world_size": self.world_size,
        }
        if self.texts:
            first = self.texts[0].to_json()
            out.update({k: first[k] for k in PRIMARY_KEYS})
        return out

    @classmethod
    def from_json(cls, data, what: str = "eval result") -> "EvalResult":
        if not isinstance(data, dict):
            raise RecordError(f"{what}: expected a JSON object, not {type(data).__name__}")
        version = data.get("schema_version", 1 if "kind" not in data else None)
        if version not in READS:
            raise RecordError(f"{what} of schema {version!r}: this quantkit reads {', '.join(map(str, READS))}")
        if version == 1:
            data = migrate_v1(data)
        if data.get("kind") != KIND:
            raise RecordError(f"{what}: kind {data.get('kind')!r}, not {KIND!r}")
        body = data
        if data.get("texts"):  # the one-text copies of the first text: derived, not read
            body = {k: v for k, v in data.items() if k not in PRIMARY_KEYS or k == "kl_kind"}
        d = checked(cls, body, what)
        if not isinstance(d["texts"], list) or not isinstance(d["tasks"], dict):
            raise RecordError(f"{what}: texts must be a list and tasks an object")
        names = ("model", "baseline", "engine", "baseline_engine", "split", "dtype")
        rules = dict.fromkeys(names, TEXT) | {
            "device": OBJECT_OR_NONE,
            "baseline_check": OBJECT_OR_NONE,
            "seconds": NONNEG,
        }
        rules |= {"tasks_backend": TEXT_OR_NONE, "scorer": OBJECT_OR_NONE, "primary_text": TEXT_OR_NONE}
        check_values(d, rules | {"world_size": Whole(1)}, what)
        return cls(
            model=str(d["model"]),
            baseline=str(d["baseline"]),
            engine=str(d["engine"]),
            baseline_engine=str(d["baseline_engine"]),
            split=str(d["split"]),
            dtype=str(d["dtype"]),
            device=dict(d["device"] or {}),
            baseline_check=dict(d["baseline_check"] or {}),
            kl_kind=None if d["kl_kind"] is None else check_kl_kind(d["kl_kind"], what),
            texts=tuple(TextResult.from_json(t, f"{what}: texts[{i}]") for i, t in enumerate(d["texts"])),
            tasks={str(n): TaskDelta.from_json(t, f"{what}: tasks.{n}") for n, t in d["tasks"].items()},
            tasks_backend=d["tasks_backend"],
            scorer=d["scorer"],
            primary_text=d["primary_text"],
            seconds=_number(d["seconds"], f"{what}.seconds"),
            world_size=_integer(d["world_size"], f"{what}.world_size"),
        )


# --------------------------------------------------------------------------- schema 1


def _v1_kind(method) -> str:
    """Schema 1's `kl_method` sentence as a KL kind: the baseline against itself is exact (0 by
    construction); every other schema-1 KL was the top-256 bound."""
    if isinstance(method, str) and method.startswith("identical checkpoint"):
        return KL_EXACT
    m = re.match(r"top-(\d+)", method or "")
    return topk_kind(int(m.group(1)) if m else 256)


def _v1_text(t: dict) -> dict:
    if not isinstance(t, dict):
        return t
    out = {k: v for k, v in t.items() if k != "kl_method"}
    out["kl_kind"] = _v1_kind(t.get("kl_method"))
    out.setdefault("positions", [])
    w = out.get("windows")
    if isinstance(w, dict) and "requested" not in w:
        out["windows"] = {**w, "requested": w.get("count")}
    return out


def migrate_v1(data: dict) -> dict:
    """A schema-1 result (no `kind`, no `schema_version`) as schema 2 holds it. Schema 2 added
    `kl_kind` (schema 1's KL was the top-256 bound, or exact zero for a checkpoint against itself,
    said in `kl_method`), `positions` per text (none in schema 1), and always writes `scorer`,
    `tasks_backend`, `primary_text` and `world_size`. The oldest one-text results (figures at the
    top level, no `texts`) become a one-text list."""

    data = dict(data)
    texts = data.get("texts")
    if texts is None and "ppl" in data:
        texts = [{"label": data.get("primary_text") or "text", "text": data.get("text", "?"), **data}]
        texts[0].pop("primary_text", None)
    texts = [_v1_text(t) for t in texts or []]
    top = {k: v for k, v in data.items() if k not in PRIMARY_KEYS and k not in ("kl_method", "text")}
    kinds = {t.get("kl_kind") for t in texts if isinstance(t, dict)}
    return {
        # results from before eval engines, splits and devices were recorded: transformers scored
        # both models, on the whole region, and what ran where was not kept
        "engine": "transformers",
        "baseline_engine": "transformers",
        "split": "all",
        "dtype": "unknown",
        "device": {},
        "baseline_check": {},
        "scorer": None,
        "tasks_backend": None,
        "primary_text": texts[0].get("label") if texts and isinstance(texts[0], dict) else None,
        "world_size": 1,
        "tasks": {},
        **top,
        "texts": texts,
        "kl_kind": KL_EXACT if kinds == {KL_EXACT} else (topk_kind(256) if kinds else None),
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
    }
