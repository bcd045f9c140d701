"""The bench's typed records (bench/bench_records.py): one JSON form each, a schema version, files of
schemas 2 to 5 still read, and a typo or a missing key refused in one line where a file is read."""

import copy
import json
from pathlib import Path

import pytest

from quantkit.bench.bench_records import SCHEMA_VERSION, BenchResult, BenchRow
from quantkit.core.record_checks import RecordError

V2 = Path(__file__).with_name("bench_v2.json")  # what `quantkit bench --json` wrote at schema 2 (a tiny Llama, eager)


def _v2() -> dict:
    return json.loads(V2.read_text())


def test_a_schema_2_result_still_reads():
    r = BenchResult.from_json(_v2())
    row = r.rows[0]
    assert r.schema_version == SCHEMA_VERSION == 6 and r.kind == "bench"
    assert row.name == "llama-gqa" and row.engine == "eager" and row.tpot_ms > 0
    assert row.depth is None and row.flash_attn is None and row.weight_bytes_by_type is None
    assert row.kv_cache is None  # the eager engine's cache type was not recorded then
    assert row.prompt_sweep[0].prompt_len == 4 and row.prompt_sweep[0].ttft_ms.n >= 1
    assert r.failed[0].name == "short" and r.failed[0].self_check is None
    assert r.fit.points == 1 and r.fit.r2 is None and r.fit.measured_over_model == ()  # refitted: one row
    assert row.attribution is None and row.attribution_missing and row.disturbed == ()
    assert row.cpu_variant is None  # the eager engine's CPU kernels were not recorded then
    assert r.device.bandwidth_gbps > 0 and r.load_average.cpus and r.plot is None


def test_the_keys_scripts_read_stay_and_a_result_reads_back_equal():
    old = _v2()
    r = BenchResult.from_json(old)
    new = r.to_json()
    assert new["schema_version"] == 6 and set(old["rows"][0]) <= set(new["rows"][0]) and set(old) <= set(new)
    assert {k: new["rows"][0][k] for k in old["rows"][0]} == old["rows"][0]
    assert BenchResult.from_json(json.loads(json.dumps(new))) == r


def test_a_schema_2_llama_cpp_row_keeps_its_flash_attention_and_tensor_types():
    old = _v2()
    row = old["rows"][0]
    row.update(engine="llamacpp", weight_bytes_by_type={"Q4_0": 1000, "F16": 500})
    row["engine_info"] = {**row["engine_info"], "flash_attn": False}
    got = BenchResult.from_json(old).rows[0]
    assert got.flash_attn is False and got.weight_bytes_by_type == {"Q4_0": 1000, "F16": 500}


def test_a_schema_3_row_gains_its_kv_cache_type_from_llama_cpp_engine_info():
    v3 = BenchResult.from_json(_v2()).to_json()
    v3["schema_version"] = 3
    v3["fit"] = {"effective_gbps": None, "overhead_ms": None, "r2": None, "points": 1, "slope_s_per_byte": None,
                 "measured_over_line": []}  # fmt: skip
    for row in v3["rows"]:
        for key in ("kv_cache", "attribution", "attribution_missing", "disturbed", "prefill_fit"):
            row.pop(key)
    llama = copy.deepcopy(v3["rows"][0])
    llama.update(engine="llamacpp", engine_info={**llama["engine_info"], "kv_cache_type": "F16"})
    v3["rows"].append(llama)
    got = BenchResult.from_json(v3)
    assert [r.kv_cache for r in got.rows] == [None, "f16"] and got.schema_version == 6
    with pytest.raises(RecordError, match="missing key 'kv_cache'"):  # a schema-4 row must hold it
        BenchResult.from_json({**v3, "schema_version": 4})


