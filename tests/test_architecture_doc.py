"""docs/ARCHITECTURE.md's checkable claims hold: its layer table is the one tests/test_architecture.py
enforces, the registries it names exist where it says and have entries, every file it names exists,
and its capability table is the exporter registry's."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from test_architecture import LAYERS

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "ARCHITECTURE.md").read_text()


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert m, f"docs/ARCHITECTURE.md has no section {title!r}"
    return m.group(1)


def _rows(text: str) -> list[list[str]]:
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")
    ]
    return [r for r in rows[2:] if r]  # past the header and its rule


def test_the_layer_table_is_the_enforced_order():
    doc = {}
    for cells in _rows(_section("Layers")):
        for name in re.findall(r"`([^`]+)`", cells[1]):
            doc[name.rstrip("/").removesuffix(".py")] = int(cells[0])
    code = {k: v for k, v in LAYERS.items() if k not in ("__init__", "__main__")}
    assert doc == code


def _registries() -> list[tuple[str, str]]:
    found = []
    for cells in _rows(_section("Extension points").split("### ")[0]):
        path, *names = re.findall(r"`([^`]+)`", cells[1])
        found += [(path, n) for n in names]
    return found


def test_every_named_registry_exists_and_has_entries():
    regs = _registries()
    assert len(regs) >= 8
    for path, name in regs:
        module = "quantkit." + path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        value = getattr(importlib.import_module(module), name, None)
        assert isinstance(value, (dict, tuple)) and value, f"{path} {name}: no such registry"


def test_every_named_file_exists():
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.(?:py|toml|md))`", DOC))
    assert named
    missing = [p for p in named if not ((REPO / "quantkit" / p).exists() or (REPO / p).exists())]
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("claim", ["tests/test_pipeline_steps.py", "tests/test_export_registry.py"])
def test_the_tests_it_cites_exist(claim):
    assert (REPO / claim).is_file()


def test_the_capability_table_is_the_registrys():
    from quantkit.export.export_registry import capability_table

    assert capability_table() in DOC, "docs/ARCHITECTURE.md's capability table is stale: run scripts/render_docs.py"
