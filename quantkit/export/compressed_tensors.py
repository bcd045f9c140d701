"""`--format compressed-tensors`: the artifact itself, as convert saved it in its container
(artifacts/containers.py), which transformers and vLLM load as it is: its files, checked against the
manifest convert recorded, copied to --out and checked again there before they are renamed into place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from quantkit.artifacts.staging import META, check_out, claim_out, guard_out, read_meta, staged_dir
from quantkit.core import integrity
from quantkit.errors import QuantkitError
from quantkit.export.export_records import CopyRecord
from quantkit.export.exporter import EXACT, REFUSED, Exporter, ExportSettings, Verdict, judge
from quantkit.gguf.target import protected
from quantkit.models.checkpoint import checkpoint_hash
from quantkit.models.scheme_facts import SchemeFacts, of_meta


def takes(facts: SchemeFacts) -> Verdict:
    if facts.weights == "dense":
        return Verdict(EXACT, "the 16-bit checkpoint's own files")
    if facts.container == "compressed-tensors" and facts.known:
        return Verdict(EXACT, "the artifact's own files")
    return Verdict(REFUSED, f"{facts.label}: the artifact is {facts.container}, not compressed-tensors")


class CompressedTensors(Exporter):
    name = "compressed-tensors"
    format = "compressed-tensors"
    writes = "the artifact's own directory (safetensors, config.json, quantkit.json), as convert saved it"
    directory = True

    def takes(self, facts: SchemeFacts) -> Verdict:
        return takes(facts)

    def check(self, settings: ExportSettings) -> None:
        for flag, given in (
            ("--type", settings.qtype),
            ("--mixed", settings.mixed),
            ("--embeddings q8_0", settings.embeddings != "keep"),
            ("--allow-lossy", settings.allow_lossy),
            ("--kl-text", settings.kl_text),
        ):
            if given:
                raise QuantkitError(f"{flag} applies to --format gguf; compressed-tensors is the artifact as it is")

    def out_name(self, stem: str, settings: ExportSettings) -> str:
        return f"{stem}.compressed-tensors"

    def export(self, artifact: Path, out: Path | None, settings: ExportSettings) -> CopyRecord:
        artifact = Path(artifact)
        out = (
            Path(out)
            if out is not None
            else artifact.resolve().parent / self.out_name(artifact.resolve().name, settings)
        )
        meta = read_meta(artifact) if artifact.is_dir() else {}
        verdict = judge(takes(f) for f in of_meta(meta))
        if verdict.kind == REFUSED:
            raise QuantkitError(f"{artifact}: {verdict.reason}")
        files = integrity.check(artifact, meta, deep=True)  # only an artifact convert wrote has a manifest to copy by
        _check_out(out, artifact, meta, settings.force)
        with claim_out(out):
            _check_out(out, artifact, meta, settings.force)  # again under the lock
            with staged_dir(out) as stage:
                for name in [*files, META]:
                    (stage / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(artifact / name, stage / name)
                found = integrity.problems(stage, files, deep=True)
                if found:
                    raise QuantkitError(f"{out}: the copy differs from the artifact's manifest ({found[0]})")
        return CopyRecord(
            format=self.format,
            out=str(out.resolve()),
            artifact=str(artifact.resolve()),
            files=len(files) + 1,
            bytes=sum(os.path.getsize(out / n) for n in [*files, META]),
            sha256=checkpoint_hash(out),
        )

    def kept(self, record: CopyRecord) -> dict:
        return {"out": record.out, "sha256": record.sha256, "bytes": record.bytes, "files": record.files}

    def summary(self, record: CopyRecord) -> list[str]:
        return [f"wrote {record.out} ({record.bytes / 1e6:.1f} MB, {record.files} files, compressed-tensors)"]


def _check_out(out: Path, artifact: Path, meta: dict, force: bool) -> None:
    """--out is a new directory (or, with --force, an artifact quantkit wrote), never the artifact, its
    source checkpoint, or a directory inside either."""
    keep = protected(artifact, meta)
    guard_out(out, keep)
    o = Path(os.path.abspath(out)).resolve()
    inside = next(((p, what) for p, what in keep if p in o.parents), None)
    if inside is not None:
        raise QuantkitError(
            f"--out {out} is inside {inside[1]} ({inside[0]}); export writes beside it, never into it (nothing was "
            "changed)"
        )
    check_out(out, force)
