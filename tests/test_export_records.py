"""The export records (export/export_records.py, and the GGUF records gguf/gguf_records.py): what an
exporter returns, typed, with one JSON form.

A real export's JSON (`quantkit export --json`, the record file beside a GGUF, what a run keeps of
it) has exactly the keys it had when exporters returned dicts; to_json and from_json round-trip;
an unknown key, a missing one or a value of the wrong type is one line; what older quantkits wrote
still reads."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures import RECIPES
from gguf_helpers import kquant_json
from installed import llama_tool

from quantkit.core.record_checks import RecordError
from quantkit.export.export_records import CopyRecord
from quantkit.export.export_registry import EXPORTERS
from quantkit.gguf.gguf_records import GgufRecord, KquantRecord, gguf_record

# The keys each record's JSON held, in order, when exporters returned dicts (compressed_tensors.py,
# gguf/artifact_to_gguf.py, gguf/llama_quantize.py); a lossy exact export adds kl_vs_artifact before
# wall_seconds, a --mixed one `mixed` at the end.
COPY_KEYS = ["kind", "format", "out", "artifact", "files", "bytes", "sha256"]
GGUF_KEYS = [
    *("kind", "schema_version", "gguf", "sha256", "bytes", "source", "origin", "architecture", "model_type"),
    *("lossless", "mapping", "tensor_types", "tensors", "verification", "lossy_tensors", "extra_tensors", "vocab"),
    *("notes", "tool_versions", "gguf_quant_version", "wall_seconds"),
]
LOSSY_KEYS = [*GGUF_KEYS[:-1], "kl_vs_artifact", "wall_seconds"]
KQUANT_KEYS = [
    *("kind", "schema_version", "gguf", "sha256", "bytes", "source", "origin", "architecture", "model_type"),
    *("lossless", "gguf_type", "mapping", "tensor_types", "weight_types", "bits_per_weight", "bits_per_weight_2d"),
    *("bits_per_weight_layers", "fallbacks", "fallback_types", "block", "tensors", "imatrix", "f16", "vocab"),
    *("notes", "tool_versions", "wall_seconds"),
]
# What a run kept of each exporter's record: these keys of it (as the exporters' `keeps` listed them), and
# llama-quantize's importance matrix hash and --mixed's summary.
KEEPS = {
    "compressed-tensors": ("out", "sha256", "bytes", "files"),
    "gguf": ("gguf", "sha256", "bytes", "lossless", "tensor_types", "mapping"),
    "gguf-kquant": ("gguf", "sha256", "bytes", "lossless", "tensor_types", "mapping")
    + ("gguf_type", "bits_per_weight", "bits_per_weight_layers", "fallback_types"),
}


def kept_before(exporter: str, rec: dict) -> dict:
    """What a run kept of a record's JSON when the exporters read it by key."""
    kept = {k: rec.get(k) for k in KEEPS[exporter]}
    if exporter == "gguf-kquant":
        kept["imatrix_sha256"] = (rec.get("imatrix") or {}).get("sha256")
        if rec.get("mixed"):
            kept["mixed"] = {k: v for k, v in rec["mixed"].items() if k not in ("weights", "windows")}
    return kept


GROUP_32 = "steps[0].quantize.group_size=32"  # Q4_0's block: the exact export


