import codecs
import json
import re
from pathlib import Path

import pytest
from fixtures import CALIB_DATA

from quantkit.data.sources import SOURCES, label_of, sources_table, syntaxes
from quantkit.data.text import overlaps, parse_spec, read_text, region_windows
from quantkit.errors import DataError


def test_parse_spec():
    assert parse_spec("self").kind == "self"
    assert parse_spec("file:a/b.txt").path == "a/b.txt"
    s = parse_spec("hf:wikitext:wikitext-2-raw-v1:validation")
    assert (s.dataset, s.config, s.split) == ("wikitext", "wikitext-2-raw-v1", "validation")
    assert parse_spec("hf:ds:train").config is None
    for bad in ["ftp:x", "hf:onlyone", "file:", "set:", "self:x", "file"]:
        with pytest.raises(DataError):
            parse_spec(bad)
    with pytest.raises(DataError, match=re.escape(f"use {', '.join(syntaxes()[:-1])} or {syntaxes()[-1]}")):
        parse_spec("nonsense:x")


def test_every_text_source_is_one_registry_entry_and_asked_by_its_capabilities():
    """Each kind is a SOURCES entry whose syntax parses back to that kind; callers ask capabilities."""
    examples = {"file": "file:a/b.txt", "hf": "hf:ds:train", "set": "set:world-factbook", "mix": "mix:default"}
    for kind, source in SOURCES.items():
        spec = parse_spec(examples.get(kind, source.syntax))
        assert spec.source is SOURCES[spec.kind]
        assert kind == "set" or spec.kind == kind  # a set resolves to the text its manifest names
    assert [k for k, s in SOURCES.items() if s.network] == ["hf"]
    assert [k for k, s in SOURCES.items() if s.generated] == ["self"]
    assert [k for k, s in SOURCES.items() if s.parts] == ["mix"]
    assert parse_spec("set:world-factbook").source.local and parse_spec("set:world-factbook").set_name
    assert [label_of(s) for s in ("file:x/eval.txt", "set:legal", "mix:default", "hf:a/b:c", "self")] == [
        "eval",
        "legal",
        "default",
        "a-b-c",
        "self",
    ]


def test_the_docs_table_of_text_sources_is_the_registry():
    page = (Path(__file__).resolve().parents[1] / "docs" / "EVALUATION.md").read_text()
    table = re.search(r"<!-- text-sources: [^>]*-->\n(.*?)<!-- /text-sources -->", page, re.S)
    assert table and table.group(1) == sources_table(), "docs/EVALUATION.md: paste sources_table()'s output"


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
    beside = tmp_path / "calib_data" / "corpus.txt"  # a text beside its manifest wins
    beside.write_text("other words " * 50)
    assert parse_spec("set:mine").path == str(beside.resolve())


def test_a_set_kept_outside_quantkit_is_read_where_its_variable_says(tmp_path, monkeypatch):
    import hashlib

    from quantkit.evals.domains import default_texts

    monkeypatch.delenv("QUANTKIT_WIKITEXT2_VALID", raising=False)
    with pytest.raises(DataError, match="set QUANTKIT_WIKITEXT2_VALID"):
        parse_spec("set:wikitext2-valid")
    assert "set:wikitext2-valid" not in default_texts()
    copy = tmp_path / "wiki.txt"
    copy.write_text("not the real file " * 100)
    monkeypatch.setenv("QUANTKIT_WIKITEXT2_VALID", str(copy))
    spec = parse_spec("set:wikitext2-valid")
    assert spec.path == str(copy) and spec.expect_sha256 != hashlib.sha256(copy.read_bytes()).hexdigest()
    with pytest.raises(DataError, match="the manifest says"):  # a different file is refused, not substituted
        read_text(spec)
    assert default_texts()[-1] == "set:wikitext2-valid"
    with pytest.raises(DataError, match="no manifest"):
        parse_spec("set:other")


def test_shipped_manifests_parse(monkeypatch, tmp_path):

    monkeypatch.setenv("QUANTKIT_WIKITEXT2_VALID", str(tmp_path / "wiki.txt"))  # the one set kept outside quantkit
    for m in (CALIB_DATA).glob("*.yaml"):
        assert parse_spec(f"set:{m.stem}").kind in ("file", "hf")


WORDS = "the quick brown fox jumps over the lazy dog. " * 2000  # 90,000 characters


def test_a_stray_bad_byte_is_a_warning_and_recorded(tmp_path, capsys):
    """Up to one bad character in 10,000: the text is used, the count recorded and reported."""
    p = tmp_path / "a.txt"
    p.write_bytes(WORDS[:40000].encode() + b"\xff\xfe" + WORDS[40000:].encode() + b"\x1b")
    t = read_text(parse_spec(f"file:{p}"))
    assert t.provenance["bad_characters"] == 3  # two undecodable bytes, one escape character
    assert "3 of" in capsys.readouterr().err


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:1000] + bytes(range(128, 256)) * 2 + b[1000:],  # cp1252 bytes in UTF-8
        lambda b: b.replace(b" ", b"\x00", 50),  # NULs
        lambda b: b.decode().encode("utf-16-le"),  # UTF-16 without a BOM
        lambda b: bytes(x ^ 0xA5 for x in b),
    ],  # scrambled
    ids=["high-bytes", "nul", "utf16-no-bom", "xor"],
)
def test_more_than_a_stray_byte_refuses_the_text(tmp_path, damage):
    p = tmp_path / "a.txt"
    p.write_bytes(damage(WORDS.encode()))
    with pytest.raises(DataError, match=rf"^{p}: not UTF-8 text: \d+ of \d+ characters"):
        read_text(parse_spec(f"file:{p}"))


