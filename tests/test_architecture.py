"""The dependency direction of the package, read from the source with ast.

Every import counts, at any depth: module level, inside functions (lazy imports), under
`if TYPE_CHECKING:`. A lazy import that hides a cycle still is a cycle.

Edges: `import quantkit.a.b` and `from quantkit.a.b import x` depend on quantkit.a.b;
`from quantkit.a import b` depends on quantkit.a.b when b is a submodule, and on the
package's __init__ (quantkit.a) for a name defined there. A package's __init__ is a module
like any other.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "quantkit"

# The single source of the layer order: a module may import from its own layer or below.
# Keys are the first component under quantkit (a root module or a package).
LAYERS: dict[str, int] = {
    "__init__": 0, "errors": 0, "home": 0, "progress": 0, "quiet": 0, "device": 0,
    "core": 1, "resources": 1,
    "models": 2, "data": 2,
    "recipe": 3, "methods": 3, "gqa": 3,
    "artifacts": 4, "gguf": 4,
    "quantize": 5, "evals": 5, "bench": 5,
    "load": 6, "plan": 6,
    "pipeline": 7,
    "cli": 8, "__main__": 8,
}


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported module
    line: int
    text: str  # the import statement as written

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}  ({_path(self.src)}:{self.line}: {self.text})"


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _path(mod: str) -> str:
    return str(modules()[mod].relative_to(ROOT.parent))


def _is_package(mod: str) -> bool:
    return modules()[mod].name == "__init__.py"


def _resolve(cur: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names."""
    if not node.level:
        return node.module or ""
    pkg = cur if _is_package(cur) else cur.rpartition(".")[0]
    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@lru_cache(maxsize=None)
def _tree(mod: str) -> ast.Module:
    return ast.parse(modules()[mod].read_text(), filename=str(modules()[mod]))


@lru_cache(maxsize=None)
def _source_lines(mod: str) -> list[str]:
    return modules()[mod].read_text().splitlines()


def _statement(mod: str, node: ast.stmt) -> str:
    lines = _source_lines(mod)[node.lineno - 1: node.end_lineno]
    return " ".join(s.strip() for s in lines)


def _targets(mod: str, node: ast.stmt) -> list[tuple[str, str | None]]:
    """(imported module, name taken from it or None) for one import statement."""
    mods = modules()
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name in mods]
    base = _resolve(mod, node)
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        if sub in mods:
            out.append((sub, None))
        elif base in mods:
            out.append((base, a.name))
    return out


def _imports(mod: str):
    for node in ast.walk(_tree(mod)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


@lru_cache(maxsize=None)
def edges() -> tuple[Edge, ...]:
    out = []
    for mod in modules():
        for node in _imports(mod):
            seen = set()
            for dst, _ in _targets(mod, node):
                if dst != mod and dst not in seen:
                    seen.add(dst)
                    out.append(Edge(mod, dst, node.lineno, _statement(mod, node)))
    return tuple(out)


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def _layer_key(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module_visible(mod: str, target: str) -> bool:
    """A private module (`_torch.py`) serves its own package: siblings and their children."""
    parts = target.split(".")
    for i, p in enumerate(parts):
        if _is_private(p):
            owner = ".".join(parts[:i])
            if not (mod == owner or mod.startswith(owner + ".")):
                return False
    return True


def _module_bindings(mod: str) -> dict[str, str]:
    """Local names bound to quantkit modules by this file's imports."""
    mods, out = modules(), {}
    for node in _imports(mod):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        else:
            for dst, name in _targets(mod, node):
                if name is None:
                    alias = next(a for a in node.names if dst.endswith("." + a.name))
                    out[alias.asname or alias.name] = dst
    return out


def _dotted(node: ast.expr) -> list[str] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + names[::-1]


def private_uses() -> list[str]:
    mods, out = modules(), []
    for mod in mods:
        for node in _imports(mod):
            for dst, name in _targets(mod, node):
                if dst == mod:
                    continue
                if name is not None and _is_private(name):
                    out.append(f"{mod} imports private {name!r} from {dst}  "
                               f"({_path(mod)}:{node.lineno}: {_statement(mod, node)})")
                elif not _private_module_visible(mod, dst):
                    out.append(f"{mod} imports private module {dst}  "
                               f"({_path(mod)}:{node.lineno}: {_statement(mod, node)})")
        bound = _module_bindings(mod)
        for node in ast.walk(_tree(mod)):
            if not isinstance(node, ast.Attribute):
                continue
            chain = _dotted(node)
            if not chain or chain[0] not in bound:
                continue
            target = bound[chain[0]]
            for attr in chain[1:]:
                if f"{target}.{attr}" in mods:
                    target = f"{target}.{attr}"
                    continue
                if _is_private(attr) and target != mod:
                    out.append(f"{mod} uses private {target}.{attr}  ({_path(mod)}:{node.lineno})")
                break
    return sorted(set(out))


def test_every_module_has_a_layer():
    missing = sorted({_layer_key(m) for m in modules()} - set(LAYERS))
    assert not missing, f"packages or root modules with no layer in LAYERS: {missing}"


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for e in edges():
        graph[e.src].add(e.dst)
    cycles = [c for c in _sccs(graph) if len(c) > 1]
    report = []
    for comp in cycles:
        inside = [str(e) for e in edges() if e.src in comp and e.dst in comp]
        report.append(f"cycle among {comp}:\n    " + "\n    ".join(inside))
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(report)


def test_no_private_names_across_modules():
    found = private_uses()
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_no_import_from_a_higher_layer():
    up = [f"layer {LAYERS[_layer_key(e.src)]} imports layer {LAYERS[_layer_key(e.dst)]}: {e}"
          for e in edges()
          if _layer_key(e.src) in LAYERS and _layer_key(e.dst) in LAYERS
          and LAYERS[_layer_key(e.dst)] > LAYERS[_layer_key(e.src)]]
    assert not up, "imports against the layer order:\n" + "\n".join(up)
