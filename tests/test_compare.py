"""`quantkit compare` on load runs a user gives: each file read through its typed record
(load/runfile.py LoadRun.from_json) where compare reads it, so a damaged one is one line naming the
file and the key, exit 2, never a KeyError or TypeError (exit 1)."""

import copy
import json
from pathlib import Path

import pytest

RUN = Path(__file__).parent / "load_fixtures" / "attribution_cb.json"  # a load run as quantkit load wrote it


DAMAGES = {
    "no steps": (lambda r: r.pop("steps"), "missing key 'steps'"),
    "steps null": (lambda r: r.__setitem__("steps", None), "steps must be a list"),
    "a step that is text": (lambda r: r["steps"].__setitem__(0, "x"), "steps[0] is not an object"),
    "offered as text": (lambda r: r["steps"][0].__setitem__("offered", "4"), "steps[0].offered"),
    "an unknown key": (lambda r: r.__setitem__("surprise", 1), "unknown key 'surprise'"),
    "schema 99": (lambda r: r.__setitem__("schema_version", 99), "schema_version 99"),
    'schema "1"': (lambda r: r.__setitem__("schema_version", "1"), "schema_version '1'"),
    "no config": (lambda r: r.pop("config"), "missing key 'config'"),
    "analysis a list": (lambda r: r.__setitem__("analysis", []), "analysis must be an object"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_load_run_is_one_line_naming_the_file(cli, tmp_path, damage):
    edit, says = DAMAGES[damage]
    good = tmp_path / "a.json"
    good.write_text(RUN.read_text())
    data = copy.deepcopy(json.loads(RUN.read_text()))
    edit(data)
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps(data))
    code, out, err, _ = cli("compare", str(good), str(bad), "--json")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(bad) in lines[0] and says in lines[0], (damage, err)
    assert out == "" and "Traceback" not in err


def test_two_good_load_runs_compare(cli, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(RUN.read_text())
    b.write_text(RUN.read_text())
    code, _, err, data = cli("compare", str(a), str(b), "--json", "--plot", str(tmp_path / "c.png"))
    assert code == 0, err
    assert data["kind"] == "load-comparison" and (tmp_path / "c.png").is_file()


def test_a_load_run_beside_a_file_that_is_no_result_names_the_file(cli, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(RUN.read_text())
    b.write_text("[1, 2]")
    code, _, err, _ = cli("compare", str(a), str(b))
    assert code == 2 and str(b) in err and "not a run report" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda r: r["analysis"].pop("knee"), "analysis.knee must be an object or null"),
        (lambda r: r["analysis"].__setitem__("peak", 3), "analysis.peak must be an object or null"),
        (lambda r: r["analysis"].__setitem__("degraded_first", None), "analysis.degraded_first must be an object"),
    ],
)
def test_what_compare_reads_of_the_analysis_is_checked(cli, tmp_path, edit, says):
    data = json.loads(RUN.read_text())
    edit(data)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(RUN.read_text())
    b.write_text(json.dumps(data))
    code, _, err, _ = cli("compare", str(a), str(b))
    assert code == 2 and str(b) in err and says in err and len(err.strip().splitlines()) == 1, err
