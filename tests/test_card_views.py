"""The model card's view of quantkit.json (artifacts/card_views.py): what bench, the calibration and
the auto mixed-precision search stored, read once into records; an older artifact's missing key is
None, a damaged section one line."""

import json
from pathlib import Path

import pytest

from quantkit.artifacts.card import mixed_precision_table, results_table
from quantkit.artifacts.card_views import BenchFigures, CalibrationFigures, MixedPrecisionFigures
from quantkit.bench.bench_records import BenchResult
from quantkit.core.record_checks import RecordError

V2 = Path(__file__).with_name("bench_v2.json")


def test_a_stored_bench_row_is_read_into_the_figures_the_card_shows():
    row = BenchResult.from_json(json.loads(V2.read_text())).rows[0]
    b = BenchFigures.from_json(row.to_json())
    assert (b.prompt_len, b.engine, b.tpot_ms, b.kernel) == (row.prompt_len, row.engine, row.tpot_ms, row.kernel)
    table = results_table({"bench": row.to_json()})
    assert f"| TPOT (batch 1) | {row.tpot_ms:.2f} ms" in table and f"{row.prompt_len}-token prompt" in table


def test_an_older_stored_row_shows_what_it_has():
    """A row written before a figure existed: that cell is n/a, the others shown."""
    table = results_table({"bench": {"tpot_ms": 12.5, "engine": "eager"}})
    assert "| TPOT (batch 1) | 12.50 ms (roofline n/a ms) |" in table and "| kernel | n/a |" in table


@pytest.mark.parametrize("section", [[1, 2], "text", 3])
def test_a_section_that_is_not_an_object_is_one_line(section):
    for view in (BenchFigures, CalibrationFigures, MixedPrecisionFigures):
        with pytest.raises(RecordError, match="expected a JSON object"):
            view.from_json(section)


def test_calibration_text_and_a_mix_per_domain():
    one = CalibrationFigures.from_json({"source": "file:a.txt", "samples": 4, "seq_len": 64, "seed": 0})
    assert (one.text, one.samples, one.seq_len, one.domains) == ("file:a.txt", 4, 64, None)
    assert CalibrationFigures.from_json(one.to_json()) == one
    mix = CalibrationFigures.from_json({"source": "mix", "domains": {"code": 2}, "left_out": [{"name": "law"}, 3]})
    assert mix.domains == {"code": 2} and mix.left_out_names() == ["law"]


def test_mixed_precision_prefers_the_measured_bits_and_groups_layers_by_unit():
    record = {
        "base": "w4g128",
        "choices": ["w8g128"],
        "budget_bits": 5.0,
        "bits_per_weight": 4.9,
        "measured_bits_per_weight": 4.95,
        "picked": [{"layer": 3, "unit": "mlp", "scheme": "w8g128"}, {"layer": 1, "unit": "mlp", "scheme": "w8g128"}],
        "ranking": [
            {"layer": 3, "unit": "mlp", "chosen": "w8g128", "kl": 0.1},
            {"layer": 1, "unit": "mlp", "chosen": "w8g128", "kl": 0.05},
            {"layer": 0, "unit": "attn", "chosen": "w4g128", "kl": 0.01},
        ],
        "windows": {"used": 8, "seq_len": 256, "text": {"source": "file:/home/u/t.txt"}},
    }
    mp = MixedPrecisionFigures.from_json(record)
    assert mp.bits_per_weight == 4.95 and mp.raised == 2 and (mp.windows_used, mp.windows_seq_len) == (8, 256)
    lines = mixed_precision_table(record)
    assert "2 of 3 units raised above w4g128" in lines[2] and "4.9500 stored" in lines[2]
    assert "file:t.txt" in lines[2] and "/home/u" not in lines[2]  # a card never shows a local path
    assert "| w8g128 | 2 | mlp: 1, 3 |" in lines and "| w4g128 (base) | 1 | the others |" in lines
