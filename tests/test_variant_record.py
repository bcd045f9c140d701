"""pipeline/variant_record.py: a run's variant as one typed record, its JSON form, the reports older
schemas wrote read into it, and no other module reading a variant's JSON by key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantkit.core.record_checks import RecordError
from quantkit.pipeline.variant_record import VariantRecord

ROOT = Path(__file__).resolve().parents[1] / "quantkit"
GGUF = {"gguf": "/run/gguf/int4.gguf", "sha256": "ab", "bytes": 10, "lossless": True}


def test_round_trip_holds_every_field():
    rec = VariantRecord(
        "int4",
        "INT4 RTN",
        ({"quantize": {"method": "rtn"}},),
        artifact="/run/int4",
        eval_errors={"llamacpp": "no llama.cpp"},
        exports={"gguf": GGUF},
        bench_errors={"vllm": "not installed"},
    )
    data = rec.to_json()
    assert VariantRecord.from_json(data) == rec
    assert set(data) == {
        "name",
        "description",
        "steps",
        "artifact",
        "eval",
        "evals",
        "eval_errors",
        "gguf_variant",
        "exports",
        "export_errors",
        "bench",
        "benches",
        "bench_errors",
        "error",
        "traceback",
    }


def test_the_gguf_is_held_once():
    made = {"gguf": "/run/gguf/q4.gguf", "gguf_type": "Q4_K_M", "bytes": 9, "fallback_types": {"Q5_0": 2}}
    q4 = VariantRecord("q4", gguf_variant=made).gguf
    assert (q4.path, q4.gguf_type, q4.bytes, q4.fallback_types) == (Path("/run/gguf/q4.gguf"), "Q4_K_M", 9, {"Q5_0": 2})
    exact = VariantRecord("int4", exports={"gguf": GGUF}).gguf
    assert (exact.path, exact.gguf_type, exact.sha256) == (Path(GGUF["gguf"]), None, "ab")
    assert VariantRecord("int4", exports={"compressed-tensors": {"sha256": "cd"}}).gguf is None
    assert "gguf" not in VariantRecord("int4", exports={"gguf": GGUF}).to_json()
    with pytest.raises(RecordError, match="names its file"):
        VariantRecord("bad", gguf_variant={"bytes": 9}).gguf


def test_older_reports_read_into_the_fields_that_hold_them_now():
    schema3 = {"name": "int4", "description": None, "steps": [], "gguf": GGUF, "gguf_error": None}
    assert VariantRecord.from_json(schema3).exports == {"gguf": GGUF}
    failed = {"name": "int4", "steps": [], "artifact": "/run/int4", "gguf_error": "no GGUF type"}
    assert VariantRecord.from_json(failed).export_errors == {"gguf": "no GGUF type"}
    schema4 = {"name": "q4", "steps": [], "gguf": {"gguf": "/q4.gguf"}, "gguf_variant": {"gguf": "/q4.gguf"}}
    rec = VariantRecord.from_json(schema4)
    assert rec.gguf.path == Path("/q4.gguf") and rec.gguf_variant == {"gguf": "/q4.gguf"} and rec.exports == {}


@pytest.mark.parametrize(
    "bad, match",
    [({"name": "x", "ggfu": {}}, "unknown key 'ggfu'"), ({"steps": []}, "name is text"), ([1], "JSON object")],
)
def test_a_bad_variant_is_one_line(bad, match):
    with pytest.raises(RecordError, match=match):
        VariantRecord.from_json(bad, "variants.x")


def test_no_module_reads_a_variant_by_key():
    """A variant's fields are its record's attributes: nothing outside pipeline/variant_record.py
    reads them out of a dict by their JSON names."""
    keys = "gguf_variant|export_errors|eval_errors|bench_errors|benches|evals|exports|traceback"
    read = re.compile(rf"""\[\s*["']({keys})["']\s*\]|\.get\(\s*["']({keys})["']""")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted(ROOT.rglob("*.py"))
        if p.name != "variant_record.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if read.search(line)
    ]
    assert found == []


def test_the_run_reads_an_export_record_as_a_record():
    """What a run keeps of a GGUF export is read through export/gguf_kept.py: pipeline/ and cli/
    take its fields as attributes."""
    keys = "gguf_type|bits_per_weight_layers|lossless|imatrix_sha256"
    read = re.compile(rf"""\[\s*["']({keys})["']\s*\](?!\s*=[^=])|\.get\(\s*["']({keys})["']""")  # not a write
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for folder in ("pipeline", "cli")
        for p in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if read.search(line)
    ]
    assert found == []