@pytest.fixture(scope="module")
def made(tiny_dir, tmp_path_factory) -> dict:
    """An RTN g32 artifact of the tiny Llama and its exports, each as `quantkit export --json` printed
    it: compressed-tensors, the exact GGUF (lossless) and one with Q8_0 embeddings (lossy, its KL)."""
    from quantkit.cli import cli as group

    root = tmp_path_factory.mktemp("export-records")
    env = {"QUANTKIT_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}

    def run(*args) -> dict:
        res = CliRunner().invoke(group, list(args), catch_exceptions=False, env=env)
        assert res.exit_code == 0, res.stderr
        return json.loads(res.stdout)

    art, recipe = root / "art", str(RECIPES / "int4-w4a16-rtn.yaml")
    run("convert", recipe, "--model", str(tiny_dir / "llama-gqa"), "--out", str(art), "--set", GROUP_32, "--json")
    return {
        "copy": run("export", str(art), "--format", "compressed-tensors", "--out", str(root / "ct"), "--json"),
        "exact": run("export", str(art), "--format", "gguf", "--out", str(root / "exact.gguf"), "--json"),
        "lossy": run(
            "export", str(art), "--format", "gguf", "--embeddings", "q8_0", "--out", str(root / "lossy.gguf"), "--json"
        ),
    }


def _beside(rec: dict) -> dict:
    """The record file quantkit export wrote beside a GGUF."""
    return json.loads(Path(rec["gguf"].removesuffix(".gguf") + ".quantkit.json").read_text())


@pytest.mark.parametrize("name, keys", [("copy", COPY_KEYS), ("exact", GGUF_KEYS), ("lossy", LOSSY_KEYS)])
def test_a_real_exports_json_has_the_keys_it_had(made, name, keys):
    rec = made[name]
    assert list(rec) == keys
    record = CopyRecord.from_json(rec) if name == "copy" else gguf_record(rec)
    assert record.to_json() == rec and list(record.to_json()) == keys  # --json is the record's one JSON form
    if name != "copy":
        assert _beside(rec) == rec  # and so is the file beside the GGUF
        assert type(record) is GgufRecord and (record.kl_vs_artifact is None) == (name == "exact")


@pytest.mark.parametrize("name, exporter", [("copy", "compressed-tensors"), ("exact", "gguf"), ("lossy", "gguf")])
def test_what_a_run_keeps_is_what_it_kept(made, name, exporter):
    rec = made[name]
    record = CopyRecord.from_json(rec) if name == "copy" else GgufRecord.from_json(rec)
    kept = EXPORTERS[exporter].kept(record)
    assert kept == kept_before(exporter, rec) and list(kept) == list(kept_before(exporter, rec))


def test_the_terminal_lines_read_the_record(made):
    copy = CopyRecord.from_json(made["copy"])
    assert EXPORTERS["compressed-tensors"].summary(copy) == [
        f"wrote {copy.out} ({copy.bytes / 1e6:.1f} MB, {copy.files} files, compressed-tensors)"
    ]
    exact = EXPORTERS["gguf"].summary(GgufRecord.from_json(made["exact"]))
    assert exact[0].startswith(f"wrote {made['exact']['gguf']} (") and exact[0].endswith(", llama)")
    assert any(line.startswith("  lossless: ") and "(max abs diff 0)" in line for line in exact)
    lossy = EXPORTERS["gguf"].summary(GgufRecord.from_json(made["lossy"]))
    n = len(made["lossy"]["lossy_tensors"])
    assert n and any(line.startswith(f"  LOSSY: {n} tensors; KL vs the artifact ") for line in lossy)
    # the K-quant exporter shows the exact export's record (its exact route) as the exact exporter does
    assert EXPORTERS["gguf-kquant"].summary(GgufRecord.from_json(made["exact"])) == exact


def test_the_kquant_exporter_keeps_its_keys_on_the_exact_route(made):
    """A quantized artifact in --type's own grid takes the exact route: its record is the exact
    export's, and a run keeps the K-quant keys of it, null."""
    rec = made["exact"]
    assert EXPORTERS["gguf-kquant"].kept(GgufRecord.from_json(rec)) == kept_before("gguf-kquant", rec)


@pytest.mark.parametrize("mixed", [True, False])
def test_a_kquant_record_round_trips_and_keeps_what_it_kept(made, mixed):
    rec = kquant_json(made["exact"], mixed)
    assert list(rec) == KQUANT_KEYS + (["mixed"] if mixed else [])
    record = gguf_record(rec)
    assert type(record) is KquantRecord and record.to_json() == rec and list(record.to_json()) == list(rec)
    assert KquantRecord.from_json(record.to_json()) == record
    kept = EXPORTERS["gguf-kquant"].kept(record)
    assert kept == kept_before("gguf-kquant", rec) and list(kept) == list(kept_before("gguf-kquant", rec))
    lines = EXPORTERS["gguf-kquant"].summary(record)
    assert lines[0] == (
        "wrote /models/tiny.Q4_K_M.gguf (2.0 MB, Q4_K_M, 4.50 bits/weight in the decoder layers, 4.90 overall)"
    )
    assert lines[1] == "  tensor types: 1 x F32, 1 x Q4_K, 1 x Q6_K"
    assert (
        lines[2]
        == "  importance matrix: llama-imatrix over 4 windows of 64 tokens from file:text.txt (sha256 cdcdcdcdcdcd)"
    )
    assert any("types per tensor among Q4_K, Q6_K" in line for line in lines) == mixed


def test_a_record_read_back_equals_it(made):
    for rec, cls in ((made["copy"], CopyRecord), (made["exact"], GgufRecord), (made["lossy"], GgufRecord)):
        record = cls.from_json(rec)
        assert cls.from_json(json.loads(json.dumps(record.to_json()))) == record


BAD = [
    ("unknown key", lambda r: {**r, "gguf_typo": 1}, "unknown key 'gguf_typo'"),
    ("missing key", lambda r: {k: v for k, v in r.items() if k != "sha256"}, "missing key 'sha256'"),
    ("wrong type", lambda r: {**r, "bytes": "12"}, "bytes: '12' is not a whole number"),
    ("wrong kind", lambda r: {**r, "kind": "bench"}, "kind 'bench', not"),
]


@pytest.mark.parametrize("name", ["copy", "exact", "lossy", "kquant"])
@pytest.mark.parametrize("case, change, message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_record_is_one_line(made, name, case, change, message):
    rec = kquant_json(made["exact"]) if name == "kquant" else made[name]
    read = CopyRecord.from_json if name == "copy" else gguf_record
    with pytest.raises(RecordError, match=message) as err:
        read(change(rec))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: {**r, "schema_version": 3}, "GGUF export record of schema 3: this quantkit reads 1, 2"),
        (lambda r: {**r, "verification": {**r["verification"], "extra": 1}}, "verification: unknown key 'extra'"),
        (lambda r: {**r, "mapping": [{"mapping": "x", "tensors": 1}]}, "mapping: missing key 'exact'"),
        (lambda r: {**r, "lossless": "yes"}, "lossless: expected true or false, not a string"),
        (lambda r: [r], "expected a JSON object, not list"),
    ],
)
def test_a_bad_part_of_a_gguf_record_is_one_line(made, change, message):
    with pytest.raises(RecordError, match=message) as err:
        GgufRecord.from_json(change(made["exact"]))
    assert "\n" not in str(err.value)


