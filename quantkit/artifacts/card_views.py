"""What a model card shows of an artifact's quantkit.json, read once into records: the bench row
that bench or run stored in `results.bench` (a BenchRow's JSON, bench/bench_records.py), the
calibration manifest (data/calib.py) and the auto mixed-precision record (quantize/auto.py).

Each is the card's view: the fields it shows, taken from the stored JSON where it is read, a
missing one None (an artifact written by an older quantkit), a value of the wrong kind one line
(RecordError) naming the section. The card then reads attributes, never the stored JSON by key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from quantkit.core.record_checks import RecordError


def _pick(cls, data, what: str) -> dict:
    """The fields of `cls` from `data` (a JSON object), None where absent."""
    if not isinstance(data, dict):
        raise RecordError(f"quantkit.json {what}: expected a JSON object, not {type(data).__name__}")
    return {f.name: data.get(f.name) for f in fields(cls)}


@dataclass(frozen=True)
class BenchFigures:
    """A stored bench row as the card shows it: the prompt, device and engine, TTFT, TPOT beside
    the roofline's, bytes read per token and the kernel."""

    prompt_len: int | None = None
    device: str | None = None
    engine: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    predicted_tpot_ms: float | None = None
    bytes_per_token: float | None = None
    kernel: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data) -> BenchFigures:
        return cls(**_pick(cls, data, "results.bench"))


@dataclass(frozen=True)
class CalibrationFigures:
    """The calibration manifest as the card shows it: its text (the manifest's `source`), samples x
    seq_len, seed, the share of duplicate windows, and a mix's samples per domain and the parts it
    left out."""

    text: str | None = None
    samples: int | None = None
    seq_len: int | None = None
    seed: int | None = None
    duplicate_fraction: float | None = None
    domains: dict | None = None
    left_out: list | None = None

    def to_json(self) -> dict:
        return {"source": self.text, **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "text"}}

    @classmethod
    def from_json(cls, data) -> CalibrationFigures:
        d = _pick(cls, data, "calibration")
        d["text"] = data.get("source")
        if d["domains"] is not None and not isinstance(d["domains"], dict):
            d["domains"] = None  # a single text's manifest: no samples per domain
        return cls(**d)

    def left_out_names(self) -> list[str]:
        return [str(p.get("name")) for p in self.left_out or [] if isinstance(p, dict)]


@dataclass(frozen=True)
class UnitChoice:
    """One ranked unit of a mixed-precision search: its layer, unit type and the scheme it took."""

    layer: int | None = None
    unit: str | None = None
    chosen: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data) -> UnitChoice:
        return cls(**_pick(cls, data, "mixed_precision.ranking[]"))


@dataclass(frozen=True)
class MixedPrecisionFigures:
    """An auto mixed-precision record as the card shows it: the base scheme and the choices, the
    budget and the bits stored (measured from the artifact where checked), how many units were
    raised, each unit's choice, and the windows and text it was chosen on."""

    base: str | None
    choices: tuple[str, ...]
    budget_bits: float | None
    bits_per_weight: float | None
    raised: int
    ranking: tuple[UnitChoice, ...]
    windows_used: int | None
    windows_seq_len: int | None
    text_source: str | None

    def to_json(self) -> dict:
        return {**asdict(self), "choices": list(self.choices), "ranking": [u.to_json() for u in self.ranking]}

    @classmethod
    def from_json(cls, data) -> MixedPrecisionFigures:
        if not isinstance(data, dict):
            raise RecordError(f"quantkit.json mixed_precision: expected a JSON object, not {type(data).__name__}")
        windows = data.get("windows") if isinstance(data.get("windows"), dict) else {}
        text = windows.get("text") if isinstance(windows.get("text"), dict) else {}
        measured = data.get("measured_bits_per_weight")
        return cls(
            base=data.get("base"),
            choices=tuple(data.get("choices") or ()),
            budget_bits=data.get("budget_bits"),
            bits_per_weight=measured if measured is not None else data.get("bits_per_weight"),
            raised=len(data.get("picked") or []),
            ranking=tuple(UnitChoice.from_json(r) for r in data.get("ranking") or []),
            windows_used=windows.get("used"),
            windows_seq_len=windows.get("seq_len"),
            text_source=text.get("source"),
        )
