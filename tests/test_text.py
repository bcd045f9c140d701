import pytest

from quantkit.errors import DataError
from quantkit.text import overlaps, parse_spec, read_text, region_windows


def test_parse_spec():
    assert parse_spec("self").kind == "self"
    assert parse_spec("file:a/b.txt").path == "a/b.txt"
    s = parse_spec("hf:wikitext:wikitext-2-raw-v1:validation")
    assert (s.dataset, s.config, s.split) == ("wikitext", "wikitext-2-raw-v1", "validation")
    assert parse_spec("hf:ds:train").config is None
    for bad in ["ftp:x", "hf:onlyone", "file:"]:
        with pytest.raises(DataError):
            parse_spec(bad)


def test_region_windows_disjoint():
    first = region_windows(1000, 100, "first-half")
    second = region_windows(1000, 100, "second-half")
    assert first == [(0, 100), (100, 200), (200, 300), (300, 400), (400, 500)]
    assert second[0] == (500, 600) and len(second) == 5
    assert not overlaps(first, second)
    assert overlaps(first, [(450, 550)])
    assert region_windows(50, 100, "all") == []


def test_read_jsonl_and_errors(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"text": "hello"}\n{"text": "world"}\n')
    t = read_text(parse_spec(f"file:{p}"))
    assert t.text == "hello\n\nworld" and len(t.provenance["sha256"]) == 64
    p.write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="'text' field"):
        read_text(parse_spec(f"file:{p}"))
    with pytest.raises(DataError, match="no such text file"):
        read_text(parse_spec(f"file:{tmp_path}/missing.txt"))
    q = tmp_path / "a.csv"
    q.write_text("x")
    with pytest.raises(DataError, match="unsupported"):
        read_text(parse_spec(f"file:{q}"))


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["one", "two"]}), p)
    assert read_text(parse_spec(f"file:{p}")).text == "one\n\ntwo"


def test_named_set_manifest(tmp_path, monkeypatch):
    import hashlib

    (tmp_path / "calib_data").mkdir()
    data = tmp_path / "corpus.txt"
    data.write_text("some words " * 50)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    (tmp_path / "calib_data" / "mine.yaml").write_text(f"source: file:corpus.txt\nsha256: {digest}\n")
    monkeypatch.setenv("QUANTKIT_CALIB_DATA", str(tmp_path / "calib_data"))
    spec = parse_spec("set:mine")
    assert spec.kind == "file" and spec.path == str(data.resolve())
    t = read_text(spec)
    assert t.provenance["set"] == "mine" and t.provenance["sha256"] == digest
    data.write_text("changed")
    with pytest.raises(DataError, match="the manifest says"):
        read_text(parse_spec("set:mine"))
    with pytest.raises(DataError, match="no manifest"):
        parse_spec("set:other")


def test_shipped_manifests_parse():
    from pathlib import Path

    for m in (Path(__file__).resolve().parents[1] / "calib_data").glob("*.yaml"):
        assert parse_spec(f"set:{m.stem}").kind in ("file", "hf")
