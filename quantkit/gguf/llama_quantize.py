"""`quantkit export CHECKPOINT --format gguf --type T`: llama.cpp's own quantization (K-quants,
i-quants, the legacy types) with an importance matrix from quantkit's calibration windows.

The way a llama.cpp user makes a GGUF, with quantkit's data: the exact F16 GGUF first (artifact_to_gguf.py),
then llama-imatrix over the text of the calibration windows a convert reads (`--calib`, default
mix:default: the same source, seed, region and window length), then llama-quantize --imatrix. What
each tensor got is read back from the file (a K-quant needs rows that are a multiple of 256 values;
llama-quantize falls back to a 32-block type per tensor where they are not). Everything is made in
a folder beside --out and renamed into place with its record at the end; a failure leaves --out as
it was. A compressed-tensors artifact keeps its exact path (`--type` equal to its grid's GGUF type);
re-quantizing its integer grid with llama.cpp's rounding is refused.

A chooser (quantize/kquant_chooser.py, `--mixed`) may name every decoder-layer weight's type instead of
llama-quantize's mix: it gets the export's folder (`Made`: the F16 file, the importance matrix, and
llama-quantize to run there) and returns the types; once llama-quantize has written them it may
rewrite the tensors' codes in place (their types and sizes unchanged); the file is then checked to
hold exactly those types and to be no larger than the file `--type` alone makes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from quantkit.artifacts.staging import read_meta
from quantkit.core import integrity
from quantkit.core.atomic import exclusive, sigterm_as_interrupt
from quantkit.core.integrity import sha256_file
from quantkit.data import calib, mix
from quantkit.data.text import parse_spec
from quantkit.errors import QuantkitError
from quantkit.gguf import gguf_arch, target, tensor_map, tools
from quantkit.gguf.artifact import Artifact
from quantkit.gguf.artifact_to_gguf import GgufOptions, export_gguf
from quantkit.gguf.gguf_records import GgufRecord, Imatrix, KquantRecord, MappingLine
from quantkit.gguf.target import record_path
from quantkit.gguf.type_report import TypeReport, read_types
from quantkit.gguf.write import staged_file
from quantkit.home import subdir
from quantkit.models.checkpoint import checkpoint_hash, load_model, load_tokenizer
from quantkit.progress import note
from quantkit.recipe.schema import GGUF_TYPES as QUANT_TYPES  # one list: recipes are checked against it

DEFAULT_CALIB = "mix:default"


@dataclass(frozen=True)
class KquantOptions:
    qtype: str
    calib: str = DEFAULT_CALIB
    samples: int = 128  # the recipe defaults (recipe/schema.py CalibrationConfig)
    seq_len: int = 512
    seed: int = 0
    region: str = "second-half"
    force: bool = False
    threads: int | None = None
    imatrix: bool = True  # False: llama-quantize alone (the i-quants below 4 bits refuse to run without one)


def check_type(qtype: str) -> str:
    """The llama-quantize type name, or one line listing the valid ones."""
    name = qtype.upper()
    if name not in QUANT_TYPES:
        raise QuantkitError(
            f"--type {qtype}: not a type quantkit makes with llama-quantize; valid: {', '.join(QUANT_TYPES)}"
        )
    return name


# ---------------------------------------------------------------- what the tensors got (pure)


# ---------------------------------------------------------------- calibration text


def calibration_text(src: Path, o: KquantOptions) -> tuple[str, dict]:
    """The decoded text of the calibration windows a convert with these settings reads, one window
    per paragraph, and their manifest (source, seed, region, the windows)."""

    tok = load_tokenizer(src)
    model = _model_if_needed(src, o.calib, tok)
    cs = calib.build(
        src,
        tok,
        o.calib,
        samples=o.samples,
        seq_len=o.seq_len,
        seed=o.seed,
        region=o.region,
        chat_template=False,
        model=model,
        model_hash=checkpoint_hash(src) if model is not None else "",
    )
    text = "\n\n".join(tok.decode(s[0].tolist(), skip_special_tokens=True) for s in cs.samples)
    return text, cs.manifest


def _model_if_needed(src: Path, spec: str, tok):
    """The 16-bit model, only for text it writes itself (`self`, a mix's chat part)."""

    parsed = parse_spec(spec)
    if parsed.source.generated or (parsed.source.parts and mix.writes_with(parsed.set_name, tok)):
        return load_model(src, dtype="float32", device="cpu")
    return None


# ---------------------------------------------------------------- the export


@dataclass(frozen=True)
class Made:
    """What a chooser of per-tensor types works with: the export's folder, the checkpoint, the F16
    GGUF's record (each tensor's source name and RoPE row permutation), the importance matrix's
    record (None without one) and the options."""

    work: Path
    artifact: Path
    f16: GgufRecord
    imatrix: Imatrix | None
    options: KquantOptions
    qtype: str

    def quantize(self, name: str, qtype: str, *, pure: bool = False, types: dict[str, str] | None = None) -> Path:
        """llama-quantize of the F16 file to `qtype` in the folder (WORK/NAME.gguf), with the importance
        matrix; `pure`: every tensor `qtype` where its rows allow; `types`: these tensors these types."""
        dst = self.work / f"{name}.gguf"
        _quantize(self.work, qtype, self.imatrix, self.options, dst=dst, pure=pure, types=types)
        return dst


class Chooser(Protocol):
    """Names every decoder-layer weight's type (`choose`: {"types": {tensor: ggml type}, ...its record}),
    then may rewrite the file llama-quantize made with those types, each tensor keeping its type and size
    (`refine`: the record, updated)."""

    def choose(self, made: Made) -> dict: ...

    def refine(self, made: Made, path: Path, chosen: dict) -> dict: ...


def export_kquant(
    artifact: Path, out: Path | None, o: KquantOptions, chooser: Chooser | None = None
) -> KquantRecord | GgufRecord:
    """Write `out` (default: ARTIFACT.TYPE.gguf beside the checkpoint) as llama-quantize's `o.qtype`
    with an importance matrix (with `chooser`: the types it names per tensor); returns the record
    written beside it (the exact export's, where a compressed-tensors artifact takes the exact route)."""

    qtype = check_type(o.qtype)
    artifact = Path(artifact)
    out = Path(out) if out is not None else artifact.resolve().parent / f"{artifact.resolve().name}.{qtype}.gguf"
    exact = _exact_route(artifact, qtype)
    if exact is not None:
        if chooser is not None:
            raise QuantkitError(
                f"--mixed: {artifact} is already quantized; give --type --mixed the 16-bit checkpoint it was "
                "converted from"
            )
        return exact(out, o.force)
    for name in ("llama-quantize", "llama-imatrix"):  # before anything is written
        tools.locate(name, f"--type {qtype}")
    with sigterm_as_interrupt():
        _check_target(artifact, out, o.force)
        with exclusive(out, what=str(out)):
            _check_target(artifact, out, o.force)  # again under the lock: another export may have written it
            return _make(artifact, out, o, qtype, chooser)


def _check_target(artifact: Path, out: Path, force: bool) -> None:
    """export's own checks of --out and of the artifact's manifest (target.py), before anything is written."""

    if not artifact.is_dir():
        raise QuantkitError(
            f"{artifact}: not a checkpoint directory; --type quantizes a 16-bit checkpoint (or exports a "
            "compressed-tensors artifact exactly)"
        )
    meta = read_meta(artifact) if artifact.is_dir() else {}
    target.check(out, artifact, meta, force, None)
    if meta:
        integrity.check(artifact, meta, deep=True)
    target.make_parent(out)


def _exact_route(artifact: Path, qtype: str):
    """For a compressed-tensors artifact: the exact export when `qtype` is its grid's GGUF type;
    otherwise one line (llama-quantize would round an already-rounded grid again). None for a
    16-bit checkpoint."""

    if not artifact.is_dir():
        return None
    with Artifact(artifact) as art:
        if not art.quantized_modules():
            return None
        grid = sorted(
            {
                p.qtype
                for p in tensor_map.make_plan(art, gguf_arch.hparams(art.path, art.config))
                if p.source.removesuffix(".weight") in set(art.quantized_modules())
            }
        )
    if grid != [qtype]:
        raise QuantkitError(
            f"--type {qtype}: {artifact} is already quantized ({' + '.join(grid)} exactly); export it without "
            f"--type (or --type {grid[0]}), or give --type the 16-bit checkpoint it was converted from"
        )
    return lambda out, force: export_gguf(artifact, out, GgufOptions(force=force))


def _make(artifact: Path, out: Path, o: KquantOptions, qtype: str, chooser: Chooser | None) -> KquantRecord:
    t0 = time.perf_counter()
    work = out.parent / f".{out.name}.kquant-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        note(f"export --type {qtype}: the exact F16 GGUF")
        f16 = export_gguf(artifact, work / "f16.gguf", GgufOptions())
        imat = None
        if o.imatrix:
            note(f"export --type {qtype}: {o.samples} calibration windows of {o.seq_len} tokens from {o.calib}")
            text, manifest = calibration_text(artifact, o)
            (work / "calib.txt").write_text(text)
            note(f"export --type {qtype}: llama-imatrix over {manifest.get('samples')} windows")
            imat = _imatrix(work, o, manifest, f16.sha256)
        made = Made(work, artifact, f16, imat, o, qtype)
        mixed = chooser.choose(made) if chooser else None
        note(f"export --type {qtype}: llama-quantize")
        _quantize(work, qtype, imat, o, types=mixed and mixed["types"])
        if chooser:
            mixed = chooser.refine(made, work / "out.gguf", mixed)
        with staged_file(out, record_path(out)) as stage:
            os.replace(work / "out.gguf", stage.path)
            record = _record(stage.path, out, qtype, f16, imat, time.perf_counter() - t0, mixed)
            stage.record = record.to_json()
        return record
    except OSError as exc:
        raise QuantkitError(
            f"{out}: cannot write the GGUF ({exc.strerror or type(exc).__name__}); nothing was written"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _threads(o: KquantOptions) -> int:
    return o.threads or tools.available_cores()


def _imatrix(work: Path, o: KquantOptions, manifest: dict, f16_sha256: str) -> Imatrix:
    """llama-imatrix over the calibration text, o.seq_len-token chunks, at most o.samples of them;
    kept in QUANTKIT_HOME/imatrix by what it depends on (the F16 file, the text, the chunks, the
    tools' build), so exporting a second type of the same checkpoint reuses it."""

    t0 = time.perf_counter()
    text_sha = hashlib.sha256((work / "calib.txt").read_bytes()).hexdigest()
    build = (tools.build_info() or {}).get("llama_cpp_commit") or str(tools.locate("llama-imatrix"))
    key = hashlib.sha256(json.dumps([f16_sha256, text_sha, o.seq_len, o.samples, build]).encode()).hexdigest()[:32]
    cached, path = subdir("imatrix") / f"{key}.gguf", work / "imatrix.gguf"
    reused = cached.is_file()
    if reused:
        shutil.copyfile(cached, path)
    else:
        proc = tools.run(
            "llama-imatrix",
            [
                "-m",
                work / "f16.gguf",
                "-f",
                work / "calib.txt",
                "-o",
                path,
                "-c",
                o.seq_len,
                "--chunks",
                o.samples,
                "-t",
                _threads(o),
                "--no-ppl",
            ],
            purpose="computing the importance matrix",
        )
        if not path.is_file():
            raise tools.ToolError(f"llama-imatrix wrote no importance matrix ({tools.telling_line(proc.stderr)})")
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
        shutil.copyfile(path, tmp)
        os.replace(tmp, cached)
    return Imatrix(
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        text_sha256=text_sha,
        chunk_tokens=o.seq_len,
        chunks_max=o.samples,
        seconds=time.perf_counter() - t0,
        reused=reused,
        tool="llama-imatrix",
        calibration=manifest,
    )


def _mapping(qtype: str, imat: Imatrix | None, mixed: bool = False) -> str:
    return f"F16 -> {qtype}{' types chosen per tensor' if mixed else ''} (llama-quantize{', imatrix' if imat else ''})"


# llama-quantize's name for a file type whose tensors are all of one ggml type (--pure): the K-quant
# types are named by a mix of theirs (llama-quantize's usage lists Q4_K_S; --pure drops the mix).
PURE_NAME = {"Q3_K": "Q3_K_S", "Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S"}


def type_lines(types: dict[str, str]) -> str:
    """llama-quantize's --tensor-type-file for `types`: one `pattern=type` per tensor, each pattern
    a regex (llama-quant.cpp matches with std::regex_search) that matches that whole name only."""
    return "".join(f"^{re.escape(name)}$={qtype.lower()}\n" for name, qtype in sorted(types.items()))


def _quantize(
    work: Path,
    qtype: str,
    imat: Imatrix | None,
    o: KquantOptions,
    *,
    dst: Path | None = None,
    pure: bool = False,
    types: dict[str, str] | None = None,
) -> None:
    """llama-quantize (--imatrix when there is one) into `dst` (default WORK/out.gguf); quantkit's header
    keys that the F16 file held and that no longer hold are overridden (llama-quantize copies every key
    of its input). `types` pins those tensors' types (--tensor-type-file); `pure` quantizes every
    tensor to `qtype` where its rows allow (--pure)."""
    mapping = json.dumps([{"mapping": _mapping(qtype, imat, bool(types)), "exact": False}])
    kv = ["quantkit.lossless=bool:false", f"quantkit.mapping=str:{mapping}", f"quantkit.gguf.type=str:{qtype}"]
    args: list = ["--pure"] if pure else []
    if imat:
        kv.append(f"quantkit.imatrix.sha256=str:{imat.sha256}")
        args += ["--imatrix", work / "imatrix.gguf"]
    if types:
        (work / "tensor-types.txt").write_text(type_lines(types))
        args += ["--tensor-type-file", work / "tensor-types.txt"]
    for item in kv:
        args += ["--override-kv", item]
    name = PURE_NAME.get(qtype, qtype) if pure else qtype
    tools.run(
        "llama-quantize",
        [*args, work / "f16.gguf", dst or work / "out.gguf", name, _threads(o)],
        purpose=f"--type {qtype}",
    )


def _record(
    path: Path,
    out: Path,
    qtype: str,
    f16: GgufRecord,
    imat: Imatrix | None,
    seconds: float,
    mixed: dict | None = None,
) -> KquantRecord:
    types = read_types(path, qtype)
    if mixed is not None:  # the chooser named every weight's type: none is llama-quantize's fallback
        check_mixed(types, mixed, path.stat().st_size)
        types = replace(types, fallbacks=[], fallback_types={})
    return KquantRecord(
        gguf=str(out.resolve()),
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        source=f16.source,
        origin=f16.origin,
        architecture=f16.architecture,
        model_type=f16.model_type,
        lossless=False,
        gguf_type=qtype,
        mapping=(MappingLine(_mapping(qtype, imat, mixed is not None), len(types.type_of), False),),
        tensor_types=types.tensor_types,
        weight_types=types.weight_types,
        bits_per_weight=types.bits_per_weight,
        bits_per_weight_2d=types.bits_per_weight_2d,
        bits_per_weight_layers=types.bits_per_weight_layers,
        fallbacks=tuple(types.fallbacks),
        fallback_types=types.fallback_types,
        block=types.block,
        tensors=types.tensors,
        imatrix=imat,
        f16={"bytes": f16.bytes, "sha256": f16.sha256},
        vocab=f16.vocab,
        notes=f16.notes + tuple(_notes(types, qtype)),
        tool_versions={
            **f16.tool_versions,
            "llama-quantize": tools.version("llama-quantize"),
            "llama.cpp build": (tools.build_info() or {}).get("llama_cpp_commit"),
        },
        wall_seconds=seconds,
        mixed={k: v for k, v in mixed.items() if k != "types"} if mixed is not None else None,
    )


def check_mixed(types: TypeReport, mixed: dict, size: int) -> None:
    """The file holds every type the chooser named, and is no larger than --type's own file; else one
    line (raised before the file is renamed into place, so nothing is written)."""
    got = types.type_of
    wrong = [f"{n} is {got.get(n)}, not {t}" for n, t in sorted(mixed["types"].items()) if got.get(n) != t]
    if wrong:
        raise tools.ToolError(
            f"llama-quantize did not give the chosen types ({wrong[0]}; {len(wrong)} tensors); nothing was written"
        )
    if size > mixed["reference_bytes"]:
        raise tools.ToolError(
            f"the file takes {size} bytes, more than the {mixed['reference_bytes']} of --type's own file; "
            "nothing was written"
        )


def _notes(types: TypeReport, qtype: str) -> list[str]:
    if not types.fallbacks:
        return []
    rows = sorted({f["row"] for f in types.fallbacks})
    got = ", ".join(f"{n} x {t}" for t, n in types.fallback_types.items())
    return [
        f"{len(types.fallbacks)} weights have rows of {', '.join(map(str, rows))} values, no multiple of {qtype}'s "
        f"{types.block}-value block: llama-quantize gave them {got}"
    ]
