"""Docs speak of the product and their figures come from result files: every marked table equals
its rendering from benchmarks/results/, every result file names its command, machine and date, and
no page names a path of a particular machine or how the work was organised."""

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import render  # noqa: E402


def test_every_marked_table_is_its_result_file_rendered():
    assert render.main(["--check"]) == 0


def test_a_table_that_drifts_from_its_file_is_caught(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    table = {"columns": [{"key": "v", "header": "value", "fmt": "{:.2f}"}], "rows": [{"v": 1.0}]}
    (results / "r.json").write_text(
        json.dumps(
            {
                "command": "python x.py",
                "machine": {"cpu": "c", "cores": 2},
                "date": "2026-01-01",
                "tables": {"main": table},
            }
        )
    )
    monkeypatch.setattr(render, "RESULTS", results)
    page = "<!-- results: r#main -->\n<!-- /results -->\n"
    rendered = render.render_text(page, "p.md")
    assert "| 1.00 |" in rendered and "python x.py" in rendered
    assert render.render_text(rendered, "p.md") == rendered  # rendering is idempotent
    assert render.render_text(rendered.replace("1.00", "1.50"), "p.md") == rendered  # a hand edit is overwritten


def test_a_table_an_earlier_run_made_names_that_run(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    table = {"columns": [{"key": "v", "header": "value", "fmt": "{}"}], "rows": [{"v": 1}]}
    earlier = {
        **table,
        "source": {"command": "python x.py --eval", "machine": {"cpu": "e", "cores": 4}, "date": "2025-12-31"},
    }
    (results / "r.json").write_text(
        json.dumps(
            {
                "command": "python x.py --bench",
                "machine": {"cpu": "c", "cores": 2},
                "date": "2026-01-01",
                "tables": {"main": table, "kept": earlier},
            }
        )
    )
    monkeypatch.setattr(render, "RESULTS", results)
    rendered = render.render_text(
        "<!-- results: r#main -->\n<!-- /results -->\n<!-- results: r#kept -->\n<!-- /results -->\n", "p.md"
    )
    main, kept = rendered.split("<!-- results: r#kept -->")
    assert "python x.py --bench" in main and "2026-01-01" in main
    assert "python x.py --eval" in kept and "2025-12-31" in kept and "e, 4 cores" in kept and "--bench" not in kept


def test_result_files_record_command_machine_and_date():
    for path in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        assert result.get("command") and result.get("date"), path.name
        assert result.get("machine", {}).get("cpu") and result["machine"].get("cores"), path.name


def test_the_repository_speaks_only_of_the_product():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    # written in pieces so that this file does not match itself
    pattern = re.compile(
        "|".join(["issue [0-9]+", "this" + " session", "/" + "work/", "/" + "root/", r"\.\./" + "shared"]), re.I
    )
    hits = []
    for name in files:
        path = REPO / name
        if not path.is_file() or path.suffix in (".png", ".whl", ".gguf", ".safetensors"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [
            f"{name}:{i}: {line.strip()[:80]}" for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)
        ]
    assert not hits, "\n".join(hits[:20])


def test_the_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300
