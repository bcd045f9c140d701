"""`quantkit compare` reads run reports through pipeline/run_report.py: a report that is not what a
run writes (a schema it does not read, an unknown or missing key, a value of the wrong type, a file
that is not a report at all) is one line naming the file and the key, exit 2, never a traceback."""

import copy
import json
import re
from pathlib import Path

import pytest

from quantkit.core.record_checks import RecordError
from quantkit.pipeline.run_report import read_report

ROW = {
    "name": "int4",
    "status": "ok",
    "error": None,
    "engine": "compiled",
    "tpot_ms": 2.5,
    "ttft_ms": 10.0,
    "predicted_tpot_ms": 1.0,
    "tpot_efficiency_pct": 40.0,
    "delta_ppl_pct": 1.5,
    "kld_mean": 0.01,
    "kl_kind": "exact",
    "bits_per_weight": 4.25,
}
REPORT = {
    "kind": "quantkit-run",
    "schema_version": 4,
    "recipe": "suite",
    "model": "/m",
    "date": "2026-01-01 00:00:00",
    "host": "h",
    "device": {"name": "cpu"},
    "fit": {"effective_gbps": 20.0, "overhead_ms": 0.5, "r2": 0.99},
    "rows": [{**ROW, "name": "fp16", "kld_mean": 0.0}, ROW],
    "variants": {},
}


def _write(d: Path, data) -> Path:
    d.mkdir(parents=True)
    (d / "report.json").write_text(json.dumps(data) if not isinstance(data, str) else data)
    return d


DAMAGES = {
    "schema_version 99": (lambda r: r.__setitem__("schema_version", 99), "schema_version 99"),
    "schema_version 0": (lambda r: r.__setitem__("schema_version", 0), "schema_version 0"),
    'schema_version "4"': (lambda r: r.__setitem__("schema_version", "4"), "schema_version '4'"),
    "schema_version true": (lambda r: r.__setitem__("schema_version", True), "schema_version True"),
    "an unknown key": (lambda r: r.__setitem__("surprise", 1), "unknown key 'surprise'"),
    "no rows": (lambda r: r.pop("rows"), "missing key 'rows'"),
    "no recipe": (lambda r: r.pop("recipe"), "missing key 'recipe'"),
    "rows null": (lambda r: r.__setitem__("rows", None), ".rows: expected a list, not null"),
    "rows an object": (lambda r: r.__setitem__("rows", {}), ".rows: expected a list"),
    "a row without a name": (lambda r: r["rows"][1].pop("name"), "rows[1]: missing key 'name'"),
    "a row that is a list": (lambda r: r["rows"].__setitem__(0, []), "rows[0]: expected a JSON object"),
    "a name that is a number": (lambda r: r["rows"][0].__setitem__("name", 7), "rows[0].name"),
    "a TPOT that is text": (lambda r: r["rows"][1].__setitem__("tpot_ms", "fast"), "rows[1].tpot_ms"),
    "a negative KL": (lambda r: r["rows"][1].__setitem__("kld_mean", -1.0), "rows[1].kld_mean"),
    "a device that is text": (lambda r: r.__setitem__("device", "cpu"), ".device: expected an object"),
    "a fit that is a list": (lambda r: r.__setitem__("fit", [1]), ".fit: expected an object"),
    "a fit without its r2": (lambda r: r["fit"].pop("r2"), "fit: an effective bandwidth without"),
    "a host that is null": (lambda r: r.__setitem__("host", None), ".host: expected a string"),
    "a kind that is not a run's": (lambda r: r.__setitem__("kind", "bench"), "not a run report"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_report_is_one_line_naming_the_file_and_key(cli, tmp_path, damage):
    edit, says = DAMAGES[damage]
    good = _write(tmp_path / "a", REPORT)
    bad_report = copy.deepcopy(REPORT)
    edit(bad_report)
    bad = _write(tmp_path / "b", bad_report)
    code, out, err, _ = cli("compare", str(good), str(bad), "--json")
    assert code == 2, (damage, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(bad / "report.json") in lines[0] and says in lines[0], (damage, err)
    assert out == ""


@pytest.mark.parametrize(
    "content, says",
    [
        ("[1, 2, 3]", "not a run report"),
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ("null", "not a run report"),
        ('"text"', "not a run report"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_file_that_is_no_report_is_one_line(cli, tmp_path, content, says):
    good = _write(tmp_path / "a", REPORT)
    bad = _write(tmp_path / "b", content)
    code, _, err, _ = cli("compare", str(good), str(bad))
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert "Traceback" not in err


def test_a_good_report_compares(cli, tmp_path):
    a, b = _write(tmp_path / "a", REPORT), _write(tmp_path / "b", {**REPORT, "schema_version": 1})
    code, _, err, data = cli("compare", str(a), str(b), "--json")
    assert code == 0, err
    assert [v["variant"] for v in data["variants"]] == ["fp16", "int4"]


def test_the_reader_names_where_it_read():
    with pytest.raises(RecordError, match="^somewhere: expected a JSON object"):
        read_report([], "somewhere")


def test_compare_reads_the_report_as_records():
    """cli/compare_cmd.py takes RunReports (their rows as ReportRows): no report key read from the JSON."""
    source = (Path(__file__).resolve().parents[1] / "quantkit" / "cli" / "compare_cmd.py").read_text()
    assert not re.search(
        r"""\[\s*["'](rows|name|engine|schema_version)["']\s*\]|\.get\(\s*["'](rows|name|engine|schema_version)["']""",
        source,
    )


def test_a_schema_1_row_holds_the_bound():
    report = read_report(
        {"kind": "quantkit-run", "recipe": "r", "date": "d", "host": "h", "rows": [{"name": "a", "kld_mean": 0.1}]}, "r"
    )
    assert report.schema_version == 1 and report.rows[0].kl_kind == "topk-256 lower bound"
    assert report.rows[0].figures()["kld_mean"] == 0.1
