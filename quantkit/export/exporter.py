"""What an exporter is: one serving format an artifact is written in (`quantkit export ARTIFACT
--format F`, a recipe's `export: {formats: [F]}`), with what it takes stated as data.

An exporter says, for each scheme an artifact may hold (models/scheme_facts.py), whether it writes
it exactly, lossily, or refuses it, and why (`takes`); checks its settings before anything is read
(`check`); names its output (`out_name`); writes it and returns its record (`export`: a typed
record, ExportRecord, holding at least `sha256` and `bytes` of what it wrote, which
`quantkit run` reuses it by); says what of the record a run keeps (`kept`, JSON); and puts the
record in a few lines for the terminal (`summary`). The registry is export/export_registry.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from quantkit.core.option_fields import FLAG, bound_error, option
from quantkit.data.sources import syntaxes
from quantkit.errors import QuantkitError
from quantkit.gguf.llama_quantize import DEFAULT_CALIB
from quantkit.models.scheme_facts import SchemeFacts

EXACT, LOSSY, REFUSED = "exact", "lossy", "refused"
_RANK = {EXACT: 0, LOSSY: 1, REFUSED: 2}


@dataclass(frozen=True)
class Verdict:
    """What an exporter does with a scheme: exact, lossy or refused, and why in a few words."""

    kind: str  # EXACT | LOSSY | REFUSED
    reason: str


def judge(verdicts) -> Verdict:
    """An artifact's verdict from its schemes' verdicts: the worst kind, with each reason for it once."""
    verdicts = list(verdicts)
    worst = max((v.kind for v in verdicts), key=_RANK.__getitem__)
    return Verdict(worst, "; ".join(dict.fromkeys(v.reason for v in verdicts if v.kind == worst)))


@dataclass(frozen=True)
class ExportSettings:
    """Everything an export was asked, in one record: `quantkit export`'s options (made from these
    fields, cli/_options.py), or what a run's recipe gives (its `gguf:` variants' type, its
    calibration). An exporter reads the fields it uses and refuses in `check` the ones that do not
    apply to it."""

    embeddings: str = option(
        "keep",
        help="token_embd/output: keep their 16 bits, or Q8_0 (lossy; its KL is measured).",
        choices=("keep", "q8_0"),
    )
    allow_lossy: bool = option(
        False,
        help="Map grids GGUF cannot hold exactly (group sizes not a multiple of 32, permuted act-order groups, "
        "scales that are not fp16 values) with ggml's rounding, and report the KL instead of refusing.",
        cli=FLAG,
    )
    kl_text: str | None = option(
        None,
        help=f"Text for a lossy export's KL ({' | '.join(syntaxes(parts=False, generated=False))}; the first four "
        "128-token windows of its first half; default: seeded random token ids).",
        metavar="SPEC",
    )
    # llama-quantize's type (selects the K-quant exporter)
    qtype: str | None = option(
        None,
        help="llama.cpp's own quantization of a 16-bit checkpoint (Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, Q4_0, ...): the "
        "exact F16 GGUF, an importance matrix from --calib's windows (llama-imatrix), then llama-quantize. "
        "Needs llama.cpp's tools (QUANTKIT_WITH_LLAMA_TOOLS=1 ./scripts/_install.sh).",
        flag="--type",
        metavar="TYPE",
    )
    calib: str = option(
        DEFAULT_CALIB,
        help="With --type: the calibration text whose windows make the importance matrix (as convert's --calib).",
        metavar="SPEC",
    )
    samples: int = option(128, help="With --type: windows.", flag="--calib-samples", ge=1)
    seq_len: int = option(512, help="With --type: tokens per window.", flag="--calib-seq-len", ge=8)
    # what a run's recipe gives (its calibration): no option of `quantkit export`
    seed: int = option(0, cli=None)
    region: str = option("second-half", cli=None)
    imatrix: bool = option(True, cli=None)
    # --mixed: the types a weight may take, comma-separated; None: llama-quantize's mix (the command
    # reads --mixed and --mixed-types into it)
    mixed: str | None = option(None, cli=None)
    mixed_gptq: bool = option(True, cli=None)  # each weight's codes by GPTQ within the block scales (--mixed-rounding)
    force: bool = option(
        False, help="Replace an existing --out and its record, only when quantkit export wrote them.", cli=FLAG
    )

    def __post_init__(self) -> None:
        error = bound_error(self)
        if error:
            raise QuantkitError(error)


class ExportRecord(Protocol):
    """What every exporter's record holds (theirs: export/export_records.py, the GGUF exporters'
    gguf/gguf_records.py): the hash and size of what it wrote, which `quantkit run` reuses the
    output by, and its one JSON form."""

    sha256: str
    bytes: int

    def to_json(self) -> dict: ...


class Exporter:
    """One serving format. Subclasses set the attributes and implement the methods."""

    name: str  # the registry key
    format: str  # what `--format` and a recipe's export.formats call it
    writes: str  # what it writes, in words (the docs table)
    directory: bool = False  # writes a directory (else one file, with whatever record it keeps beside it)
    selected_by: str | None = None  # the ExportSettings field that, when set, picks this exporter for its format

    def takes(self, facts: SchemeFacts) -> Verdict:
        raise NotImplementedError

    def check(self, settings: ExportSettings) -> None:
        """QuantkitError (one line) for a setting that does not apply, before anything is read."""

    def out_name(self, stem: str, settings: ExportSettings) -> str:
        """The output's file (or directory) name for an artifact named `stem`."""
        raise NotImplementedError

    def export(self, artifact: Path, out: Path | None, settings: ExportSettings) -> ExportRecord:
        """Write `out` (None: `out_name` beside the artifact); returns the record."""
        raise NotImplementedError

    def kept(self, record: ExportRecord) -> dict:
        """What a run keeps of the record in its variant's record (and its step cache), as JSON: at
        least what it reuses the output by."""
        return {"sha256": record.sha256, "bytes": record.bytes}

    def summary(self, record: ExportRecord) -> list[str]:
        """The record as the terminal shows it."""
        return [f"wrote --format {self.format} ({record.bytes / 1e6:.1f} MB, sha256 {record.sha256[:12]})"]
