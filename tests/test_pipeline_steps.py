"""`quantkit run`'s steps take their inputs and return what they made; the runner alone records it
and writes the report (pipeline/run.py). Checked on the source (the serving steps and the report
take no runner; no step writes through a `runner` argument) and by running a step against a step
cache that cannot be written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from quantkit.pipeline import serving

PIPELINE = Path(__file__).resolve().parents[1] / "quantkit" / "pipeline"
STEPS = (
    "serving.py",
    "report.py",
    "report_data.py",
    "run_costs.py",
    "pareto_costs.py",
    "pareto.py",
)  # functions taking a runner
WRITES = {"put", "setdefault", "update", "append", "extend", "pop", "clear", "__setitem__"}


def _rooted_in_runner(node: ast.AST) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and node.id == "runner"


def writes_through_runner(source: str) -> list[int]:
    """Lines that assign to, or call a mutating method on, anything reached from a name `runner`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            targets = [node.func.value]
        lines += [
            node.lineno for t in targets if isinstance(t, (ast.Attribute, ast.Subscript)) and _rooted_in_runner(t)
        ]
    return lines


def test_the_check_sees_a_write():
    assert writes_through_runner("def f(runner):\n    runner.cache.put(1, 2)\n") == [2]
    assert writes_through_runner("def f(runner):\n    runner.variants['a']['b'] = 1\n") == [2]
    assert writes_through_runner("def f(runner):\n    runner.timings.setdefault('a', 1)\n") == [2]
    assert writes_through_runner("def f(runner):\n    x = runner.cache.get(1)\n    x['a'] = 2\n") == []


def _takes_a_runner(source: str) -> list[str]:
    """The functions that have a parameter named `runner`."""
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and any(a.arg == "runner" for a in node.args.args + node.args.kwonlyargs)
    ]


@pytest.mark.parametrize("name", ("serving.py", "report.py", "report_data.py"))
def test_the_serving_steps_and_the_report_take_their_inputs_not_the_runner(name):
    assert _takes_a_runner((PIPELINE / name).read_text()) == [], f"pipeline/{name}: a step takes the runner"


@pytest.mark.parametrize("name", ("report.py", "report_data.py"))
def test_the_report_writes_no_file(name):
    """report.json, report.md and the model cards are the runner's to write (Runner._finish)."""
    source = (PIPELINE / name).read_text()
    assert "write_json(" not in source and "write_text(" not in source and "update_card_results(" not in source
    assert ".mkdir(" not in source


@pytest.mark.parametrize("name", STEPS)
def test_no_step_writes_the_runner(name):
    assert writes_through_runner((PIPELINE / name).read_text()) == [], f"pipeline/{name} writes the runner's state"


class ReadOnlyCache:
    def __init__(self, data):
        self.data = data

    def get(self, key):
        return self.data.get(key)

    def read(self, key, reader, what):
        return reader(self.data[key]) if key in self.data else None

    def put(self, key, value):
        raise AssertionError("a step stored a result itself")


def test_an_export_step_returns_what_it_made(tiny_llama, tmp_path):
    out = tmp_path / "gguf"
    out.mkdir()
    made = serving.export_format("gguf", "base", tiny_llama, out_dir=out, stored=serving.Stored(ReadOnlyCache({})))
    assert made.key and Path(made.value["gguf"]) == out / "base.gguf" and made.value["sha256"]
    stored = serving.Stored(ReadOnlyCache({made.key: made.value}))  # stored by the runner: the step now reuses it
    again = serving.export_format("gguf", "base", tiny_llama, out_dir=out, stored=stored)
    assert again.key is None and again.value == made.value
    rerun = serving.export_format("gguf", "base", tiny_llama, out_dir=out, stored=serving.Stored(stored.cache, True))
    assert rerun.key == made.key  # --rerun: the stored result is not read