def test_a_schema_5_row_gains_the_cpu_variant_llama_cpp_recorded():
    """Schema 6 names each row's CPU variant; a schema-5 llama.cpp row recorded it in engine_info
    (the verdict as one line), the torch engines did not."""
    v5 = BenchResult.from_json(_v2()).to_json()
    v5["schema_version"] = 5
    for row in v5["rows"]:
        row.pop("cpu_variant")
    llama = copy.deepcopy(v5["rows"][0])
    info = {"cpu_variant": "zen4 (fallback); sapphirerapids died of SIGILL"}
    llama.update(engine="llamacpp", engine_info={**llama["engine_info"], **info})
    wheel = copy.deepcopy(llama)
    wheel["engine_info"]["cpu_variant"] = "one CPU build (no run-time dispatch)"
    v5["rows"] += [llama, wheel]
    got = BenchResult.from_json(v5)
    assert [r.cpu_variant for r in got.rows] == [None, "zen4", "one CPU build"] and got.schema_version == 6
    assert got.rows[1].engine_info.own["cpu_variant"] == info["cpu_variant"]  # the whole verdict stays
    with pytest.raises(RecordError, match="missing key 'cpu_variant'"):  # a schema-6 row must hold it
        BenchResult.from_json({**v5, "schema_version": 6})


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d["rows"][0].__setitem__("tpot_mss", d["rows"][0].pop("tpot_ms")), "unknown key 'tpot_mss'"),
        (lambda d: d["rows"][0].pop("kernel"), "missing key 'kernel'"),
        (lambda d: d["device"].pop("bandwidth_gbps"), "bench device block: missing key 'bandwidth_gbps'"),
        (lambda d: d.__setitem__("fitt", d.pop("fit")), "bench result: unknown key 'fitt'"),
        (lambda d: d["fit"].__setitem__("r_2", 1.0), "rule-check fit: unknown key 'r_2'"),
        (lambda d: d.__setitem__("schema_version", 9), "bench result of schema 9"),
        (lambda d: d.__setitem__("kind", "eval"), "not a bench result"),
    ],
)
def test_a_key_that_is_not_the_schemas_is_one_line(edit, needle):
    current = BenchResult.from_json(_v2()).to_json()
    for data in (_v2(), current):
        data = copy.deepcopy(data)
        edit(data)
        with pytest.raises(RecordError, match=needle) as info:
            BenchResult.from_json(data)
        assert "\n" not in str(info.value)


def test_a_row_is_frozen():
    row = BenchResult.from_json(_v2()).rows[0]
    with pytest.raises(AttributeError):
        row.tpot_ms = 1.0
    assert BenchRow.from_json(row.to_json()) == row


def test_a_new_column_is_its_field(monkeypatch):
    """A figure that is a BenchRow field carrying its columns shows in quantkit bench's table and CSV
    and in the run report's table, and travels in both JSON files, with nothing else told of it."""
    from dataclasses import make_dataclass, replace

    from quantkit.bench import bench_records
    from quantkit.bench.bench_columns import BENCH, REPORT, Column, shown_as
    from quantkit.cli.bench_cmd import render
    from quantkit.pipeline.report import markdown_table, variant_row
    from quantkit.pipeline.variant_record import VariantRecord

    toy = shown_as(Column(BENCH, "toy", "µs", digits=3), Column(REPORT, "toy", "µs", fmt="{:.3f}"), default=0.0)
    row_type = make_dataclass("BenchRow", [("toy_us", float, toy)], bases=(BenchRow,), frozen=True)
    result = BenchResult.from_json(_v2())  # a file from before the field (reading it would be a migration's work)
    monkeypatch.setattr(bench_records, "BenchRow", row_type)  # the field, on the record
    result = replace(result, rows=tuple(row_type(**r.__dict__, toy_us=1.23456) for r in result.rows))
    again = BenchResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.rows[0].toy_us == 1.23456 and again == result

    table = render(result, "md").splitlines()
    header = next(line for line in table if line.startswith("| variant"))
    assert header.endswith("| toy µs |") and table[table.index(header) + 2].endswith("| 1.235 |")
    csv_head, csv_row = render(result, "csv").splitlines()[:2]
    assert csv_head.endswith(",toy µs") and csv_row.endswith(",1.235")

    row = variant_row(VariantRecord("int4", bench=result.rows[0]))
    assert row["toy_us"] == 1.23456
    header, _, line = markdown_table([row]).splitlines()
    assert "| bound | toy µs | ΔPPL % |" in header and "| 1.235 |" in line