def test_text_with_a_bom_and_real_replacement_characters(tmp_path):
    for name, raw in [
        ("utf8-bom.txt", b"\xef\xbb\xbf" + WORDS.encode()),
        ("utf16.txt", WORDS.encode("utf-16")),
        ("utf16be.txt", b"\xfe\xff" + WORDS.encode("utf-16-be")),
    ]:
        (tmp_path / name).write_bytes(raw)
        t = read_text(parse_spec(f"file:{tmp_path / name}"))
        assert t.text == WORDS and "bad_characters" not in t.provenance
    q = tmp_path / "fffd.txt"
    q.write_text(WORDS + "\ufffd" * 100, encoding="utf-8")  # U+FFFD written as text is text
    assert "bad_characters" not in read_text(parse_spec(f"file:{q}")).provenance


def test_jsonl_lines_split_only_at_newlines(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(
        json.dumps({"text": "a\u2028b\u2029c"}, ensure_ascii=False) + "\n" + json.dumps({"text": "d"}) + "\n",
        encoding="utf-8",
    )
    assert read_text(parse_spec(f"file:{p}")).text.startswith("a\u2028b")


def test_unreadable_files_and_bad_manifests(tmp_path, monkeypatch):
    import os

    d = tmp_path / "dir.txt"
    d.mkdir()
    with pytest.raises(DataError, match="not a regular file"):
        read_text(parse_spec(f"file:{d}"))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.txt"
        locked.write_text(WORDS)
        locked.chmod(0)
        with pytest.raises(DataError, match="cannot read"):
            read_text(parse_spec(f"file:{locked}"))
    (tmp_path / "calib_data").mkdir()
    monkeypatch.setenv("QUANTKIT_CALIB_DATA", str(tmp_path / "calib_data"))
    for content in ("source: [1\n", "- a list\n", "sha256: abc\n"):
        (tmp_path / "calib_data" / "bad.yaml").write_text(content)
        with pytest.raises(DataError, match="set:bad"):
            parse_spec("set:bad")
    with pytest.raises(DataError, match="plain name"):
        parse_spec("set:../../etc/x")


def test_a_huge_binary_text_is_refused_in_seconds_and_bounded_memory(tmp_path):
    """A 2 GiB sparse file took 3 min 14 s and 10.7 GB before a MemoryError (exit 1): it is read in
    chunks and refused once its bad characters alone exceed what the whole file could hold."""
    import os
    import time
    import tracemalloc

    p = tmp_path / "zeros.txt"
    p.touch()
    os.truncate(p, 2 << 30)  # sparse: no disk used
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=rf"^{p}: not UTF-8 text: \d+ of \d+ characters in its first 1,048,576 bytes"):
        read_text(parse_spec(f"file:{p}"))
    elapsed, (_, peak) = time.perf_counter() - t0, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 10 and peak < 32 << 20, (elapsed, peak)


@pytest.mark.parametrize("size", [3 << 20, 5 << 20 | 17], ids=["3MiB", "odd"])
def test_a_text_over_the_limit_is_refused_for_its_size_none_of_it_kept(tmp_path, monkeypatch, size):
    """A valid text larger than a text may be (it is tokenized whole, several times its size in
    memory) is refused once that much of it is read; under the limit it is read as before."""
    import tracemalloc

    from quantkit.data import text as texts

    monkeypatch.setattr(texts, "MAX_TEXT_BYTES", 1 << 20)
    monkeypatch.setattr(texts, "CHUNK_BYTES", 64 << 10)
    p = tmp_path / "big.txt"
    p.write_text((WORDS * (size // len(WORDS) + 1))[:size])
    tracemalloc.start()
    with pytest.raises(DataError, match=rf"^{p}: {size:,} bytes, over the 1 MiB a text may have"):
        read_text(parse_spec(f"file:{p}"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20
    p.write_text(WORDS)
    assert read_text(parse_spec(f"file:{p}")).text == WORDS


@pytest.mark.parametrize("chunk", [1 << 20, 7, 3, 2])
def test_bad_characters_are_counted_the_same_whatever_the_chunks(tmp_path, monkeypatch, capsys, chunk):
    """Multi-byte characters and a U+FFFD the file itself holds split across chunk boundaries count
    as the whole file would: the stray bad bytes, no more."""
    from quantkit.data import text as texts

    monkeypatch.setattr(texts, "CHUNK_BYTES", chunk)
    body = ("é—" + WORDS[:3000]) * 20 + "\ufffd"  # a U+FFFD in the file is text
    p = tmp_path / "a.txt"
    p.write_bytes(body.encode() + b"\xff" + body.encode())
    t = read_text(parse_spec(f"file:{p}"))
    assert t.provenance["bad_characters"] == 1 and t.text == body + "\ufffd" + body
    p.write_bytes(codecs.BOM_UTF16_LE + body.encode("utf-16-le"))
    t = read_text(parse_spec(f"file:{p}"))
    assert t.text == body and t.provenance["bad_characters"] == 1  # UTF-16 counts every U+FFFD, as it did


def test_proc_files_read_like_files_and_a_binary_one_is_refused():
    assert "Name:" in read_text(parse_spec("file:/proc/self/status")).text  # its size says 0
    with pytest.raises(DataError, match="not UTF-8 text"):
        read_text(parse_spec("file:/proc/self/environ"))  # NUL-separated
