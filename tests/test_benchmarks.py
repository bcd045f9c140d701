"""benchmarks/: every script is a benchmark whose committed result a doc renders, or a part another
script or a test uses; no two scripts are the same file."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
# the parts: each used by another script or a test (its module imported, or its file run)
HELPERS = (
    "common",
    "render",
    "lever_tables",
    "rss",
    "vllm_bare",
    "shaped_checkpoint",
    "offgrid_model",
    "grid_check",
    "gguf_logits_agreement",
)
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))
DOCS = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
RENDERED = set(re.findall(r"<!-- results: ([A-Za-z0-9._-]+)#", DOCS))


def _commands(result: dict) -> list[str]:
    tables = result.get("tables", {}).values()
    return [result.get("command", ""), *((t.get("source") or {}).get("command", "") for t in tables)]


def _rendered_results(name: str) -> list[str]:
    found = []
    for path in sorted((BENCH / "results").glob("*.json")):
        result = json.loads(path.read_text())
        runs = any(re.match(rf"\S*python3?\S* benchmarks/{name}\.py\b", c) for c in _commands(result))
        if runs and path.stem in RENDERED:
            found.append(path.stem)
    return found


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in HELPERS])
def test_a_benchmark_has_a_result_a_doc_renders(name):
    assert _rendered_results(name), f"benchmarks/{name}.py: no committed result that a doc renders"


@pytest.mark.parametrize("name", HELPERS)
def test_a_part_is_used_by_another_script_or_a_test(name):
    assert name in SCRIPTS, f"benchmarks/{name}.py is gone: drop it from HELPERS"
    others = [BENCH / f"{s}.py" for s in SCRIPTS if s != name] + sorted((REPO / "tests").glob("test_*.py"))
    uses = re.compile(rf"\b(import {name}\b|from {name} import|{name}\.py)")
    assert any(uses.search(p.read_text()) for p in others), f"benchmarks/{name}.py: no other script or test uses it"


def test_no_two_scripts_are_twins():
    digests: dict[str, list[str]] = {}
    for s in SCRIPTS:
        digests.setdefault(hashlib.sha256((BENCH / f"{s}.py").read_bytes()).hexdigest(), []).append(s)
    assert [names for names in digests.values() if len(names) > 1] == []
