"""benchmarks/own_speed.py's arithmetic: what it reads from the tools' output and the tables it writes."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
own_speed = pytest.importorskip("own_speed")


def test_it_reads_llama_perplexitys_log_and_quantkits_calibration_line():
    stderr = (
        "0.00.223.094 I perplexity: tokenizing the input ..\n"
        "0.00.458.740 I perplexity: tokenization took 235.624 ms\n"
        "0.00.458.940 I perplexity: calculating perplexity over 16 chunks, n_ctx=512, batch_size=512, n_seq=1\n"
    )
    assert own_speed.passes_start(stderr) == pytest.approx(0.45894)
    kld = "0.00.235.455 I kl_divergence: computing over 16 chunks, n_ctx=512, batch_size=512, n_seq=1\n"
    assert own_speed.passes_start("1.02.003.000 I kl_divergence: computing over 4 chunks\n") == pytest.approx(62.003)
    assert own_speed.passes_start(kld) == pytest.approx(0.235455)
    assert own_speed.passes_start("no such line") is None
    stdout = "====== KL divergence statistics ======\nMean    KLD:   0.213456 ±   0.001234\nMaximum KLD:  10.5\n"
    assert own_speed.mean_kld(stdout) == 0.213456 and own_speed.mean_kld("") is None
    m = own_speed.LAYER_LINE.search(
        "gptq: calibrating layer 29/30: 29/30 (201 s)\ngptq: calibrating: done 30/30 in 211 s"
    )
    assert m.groups() == ("30", "30", "211")


def test_the_tables_put_each_figure_beside_its_anchor():
    ev = {
        "rows": [
            {"pass": "p", "quantkit": "q", "quantkit_tps": 200.0, "anchor": "a", "anchor_tps": 400.0, "ratio": 0.5}
        ],
        "note": "n",
    }
    cv = {"rows": [{"what": "w", "s": 60.0, "per_layer_s": 2.0, "ratio": 1.1}], "note": "m"}
    t = own_speed.tables(ev, cv)
    assert [c["key"] for c in t["eval"]["columns"]] == [
        "pass",
        "quantkit",
        "quantkit_tps",
        "anchor",
        "anchor_tps",
        "ratio",
    ]
    assert t["convert"]["rows"] == cv["rows"] and t["eval"]["note"] == "n"
    assert own_speed.tables(None, cv).keys() == {"convert"}


def test_only_one_part_keeps_the_others_table_naming_its_own_run(tmp_path):
    old = {
        "command": "python benchmarks/own_speed.py --out runs/own-speed",
        "machine": {"cpu": "x"},
        "date": "2026-01-01T00:00:00Z",
        "eval": {"rows": [1]},
        "convert": {"rows": [2]},
        "tables": {"eval": {"rows": [1]}, "convert": {"rows": [2], "note": "c"}},
    }
    path = tmp_path / "own_speed.json"
    path.write_text(json.dumps(old))
    body = {"eval": {"rows": [3]}, "convert": None, "tables": {"eval": {"rows": [3]}}}
    kept = own_speed.keep_other(body, "eval", path)
    assert kept["eval"] == {"rows": [3]} and kept["convert"] == {"rows": [2]}
    assert kept["tables"]["convert"]["source"] == {k: old[k] for k in ("command", "machine", "date")}
    assert kept["tables"]["eval"] == {"rows": [3]}
    assert own_speed.keep_other(body, "eval", tmp_path / "none.json") is body