def test_a_schema_1_record_reads_with_no_origin(made):
    """Schema 1 (before the record named the checkpoint the artifact was converted from) had no `origin`."""
    old = {k: v for k, v in made["exact"].items() if k != "origin"} | {"schema_version": 1}
    record = GgufRecord.from_json(old)
    assert record.origin is None and record.schema_version == 2
    assert record.source.to_json() == made["exact"]["source"]
    assert record.to_json() == {**made["exact"], "origin": None}
    assert EXPORTERS["gguf"].summary(record) == EXPORTERS["gguf"].summary(GgufRecord.from_json(made["exact"]))
    with pytest.raises(RecordError, match="unknown key 'extra'"):
        GgufRecord.from_json({**old, "extra": 1})


def test_older_kl_and_llama_quantize_forms_read(made):
    """A lossy export's KL from before the reference's logits were checked (no reference_finite), and
    llama-quantize's records from before the layers' bits per weight and the imatrix's reuse were kept."""
    kl = {k: v for k, v in made["lossy"]["kl_vs_artifact"].items() if k != "reference_finite"}
    lossy = GgufRecord.from_json({**made["lossy"], "kl_vs_artifact": kl})
    assert lossy.kl_vs_artifact.reference_finite is None
    assert lossy.kl_vs_artifact.mean_kl == made["lossy"]["kl_vs_artifact"]["mean_kl"]
    rec = kquant_json(made["exact"], mixed=False)
    old = {k: v for k, v in rec.items() if k != "bits_per_weight_layers"}
    old["imatrix"] = {k: v for k, v in rec["imatrix"].items() if k != "reused"}
    record = KquantRecord.from_json(old)
    assert record.bits_per_weight_layers is None and record.imatrix.reused is None
    assert EXPORTERS["gguf-kquant"].kept(record)["bits_per_weight_layers"] is None
    assert KquantRecord.from_json({**rec, "imatrix": None}).imatrix is None  # llama-quantize alone


def test_the_record_beside_a_gguf_reads_typed_or_not_at_all(made, tmp_path):
    """gguf/target.py's reader of the record file: the typed record, or None where there is none, it
    is not quantkit export's or it does not read (then nothing trusts it; --force still replaces a
    record of quantkit's kind)."""
    from quantkit.gguf.target import read_record, record_path, written_record

    assert read_record(record_path(Path(made["exact"]["gguf"]))) == GgufRecord.from_json(made["exact"])
    path = tmp_path / "x.quantkit.json"
    assert read_record(path) is None and not written_record(path)
    path.write_text(json.dumps(kquant_json(made["exact"])))
    assert read_record(path) == KquantRecord.from_json(kquant_json(made["exact"])) and written_record(path)
    for text, ours in (
        ("my notes", False),
        (json.dumps(made["copy"]), False),
        (json.dumps({**made["exact"], "schema_version": 3}), True),
        (json.dumps({k: v for k, v in made["exact"].items() if k != "sha256"}), True),
    ):
        path.write_text(text)
        assert read_record(path) is None and written_record(path) == ours, text[:40]


def test_a_real_kquant_export_has_the_keys_it_had(cli, tiny_llama, tiny_text, tmp_path):
    llama_tool("llama-quantize"), llama_tool("llama-imatrix")
    out = tmp_path / "tiny.Q4_0.gguf"
    args = ["export", str(tiny_llama), "--format", "gguf", "--type", "Q4_0", "--out", str(out)]
    args += ["--calib", f"file:{tiny_text}", "--calib-samples", "4", "--calib-seq-len", "64", "--json"]
    code, _, err, rec = cli(*args)
    assert code == 0, err
    assert list(rec) == KQUANT_KEYS and _beside(rec) == rec
    record = gguf_record(rec)
    assert type(record) is KquantRecord and record.to_json() == rec
    assert EXPORTERS["gguf-kquant"].kept(record) == kept_before("gguf-kquant", rec)
