"""`quantkit run`'s steps read the runner and return what they made; the runner alone records it
(pipeline/run.py). Checked on the source (no step writes through a `runner` argument) and by
running a step against a runner that cannot be written."""

from __future__ import annotations

import ast
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest

from quantkit.pipeline import serving

PIPELINE = Path(__file__).resolve().parents[1] / "quantkit" / "pipeline"
STEPS = ("serving.py", "report.py", "run_costs.py", "pareto_costs.py", "pareto.py")  # functions taking a runner
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
    recipe = SimpleNamespace(export=SimpleNamespace(formats=("gguf",)))
    runner = SimpleNamespace(
        recipe=recipe,
        dir=tmp_path,
        cache=ReadOnlyCache({}),
        opts=SimpleNamespace(rerun=False),
        variants=MappingProxyType({}),
    )
    made = serving.export_format(runner, "gguf", "base", tiny_llama)
    assert made.key and Path(made.value["gguf"]) == tmp_path / "gguf" / "base.gguf" and made.value["sha256"]
    runner.cache = ReadOnlyCache({made.key: made.value})  # stored by the runner: the step now reuses it
    again = serving.export_format(runner, "gguf", "base", tiny_llama)
    assert again.key is None and again.value == made.value
