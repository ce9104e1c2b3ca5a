"""The package's folders are its layers (docs/architecture.md): a module imports only its own layer
and the layers below it, the import graph has no circle, and the physics reads no files.

Every import counts: module-level and inside functions, relative and absolute, and the
``"simulator.x.y:fn"`` strings the CLI hands to :func:`importlib.import_module`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "simulator"

#: Bottom to top; ``top`` is ``simulator/__init__.py`` (the public re-exports).
LAYERS = ("core", "hardware", "strategy", "model", "physics", "engine", "answer", "validation", "frontends", "top")

#: A dotted module name in a string (the CLI's subcommand table).
_DOTTED = re.compile(r"^(simulator(?:\.\w+)+)(?::\w+)?$")

#: Calls that read a file; the physics takes numbers in and gives numbers out.
_FILE_READS = {"open", "read_text", "read_bytes", "files", "load", "safe_load", "loadtxt", "read_csv"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def imports(mod: str, source: str, known: dict[str, Path], is_package: bool = False) -> set[str]:
    """Modules of the package that module ``mod`` (its ``source``) imports anywhere."""
    package = mod if is_package else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import sub``: the submodule when it is one, else the module itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := _DOTTED.match(node.value)):
            names = [m.group(1)]
        out |= {t for n in names if (t := _resolve(n, known)) and t != mod}
    return out


def layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "top"


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a higher layer by a lower one (or of a folder that is no layer)."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    out = []
    for a, targets in graph.items():
        for b in sorted(targets):
            if layer(a) not in rank or layer(b) not in rank or rank[layer(b)] > rank[layer(a)]:
                out.append(f"{a} ({layer(a)}) -> {b} ({layer(b)})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p.read_text(encoding="utf-8"), known, p.name == "__init__.py") for m, p in known.items()}


def test_no_module_imports_a_layer_above_it(graph):
    assert not upward_edges(graph), "\n".join(upward_edges(graph))


def test_the_import_graph_has_no_circle(graph):
    assert not cycles(graph)


def test_every_subpackage_is_a_layer_and_few_modules_sit_at_the_top():
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(LAYERS) - {"top"}
    assert len(list(ROOT.glob("*.py"))) <= 8


def test_the_physics_reads_no_files():
    for path in sorted((ROOT / "physics").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                assert name not in _FILE_READS, f"{path.name}:{node.lineno} calls {name}()"


def test_the_checks_can_fail():
    # an upward import (physics -> engine), a circle, a function-level import and a CLI string
    g = {"simulator.physics.a": {"simulator.engine.b"}, "simulator.engine.b": {"simulator.physics.a"}}
    assert upward_edges(g) == ["simulator.physics.a (physics) -> simulator.engine.b (engine)"]
    assert cycles(g) == [["simulator.engine.b", "simulator.physics.a"]]
    text = "def f():\n    from ..engine import estimate\nSUB = {'x': 'simulator.frontends.cli:main'}\n"
    found = imports("simulator.core.probe", text, modules())
    assert found == {"simulator.engine.estimate", "simulator.frontends.cli"}
