"""gguf/read.py keeps a large GGUF's reader for the process while the file is the same one."""

import os

import numpy as np
import pytest


def write_gguf(path, name: str, rows: int = 4) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_tensor("token_embd.weight", np.zeros((rows, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_same_file_is_parsed_once_and_a_replaced_one_again(tmp_path, monkeypatch):
    from quantkit.errors import ModelError
    from quantkit.gguf import read

    monkeypatch.setattr(read, "KEEP_READER_BYTES", 0)
    monkeypatch.setattr(read, "_READERS", {})
    path = tmp_path / "m.gguf"
    write_gguf(path, "first")
    r = read.open_reader(path)
    assert read.open_reader(path) is r and read.field_value(r, "general.name") == "first"

    other = tmp_path / "new.gguf"
    write_gguf(other, "second", rows=6)
    os.replace(other, path)  # a new file under the same name (how quantkit's exports land)
    r2 = read.open_reader(path)
    assert r2 is not r and read.field_value(r2, "general.name") == "second"

    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 16])  # cut in place: another size, so parsed (and refused) again
    with pytest.raises(ModelError, match="truncated"):
        read.open_reader(path)


def test_a_small_file_is_not_kept(tmp_path):
    from quantkit.gguf import read

    path = tmp_path / "s.gguf"
    write_gguf(path, "small")
    assert read.open_reader(path) is not read.open_reader(path)  # under KEEP_READER_BYTES: parsed each time


def test_at_most_a_few_readers_are_kept(tmp_path, monkeypatch):
    from quantkit.gguf import read

    monkeypatch.setattr(read, "KEEP_READER_BYTES", 0)
    monkeypatch.setattr(read, "_READERS", {})
    for i in range(read._READERS_MAX + 3):
        write_gguf(tmp_path / f"{i}.gguf", str(i))
        read.open_reader(tmp_path / f"{i}.gguf")
    assert len(read._READERS) == read._READERS_MAX
