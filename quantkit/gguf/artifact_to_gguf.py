"""`export_gguf`: a quantkit artifact (compressed-tensors INT4/INT8, MXFP4, NVFP4, or a dense 16-bit
checkpoint) -> one GGUF file for llama.cpp, plus a `NAME.quantkit.json` record beside it.

Order: refuse an --out export may not write (target.py) and an artifact whose files differ from its
manifest (integrity.check, as publish does), before anything is written; take the lock and check
--out again; refuse what cannot be exported, plan every tensor, write and check each, read the
table back, hash, and rename the file and its record into place together. A lossy export (only
with --allow-lossy or --embeddings q8_0) also measures its KL against the artifact.

The GGUF carries its origin: `quantkit.source.sha256` is the checkpoint the artifact was converted
from (what eval's --baseline must be), `quantkit.artifact.sha256` the artifact's own hash, and
`quantkit.provenance` what eval's overlap check reads (the texts the artifact was fitted on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import gguf

from quantkit import __version__
from quantkit.artifacts.staging import read_meta
from quantkit.core import integrity
from quantkit.core.atomic import exclusive, sigterm_as_interrupt
from quantkit.core.integrity import sha256_file as _sha256
from quantkit.errors import ModelError, QuantkitError
from quantkit.gguf import gguf_arch, target, tensor_map
from quantkit.gguf.artifact import Artifact, quant_method
from quantkit.gguf.artifact_provenance import converted_path, described, export_origin
from quantkit.gguf.fidelity import logits_kl
from quantkit.gguf.gguf_records import ConvertedFrom, ExportedFrom, GgufRecord, KlCheck, MappingLine, Verification
from quantkit.gguf.read import Origin
from quantkit.gguf.target import record_path
from quantkit.gguf.write import Written, staged_file, write
from quantkit.models.checkpoint import checkpoint_hash


@dataclass(frozen=True)
class GgufOptions:
    embeddings: str = "keep"  # keep | q8_0
    allow_lossy: bool = False
    force: bool = False
    kl_text: str | None = None  # text SPEC for a lossy export's KL (default: seeded random ids)


def default_out(artifact: Path) -> Path:
    artifact = Path(artifact).resolve()
    return artifact.parent / f"{artifact.name}.gguf"


def _check_artifact(art: Artifact) -> None:
    method = quant_method(art)
    if method not in (None, "compressed-tensors"):
        raise ModelError(
            f"{art.path}: a {method} artifact (its 4/8-bit formats have no exact GGUF grid); export "
            "the 16-bit checkpoint, or convert it with an INT4/INT8 recipe (compressed-tensors) first"
        )
    q = art.quant or {}
    for key, what in (("sparsity_config", "sparse weights"),):
        if q.get(key):
            raise ModelError(f"{art.path}: the artifact uses {what} ({key}), which llama.cpp would not apply")
    online = online_transforms(q.get("transform_config"))
    if online:
        raise ModelError(
            f"{art.path}: the artifact rotates activations at run time ({', '.join(online)} in transform_config), "
            "which llama.cpp would not apply"
        )
    if method and not art.quantized_modules():
        raise ModelError(f"{art.path}: the config says compressed-tensors but no tensor is quantized")
    if not method and art.quantized_modules():
        raise ModelError(f"{art.path}: quantized tensors (weight_packed/weight_scale) without a quantization_config")


FUSED_LOCATIONS = (
    "weight_input",
    "weight_output",
)  # compressed-tensors' offline locations: multiplied into the weights


def _fused_note(q: dict) -> list[str]:
    groups = (q.get("transform_config") or {}).get("config_groups") or {}
    return (
        [
            f"rotations {', '.join(groups)} are fused into the weights "
            "(transform_config: weight_input/weight_output only); "
            "llama.cpp runs them as a plain model"
        ]
        if groups
        else []
    )


def _kv_cache_note(q: dict) -> list[str]:
    """An FP8 KV cache scheme is the serving engine's, not the weights': the GGUF holds the weights
    alone, and llama.cpp quantizes its cache by its own types at run time (core/kv_cache.py)."""
    if not q.get("kv_cache_scheme"):
        return []
    return [
        "the checkpoint's FP8 K/V scales (kv_cache_scheme) are not in the GGUF: llama.cpp has no FP8 cache and "
        "quantizes K and V by its own cache types at run time (-ctk/-ctv; quantkit --kv-cache q8_0)"
    ]


def online_transforms(transform_config) -> list[str]:
    """The transforms of a compressed-tensors `transform_config` that act at run time: any location
    but weight_input/weight_output (SpinQuant's R1/R2 as quantkit's recipes apply them are fused
    into the saved weights, so the checkpoint computes the rotated model without them; R3/R4 and
    QuIP's input rotations are not). Empty when nothing runs online."""
    if not transform_config:
        return []
    groups = transform_config.get("config_groups") if isinstance(transform_config, dict) else None
    if not isinstance(groups, dict):
        return ["an unreadable transform_config"]
    found = []
    for name, scheme in groups.items():
        applies = scheme.get("apply") if isinstance(scheme, dict) else None
        if not isinstance(applies, list) or not applies:
            found.append(f"{name} (no locations)")
            continue
        found += [
            f"{name} at {a.get('location')}"
            for a in applies
            if not isinstance(a, dict) or a.get("location") not in FUSED_LOCATIONS
        ]
    return found


def export_gguf(artifact: Path, out: Path | None = None, opts: GgufOptions = GgufOptions()) -> GgufRecord:
    """Export `artifact` to `out` (default: ARTIFACT.gguf beside it); returns the record written beside it."""
    if opts.embeddings not in tensor_map.EMBEDDING_TYPES:
        raise QuantkitError(f"--embeddings {opts.embeddings}: use one of {', '.join(tensor_map.EMBEDDING_TYPES)}")
    with sigterm_as_interrupt():  # `kill` unwinds like Ctrl-C: the temp files and the lock go, --out stays as it was
        return _export(Path(artifact), opts, Path(out) if out is not None else default_out(artifact))


def _export(artifact: Path, opts: GgufOptions, out: Path) -> GgufRecord:
    t0 = time.perf_counter()
    if artifact.is_file() and _head(artifact) == b"GGUF":
        raise QuantkitError(f"{artifact} is already a GGUF file; export takes a quantkit artifact directory")
    meta = read_meta(artifact) if artifact.is_dir() else {}
    target.check(out, artifact, meta, opts.force, opts.kl_text)
    if meta:  # the bytes are those `quantkit convert` recorded, checked as publish checks them
        integrity.check(artifact, meta, deep=True)
    target.make_parent(out)
    with exclusive(out, what=str(out)), Artifact(artifact) as art:
        target.check(
            out, artifact, meta, opts.force, opts.kl_text
        )  # again under the lock: another export may have written it
        _check_artifact(art)
        hp = gguf_arch.hparams(art.path, art.config)
        plans = tensor_map.make_plan(art, hp, embeddings=opts.embeddings, allow_lossy=opts.allow_lossy)
        origin = export_origin(meta, checkpoint_hash(art.path))
        try:
            with staged_file(out, record_path(out)) as stage:
                written = write(stage.path, art, hp, plans, origin)
                kl = None if all(p.exact for p in plans) else logits_kl(art.path, stage.path, plans, hp, opts.kl_text)
                record = _record(art, hp, plans, written, origin, kl, staged=stage.path, out=out, t0=t0)
                stage.record = record.to_json()
        except OSError as exc:  # a full disk, a read-only directory: the temp files are gone, --out untouched
            raise QuantkitError(
                f"{out}: cannot write the GGUF ({exc.strerror or type(exc).__name__}); nothing was written"
            ) from None
    return record


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(4)


def _record(
    art: Artifact,
    hp: gguf_arch.Hparams,
    plans: list,
    written: Written,
    origin: Origin,
    kl: KlCheck | None,
    *,
    staged: Path,
    out: Path,
    t0: float,
) -> GgufRecord:
    """The record of the GGUF written at `staged`, to be renamed to `out`; its wall time since `t0`."""
    checks = written.checks
    lossy = [{"tensor": p.name, "source": p.source, "reason": p.reason, **checks[p.name]} for p in plans if not p.exact]
    info = written.vocab
    return GgufRecord(
        gguf=str(out.resolve()),
        sha256=_sha256(staged),
        bytes=staged.stat().st_size,
        source=ExportedFrom(str(art.path.resolve()), origin.artifact_sha256, *described(art.meta)),
        origin=ConvertedFrom(origin.source_sha256, converted_path(origin) or str(art.path.resolve())),
        architecture=hp.spec.gguf_arch.lower(),
        model_type=hp.model_type,
        lossless=not lossy,
        mapping=tuple(MappingLine(**m) for m in tensor_map.mapping_summary(plans)),
        tensor_types={t: sum(1 for p in plans if p.qtype == t) for t in sorted({p.qtype for p in plans})},
        tensors=tuple(
            {"name": p.name, "source": p.source, "type": p.qtype, "exact": p.exact, "rope_permuted_heads": p.permute}
            for p in plans
        ),
        verification=_verification(plans, checks),
        lossy_tensors=tuple(lossy),
        extra_tensors=tuple(written.extra_tensors),
        vocab={
            "model": info.model,
            "pre": info.pre,
            "tokens": info.n_tokens,
            "padding_tokens": info.n_padded,
            "special_ids": info.special,
            "add_bos": info.add_bos,
            "add_eos": info.add_eos,
        },
        notes=tuple(list(hp.notes) + _fused_note(art.quant or {}) + _kv_cache_note(art.quant or {})),
        tool_versions={"quantkit": __version__, "gguf": _version("gguf")},
        gguf_quant_version=gguf.GGML_QUANT_VERSION,
        kl_vs_artifact=kl,
        wall_seconds=time.perf_counter() - t0,
    )


def _verification(plans: list, checks: dict) -> Verification:
    return Verification(
        method="every tensor dequantized with gguf.quants.dequantize and compared with the artifact's float32 "
        "weight (q - z) * s, or for FP4 q * s (/ g, NVFP4's global scale applied as llama.cpp's F32 .scale) "
        "(q/k rows in llama.cpp's order) before it was written",
        tensors=len(plans),
        exact_tensors=sum(1 for p in plans if p.exact),
        max_abs_diff_exact=max((checks[p.name]["max_abs_diff"] for p in plans if p.exact), default=0.0),
    )


def _version(pkg: str) -> str | None:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return None
