"""The Python front end is a DAG of modules: core (tracing, registers, memory, views) <- nki.isa <-
nki.language <- the legacy layer (index expressions, masks), which plugs into the layers below it
through nikki.hooks. These tests read the package's source (ast, nothing is imported) and fail
when a module-level import cycle comes back, when a layer imports one above it, or when an import
of a nikki module hides inside a function (the usual way of dodging a cycle)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2] / "bindings" / "python" / "nikki"

# The front end's layers, lowest first: a module may import its own layer and the ones below.
CORE = {"nikki._core", "nikki.errors", "nikki.arguments", "nikki.dtypes", "nikki.ops", "nikki.hooks",
        "nikki.registers", "nikki.tracing", "nikki.tensor"}
LAYERS = [CORE, {"nikki.isa"}, {"nikki.language"}, {"nikki.index_expr"}]

# Function-level imports of nikki modules that are justified, as (importing module, imported
# module): reasons beside each. None today; an optional dependency (torch, matplotlib) is not a
# nikki module and needs no entry.
ALLOWED_FUNCTION_IMPORTS: dict[tuple[str, str], str] = {}


def _module_name(path: pathlib.Path, package_dir: pathlib.Path, package: str) -> str:
    rel = path.relative_to(package_dir).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts])


def _resolve(node: ast.ImportFrom | ast.Import, module: str, is_package: bool, package: str,
             modules: set[str]) -> list[str]:
    """The package's modules an import statement imports (other packages' are dropped)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        return [n for n in names if n == package or n.startswith(package + ".")]
    if node.level:
        base_parts = module.split(".") if is_package else module.split(".")[:-1]
        base_parts = base_parts[:len(base_parts) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base != package and not base.startswith(package + "."):
        return []
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.append(sub if sub in modules else base)  # `from . import isa` imports the module isa
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def scan(package_dir: pathlib.Path, package: str = "nikki"):
    """(module-level import graph, function-level imports of the package's modules) of a package
    directory: graph maps module -> set of modules; the list holds (module, imported, line)."""
    paths = sorted(package_dir.glob("*.py"))
    modules = {_module_name(p, package_dir, package) for p in paths}
    modules |= {f"{package}.{p.name.split('.')[0]}" for p in package_dir.glob("*.so")}  # extension modules
    graph: dict[str, set[str]] = {m: set() for m in modules}
    in_functions: list[tuple[str, str, int]] = []
    for path in paths:
        module = _module_name(path, package_dir, package)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    continue  # never executed: no cycle at run time
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _resolve(child, module, is_package, package, modules):
                        if target == module:
                            continue
                        if in_function:
                            in_functions.append((module, target, child.lineno))
                        else:
                            graph[module].add(target)
                    continue
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
    return graph, in_functions


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def with_function_imports(graph: dict[str, set[str]], in_functions) -> dict[str, set[str]]:
    """The graph with the edges of function-level imports added (allowed ones left out): a cycle
    there is a cycle postponed to run time, which still ties the layers together."""
    full = {m: set(targets) for m, targets in graph.items()}
    for module, target, _ in in_functions:
        if (module, target) not in ALLOWED_FUNCTION_IMPORTS:
            full[module].add(target)
    return full


# --- the package --------------------------------------------------------------------------------

def test_module_level_imports_have_no_cycle():
    graph, _ = scan(PACKAGE_DIR)
    assert "nikki.isa" in graph and "nikki.tensor" in graph  # the scan found the package
    assert graph["nikki.language"] >= {"nikki.isa", "nikki.tensor"}  # and reads its imports
    cycle = find_cycle(graph)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_no_cycle_through_function_level_imports_either():
    cycle = find_cycle(with_function_imports(*scan(PACKAGE_DIR)))
    assert cycle is None, "import cycle through imports inside functions: " + " -> ".join(cycle)


def test_no_function_level_import_of_a_nikki_module():
    _, in_functions = scan(PACKAGE_DIR)
    hidden = [f"{m} line {line}: imports {t}" for m, t, line in in_functions
              if (m, t) not in ALLOWED_FUNCTION_IMPORTS]
    assert not hidden, ("imports of nikki modules inside functions (import at module level; a cycle this "
                        "avoids is a layering fault: use nikki.hooks):\n" + "\n".join(hidden))


def test_layers_import_only_downwards():
    graph = with_function_imports(*scan(PACKAGE_DIR))
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    upward = [f"{m} (layer {rank[m]}) imports {t} (layer {rank[t]})"
              for m in sorted(rank) for t in sorted(graph.get(m, ())) if rank.get(t, -1) > rank[m]]
    outside = [f"{m} imports {t}, which is not in the front end's layers"
               for m in sorted(rank) for t in sorted(graph.get(m, ())) if t not in rank]
    assert not upward and not outside, "\n".join(upward + outside)


def test_every_hook_is_filled_by_a_layer():
    import nikki  # noqa: F401  (imports every layer)
    from nikki.hooks import Hooks, hooks

    slots = [name for name in vars(Hooks) if not name.startswith("_")]
    assert len(slots) >= 20
    unfilled = [name for name in slots if name not in vars(hooks)]
    assert not unfilled, f"hooks no layer fills: {unfilled}"


# --- the checker itself, on planted faults ------------------------------------------------------

def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / "pkg"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_checker_finds_a_planted_cycle(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "a.py": "from .b import x\n",
                               "b.py": "from . import c\nx = 1\n", "c.py": "import pkg.a\n"})
    cycle = find_cycle(scan(root, "pkg")[0])
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"pkg.a", "pkg.b", "pkg.c"}


def test_checker_reports_function_level_imports_and_ignores_type_checking(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "b.py": "",
                               "a.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"
                                        "def f():\n    import numpy\n    from .b import y\n    return y\n")})
    graph, in_functions = scan(root, "pkg")
    assert graph["pkg.a"] == set()
    assert in_functions == [("pkg.a", "pkg.b", 6)]


@pytest.mark.parametrize("source, expected", [
    ("from . import b\n", {"pkg.b"}),
    ("from .b import thing\n", {"pkg.b"}),
    ("from pkg import name_in_init\n", {"pkg"}),
    ("import os\nfrom os import path\n", set()),
])
def test_checker_resolves_imports(tmp_path, source, expected):
    root = _package(tmp_path, {"__init__.py": "", "b.py": "", "a.py": source})
    assert scan(root, "pkg")[0]["pkg.a"] == expected
