"""benchmarks/own_speed.py's arithmetic: what it reads from the tools' output and the tables it writes."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
own_speed = pytest.importorskip("own_speed")


def test_it_reads_llama_perplexitys_timing_and_quantkits_calibration_line():
    log = "llama_perf_context_print: prompt eval time =    8123.45 ms /  8192 tokens (    0.99 ms per token)"
    m = own_speed.PROMPT_EVAL.search(log)
    assert float(m.group(1)) == 8123.45 and int(m.group(2)) == 8192
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
