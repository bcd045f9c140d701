"""The dependency direction of the package, read from its source with ast.

Every import counts, at any depth: module level, inside functions (lazy imports), under
`if TYPE_CHECKING:`. A lazy import that hides a cycle still is a cycle.

Edges: `import quantkit.a.b` and `from quantkit.a.b import x` depend on quantkit.a.b;
`from quantkit.a import b` depends on the package quantkit.a (its __init__, where Python looks
`b` up first) and on quantkit.a.b when b is a submodule. A package's __init__ is a module like
any other, so one that imports its submodules must not be imported from by them.

Private names: `from x import _y` across modules, and `m._y` where m is a quantkit module this
file imported. A private module (`_torch.py`) may be imported by its own package only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "quantkit"

# The single source of the layer order (docs/ARCHITECTURE.md shows it): a module may import from
# its own layer or a lower one, never a higher one. Keys are the first name under quantkit (a
# package or a root module); "__init__" is quantkit/__init__.py.
LAYERS: dict[str, int] = {
    "__init__": 0,
    "errors": 0,
    "home": 0,
    "progress": 0,
    "quiet": 0,
    "device": 0,
    "core": 1,
    "resources": 1,
    "models": 2,
    "data": 2,
    "recipe": 3,
    "methods": 3,
    "gqa": 3,
    "artifacts": 4,
    "gguf": 4,
    "external": 4,
    "quantize": 5,
    "evals": 5,
    "bench": 5,
    "load": 6,
    "costs": 6,
    "export": 6,
    "pipeline": 7,
    "cli": 8,
    "__main__": 8,
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    where: str  # path:line: the import as written

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}  ({self.where})"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Package:
    """The modules under `root` (a directory named for the package) and their imports of each other."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, Path] = {}
        for p in sorted(root.rglob("*.py")):
            parts = p.relative_to(root.parent).with_suffix("").parts
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
        self.trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in self.modules.items()}

    def where(self, mod: str, node: ast.AST) -> str:
        lines = self.modules[mod].read_text().splitlines()[node.lineno - 1 : node.end_lineno]
        text = " ".join(s.strip() for s in lines)
        return f"{self.modules[mod].relative_to(self.root.parent)}:{node.lineno}: {text}"

    def imports(self, mod: str):
        for node in ast.walk(self.trees[mod]):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node

    def _base(self, mod: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        pkg = mod if self.modules[mod].name == "__init__.py" else mod.rpartition(".")[0]
        parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
        return ".".join(parts + ([node.module] if node.module else []))

    def targets(self, mod: str, node: ast.stmt) -> list[tuple[str, str | None]]:
        """(module depended on, the name taken from it when that is not a submodule)."""
        if isinstance(node, ast.Import):
            return [(a.name, None) for a in node.names if a.name in self.modules]
        base, out = self._base(mod, node), []
        for a in node.names:
            sub = f"{base}.{a.name}"
            if base in self.modules:
                out.append((base, None if sub in self.modules else a.name))
            if sub in self.modules:
                out.append((sub, None))
        return out

    def bindings(self, mod: str) -> dict[str, str]:
        """Local names this file binds to quantkit modules (`import a.b` binds `a`)."""
        out = {}
        for node in self.imports(mod):
            for a in node.names:
                full = a.name if isinstance(node, ast.Import) else f"{self._base(mod, node)}.{a.name}"
                if full not in self.modules:
                    continue
                if isinstance(node, ast.Import) and not a.asname:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
                else:
                    out[a.asname or a.name] = full
        return out

    @cached_property
    def edges(self) -> list[Edge]:
        out = []
        for mod in self.modules:
            for node in self.imports(mod):
                for dst in dict.fromkeys(dst for dst, _ in self.targets(mod, node)):
                    if dst != mod:
                        out.append(Edge(mod, dst, self.where(mod, node)))
        return out

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan, iterative)."""
        graph = {m: sorted({e.dst for e in self.edges if e.src == m}) for m in self.modules}
        index, low, on, stack, out = {}, {}, set(), [], []
        for start in graph:
            if start in index:
                continue
            work = [(start, 0)]
            while work:
                v, i = work.pop()
                if i == 0:
                    index[v] = low[v] = len(index)
                    stack.append(v)
                    on.add(v)
                elif i <= len(graph[v]):
                    low[v] = min(low[v], low[graph[v][i - 1]])
                while i < len(graph[v]) and graph[v][i] in index:
                    if graph[v][i] in on:
                        low[v] = min(low[v], index[graph[v][i]])
                    i += 1
                if i < len(graph[v]):
                    work += [(v, i + 1), (graph[v][i], 0)]
                    continue
                if low[v] == index[v]:
                    comp = []
                    while not comp or comp[-1] != v:
                        comp.append(stack.pop())
                        on.discard(comp[-1])
                    if len(comp) > 1:
                        out.append(sorted(comp))
        return out

    def _visible(self, mod: str, target: str) -> bool:
        """A private module serves the package it lies in (and that package's subpackages)."""
        parts = target.split(".")
        for i, part in enumerate(parts):
            owner = ".".join(parts[:i])
            if _is_private(part) and not (mod == owner or mod.startswith(owner + ".")):
                return False
        return True

    def private_uses(self) -> list[str]:
        out = []
        for mod in self.modules:
            for node in self.imports(mod):
                for dst, name in self.targets(mod, node):
                    if dst == mod:
                        continue
                    if name is not None and _is_private(name):
                        out.append(f"{mod} imports private {name!r} from {dst}  ({self.where(mod, node)})")
                    elif not self._visible(mod, dst):
                        out.append(f"{mod} imports private module {dst}  ({self.where(mod, node)})")
            out += self._private_attributes(mod, self.bindings(mod))
        return sorted(set(out))

    def _private_attributes(self, mod: str, bound: dict[str, str]) -> list[str]:
        """`m._y` (or `quantkit.a.m._y`) where m is a module this file imported."""
        out = []
        for node in ast.walk(self.trees[mod]):
            chain, cur = [], node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if not chain or not isinstance(cur, ast.Name) or cur.id not in bound:
                continue
            target = bound[cur.id]
            for attr in reversed(chain):
                if f"{target}.{attr}" in self.modules:
                    target = f"{target}.{attr}"
                    if not self._visible(mod, target):
                        out.append(f"{mod} uses private module {target}  ({self.where(mod, node)})")
                    continue
                if _is_private(attr) and target != mod:
                    out.append(f"{mod} uses private {target}.{attr}  ({self.where(mod, node)})")
                break
        return out

    def layer_key(self, mod: str) -> str:
        parts = mod.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    def upward(self, layers: dict[str, int]) -> list[str]:
        out = []
        for e in self.edges:
            src, dst = layers.get(self.layer_key(e.src)), layers.get(self.layer_key(e.dst))
            if src is not None and dst is not None and dst > src:
                out.append(f"layer {src} imports layer {dst}: {e}")
        return out


@pytest.fixture(scope="module")
def package() -> Package:
    return Package(ROOT)


def test_every_package_and_root_module_has_a_layer(package):
    missing = sorted({package.layer_key(m) for m in package.modules} - set(LAYERS))
    assert not missing, f"no layer in LAYERS (tests/test_architecture.py) for: {', '.join(missing)}"


def test_no_import_cycles(package):
    report = []
    for comp in package.cycles():
        inside = [str(e) for e in package.edges if e.src in comp and e.dst in comp]
        report.append(f"cycle among {', '.join(comp)}:\n    " + "\n    ".join(inside))
    assert not report, "import cycles (lazy imports included):\n" + "\n".join(report)


def test_no_private_names_across_modules(package):
    found = package.private_uses()
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_no_import_from_a_higher_layer(package):
    found = package.upward(LAYERS)
    assert not found, "imports against the layer order:\n" + "\n".join(found)


# ---------------------------------------------------------------- the checks themselves


def _write(root: Path, files: dict[str, str]) -> Package:
    for name, text in files.items():
        p = root / "pkg" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in [root / "pkg", *(p for p in (root / "pkg").rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return Package(root / "pkg")


@pytest.mark.parametrize(
    "files, cycle",
    [
        ({"a.py": "from pkg.b import x\n", "b.py": "def f():\n    from pkg import a\n"}, ["pkg.a", "pkg.b"]),
        (
            {"sub/__init__.py": "from pkg.sub.m import x\n", "sub/m.py": "from pkg.sub import y\n"},
            ["pkg.sub", "pkg.sub.m"],
        ),
        (
            {"a.py": "import pkg.b\n", "b.py": "from . import c\n", "c.py": "from .a import z\n"},
            ["pkg.a", "pkg.b", "pkg.c"],
        ),
    ],
    ids=["lazy", "package-init", "relative"],
)
def test_a_cycle_of_any_kind_is_found(tmp_path, files, cycle):
    assert _write(tmp_path, files).cycles() == [cycle]


def test_no_cycle_where_imports_point_one_way(tmp_path):
    pkg = _write(
        tmp_path, {"a.py": "from pkg.b import x\nfrom pkg import c\n", "b.py": "import pkg.c\n", "c.py": "import os\n"}
    )
    assert pkg.cycles() == [] and len(pkg.edges) == 4  # a->b, a->pkg, a->c, b->c


@pytest.mark.parametrize(
    "source",
    [
        "from pkg.b import _hidden\n",
        "from pkg import b\nb._hidden()\n",
        "import pkg.b as m\nm._hidden\n",
        "import pkg.b\npkg.b._hidden\n",
        "from pkg.sub import _tools\n",
        "import pkg.sub._tools\n",
    ],
    ids=["from-import", "module-attribute", "aliased-module", "dotted-path", "private-module", "import-private-module"],
)
def test_private_names_of_another_module_are_found(tmp_path, source):
    pkg = _write(tmp_path, {"a.py": source, "b.py": "def _hidden(): pass\n", "sub/_tools.py": "x = 1\n"})
    found = pkg.private_uses()
    assert len(found) == 1 and found[0].startswith("pkg.a ") and "pkg/a.py:" in found[0], found


def test_public_names_and_a_package_own_private_module_are_fine(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "a.py": "from pkg.b import shown, __version__\nfrom pkg import b\nb.shown()\n",
            "b.py": "shown = __version__ = 1\n",
            "sub/m.py": "from pkg.sub._tools import x\nfrom pkg.sub import _tools\n_tools.y\n",
            "sub/_tools.py": "x = y = 1\n",
        },
    )
    assert pkg.private_uses() == []


def test_an_import_from_a_higher_layer_is_found(tmp_path):
    pkg = _write(
        tmp_path, {"low/m.py": "def f():\n    from pkg.high.n import g\n", "high/n.py": "from pkg.low.m import f\n"}
    )
    found = pkg.upward({"low": 0, "high": 1})
    assert len(found) == 1 and "pkg.low.m -> pkg.high.n" in found[0] and "pkg/low/m.py:2" in found[0]
    assert pkg.upward({"low": 1, "high": 1}) == []


def test_module_names_are_unique():
    """A module's name says what it holds without its folder: no two modules share a basename
    (a package's __init__.py and the entry point's __main__.py aside)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twins = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twins, f"module names used more than once: {twins}"
