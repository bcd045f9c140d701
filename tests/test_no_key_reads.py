"""Typed corridors: no module reads another module's result records by string key.

A result record is a class with both `to_json` and `from_json` (its fields are its JSON's keys).
A module reads such JSON by key when it subscripts (`x["tpot_ms"]`) or `.get("tpot_ms")`s with a
string constant that is a field of a record defined in a module it imports (a module that takes a
record imports its module, if only to name its type), and not a field of a record it defines
itself. It should read the record's attributes instead. Modules that import no result record's
module (the readers of a server's answers, /metrics, a model's config.json, GGUF metadata,
llama-bench's JSON, a YAML file before validation) are not scanned: their keys are not quantkit's.

Two lists say where a read by key stays:
- READS_EXTERNAL: modules that import a record's module and still read, by key, data that is not
  a record yet: the place a result file's raw JSON is checked and migrated before its records are
  built, or data from outside quantkit whose keys a record shares. Each says why.
- NOT_YET: modules that still read result JSON by key, with their count of such reads. A count
  may only go down: a new read by key fails here, and a module brought to zero leaves the list.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quantkit"

READS_EXTERNAL = {
    "quantkit.load.runfile": "a load-run file's raw JSON, checked and migrated before its records are built",
    "quantkit.bench.llama_bench": "llama-bench's own JSON, whose figures the Anchor record it builds is named after",
}

NOT_YET: dict[str, int] = {}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def _modules() -> dict[str, ast.Module]:
    return {_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def record_fields(tree: ast.Module) -> set[str]:
    """The fields of the result records a module defines."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            if {"to_json", "from_json"} <= methods:
                out |= {
                    n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                }
    return out


def imported(tree: ast.Module, names: set[str]) -> set[str]:
    """The quantkit modules a module imports (`from quantkit.x import y`: x, and x.y where it is a module)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quantkit"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out & names


def key_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, key) of every `x["key"]` read and `x.get("key")` with a string constant."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0] if node.args else None
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.append((node.lineno, key.value))
    return out


def foreign_reads(modules: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Per module, its reads by key of fields of records that other modules define."""
    fields = {name: record_fields(tree) for name, tree in modules.items()}
    found: dict[str, list[str]] = {}
    for name, tree in modules.items():
        near = imported(tree, set(modules))
        keys = {k: m for m in sorted(near - {name}) for k in fields[m]}
        own = fields[name]
        reads = [f"{line}: [{key!r}] ({keys[key]})" for line, key in key_reads(tree) if key in keys and key not in own]
        if reads:
            found[name] = reads
    return found


def test_no_module_reads_another_modules_records_by_key():
    found = foreign_reads(_modules())
    new = {m: reads for m, reads in found.items() if m not in READS_EXTERNAL and m not in NOT_YET}
    assert not new, "read the record's attributes, not its JSON by key:\n" + "\n".join(
        f"{m}:{read}" for m, reads in new.items() for read in reads
    )
    counts = Counter({m: len(reads) for m, reads in found.items() if m in NOT_YET})
    changed = {m: (NOT_YET[m], counts[m]) for m in NOT_YET if counts[m] != NOT_YET[m]}
    assert not changed, f"NOT_YET's counts (listed, found) changed; lower them, never raise them: {changed}"


def test_the_lists_name_modules_that_exist():
    modules = _modules()
    assert set(READS_EXTERNAL) <= set(modules) and set(NOT_YET) <= set(modules)
    assert not set(READS_EXTERNAL) & set(NOT_YET)


def test_a_new_read_by_key_in_the_report_fails(tmp_path):
    """`row["tpot_ms"]` added to pipeline/report.py (a BenchRow field read by key) is caught."""
    modules = _modules()
    source = (PACKAGE / "pipeline" / "report.py").read_text() + '\n\ndef _added(row):\n    return row["tpot_ms"]\n'
    modules["quantkit.pipeline.report"] = ast.parse(source)
    found = foreign_reads(modules)
    assert len(found["quantkit.pipeline.report"]) == NOT_YET.get("quantkit.pipeline.report", 0) + 1
    assert any("'tpot_ms'" in read for read in found["quantkit.pipeline.report"])


def test_a_read_by_key_in_a_load_reader_fails():
    """The terminal reads a run's steps as records: a key read there is caught."""
    modules = _modules()
    source = (PACKAGE / "load" / "terminal.py").read_text() + '\n\ndef _added(step):\n    return step["ttft_ms"]\n'
    modules["quantkit.load.terminal"] = ast.parse(source)
    assert "quantkit.load.terminal" in foreign_reads(modules)
