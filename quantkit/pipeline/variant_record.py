"""What `quantkit run` holds of one variant, as one typed record: filled by the runner step by step
(pipeline/run.py: convert, eval, export, bench), read by the report, the front and the serving
steps as attributes, and written whole in report.json's `variants` (one JSON form, read back by
`from_json`: the variant's own keys as every report schema wrote them, its eval results through
EvalResult's migration, its bench rows as this quantkit writes them).

A variant's GGUF is held once: the llama-quantize record of a `gguf:` variant (`gguf_variant`) or
its `gguf` export (`exports["gguf"]`); `gguf` is whichever it has (what the llama.cpp engines
bench). Reports of schema 4 and older also wrote it under its own `gguf` key, and schema 3 and
older a failed GGUF export as `gguf_error`: both are read into the fields that hold them now.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantkit.bench.bench_records import BenchRow
from quantkit.core.eval_results import EvalResult
from quantkit.core.record_checks import RecordError
from quantkit.export.gguf_kept import GgufKept

# the keys report.json's variants have held, by what each schema added (pipeline/report.py)
KEYS = frozenset(
    (
        "name description steps artifact eval evals eval_errors gguf gguf_variant gguf_error exports "
        "export_errors bench benches bench_errors error traceback"
    ).split()
)


@dataclass
class VariantRecord:
    """One variant of a run: what was made of it, its results, and what failed."""

    name: str
    description: str | None = None
    steps: tuple[dict, ...] = ()  # the recipe's steps of the variant, as the recipe writes them
    artifact: str | None = None  # the converted artifact's directory
    eval: EvalResult | None = None  # the first of eval.engines' result: the main row and the model card
    evals: dict[str, EvalResult] = field(default_factory=dict)  # each further engine's
    eval_errors: dict[str, str] = field(default_factory=dict)  # engine -> why its eval failed
    gguf_variant: dict | None = None  # a `gguf:` variant's llama-quantize record (serving.quantize_gguf)
    exports: dict[str, dict] = field(default_factory=dict)  # format -> what the run keeps of its export record
    export_errors: dict[str, str] = field(default_factory=dict)  # format -> why its export failed
    bench: BenchRow | None = None  # the first engine's row (model cards and single-engine readers)
    benches: dict[str, BenchRow] = field(default_factory=dict)  # engine -> its row
    bench_errors: dict[str, str] = field(default_factory=dict)  # engine -> why it could not bench the variant
    error: str | None = None  # why the variant failed
    traceback: str | None = None  # where a fault (not a user error) came from

    @property
    def gguf(self) -> GgufKept | None:
        """The variant's GGUF: llama-quantize's for a `gguf:` variant, else its `gguf` export's."""
        kept = self.gguf_variant if self.gguf_variant is not None else self.exports.get("gguf")
        return GgufKept.from_json(kept, f"{self.name}'s GGUF") if kept is not None else None

    def evaluations(self) -> list[EvalResult]:
        """Its eval results: the first engine's, then each further one's."""
        return [ev for ev in (self.eval, *self.evals.values()) if ev is not None]

    def failed(self, why: str, trace: str | None = None) -> None:
        self.error, self.traceback = why, trace

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "steps": list(self.steps),
            "artifact": self.artifact,
            "eval": self.eval.to_json() if self.eval is not None else None,
            "evals": {e: r.to_json() for e, r in self.evals.items()},
            "eval_errors": dict(self.eval_errors),
            "gguf_variant": self.gguf_variant,
            "exports": dict(self.exports),
            "export_errors": dict(self.export_errors),
            "bench": self.bench.to_json() if self.bench is not None else None,
            "benches": {e: r.to_json() for e, r in self.benches.items()},
            "bench_errors": dict(self.bench_errors),
            "error": self.error,
            "traceback": self.traceback,
        }

    @classmethod
    def from_json(cls, d: dict, where: str = "variant") -> VariantRecord:
        """A variant as any report schema wrote it; an unknown key is one line naming it."""
        if not isinstance(d, dict):
            raise RecordError(f"{where}: expected a JSON object, not {type(d).__name__}")
        unknown = sorted(set(d) - KEYS)
        if unknown:
            raise RecordError(f"{where}: unknown key {unknown[0]!r} in a run's variant")
        if not isinstance(d.get("name"), str):
            raise RecordError(f"{where}: a variant's name is text")
        exports = dict(d.get("exports") or {})
        if d.get("gguf") is not None and d.get("gguf_variant") is None:
            exports.setdefault("gguf", d["gguf"])  # schema 3 and older: the gguf export under its own key
        errors = dict(d.get("export_errors") or {})
        if d.get("gguf_error"):
            errors.setdefault("gguf", d["gguf_error"])
        return cls(
            name=d["name"],
            description=d.get("description"),
            steps=tuple(d.get("steps") or ()),
            artifact=d.get("artifact"),
            eval=EvalResult.from_json(d["eval"], f"{where}.eval") if d.get("eval") else None,
            evals={e: EvalResult.from_json(r, f"{where}.evals.{e}") for e, r in (d.get("evals") or {}).items()},
            eval_errors=dict(d.get("eval_errors") or {}),
            gguf_variant=d.get("gguf_variant"),
            exports=exports,
            export_errors=errors,
            bench=BenchRow.from_json(d["bench"]) if d.get("bench") else None,
            benches={e: BenchRow.from_json(r) for e, r in (d.get("benches") or {}).items()},
            bench_errors=dict(d.get("bench_errors") or {}),
            error=d.get("error"),
            traceback=d.get("traceback"),
        )
