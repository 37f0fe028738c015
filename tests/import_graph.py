"""The import graph of a package read from its source, and the cycles in it.

An edge is a module-level import, absolute or relative (``from . import x`` where ``x`` is a
module points at that module), including both branches of ``if TYPE_CHECKING:``: a cycle
that only type checking sees is still a cycle. An import inside a function is a deliberate
late one: not an edge for cycles, but an edge of ``import_graph(root, late=True)``, which
says who imports a module at all (docs/architecture.md's "imported by").
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    """The dotted name of ``path`` in the package whose directory is ``root``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level(tree: ast.Module, late: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements run at import time or seen by a type checker (``late``: all)."""
    if late:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found: list[ast.Import | ast.ImportFrom] = []
    body: list[ast.stmt] = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            body.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                body.extend(handler.body)
    return found


def imported_names(path: Path, module: str, late: bool = False) -> set[str]:
    """Every dotted name the module ``module`` (its source at ``path``) imports, relative
    imports made absolute; ``from p import n`` gives ``p.n``, which is the module ``p.n`` if
    there is one and otherwise an attribute of ``p``."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in _module_level(ast.parse(path.read_text()), late):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        keep = len(package) - node.level + 1 if node.level else 0
        if keep < 0 or (node.level and keep == 0):
            continue  # beyond the top of the package: not ours
        base = package[:keep]
        target = ".".join([*base, *(node.module.split(".") if node.module else [])])
        names.update(target if a.name == "*" else f"{target}.{a.name}" for a in node.names)
    return names


def import_graph(root: Path, late: bool = False) -> dict[str, set[str]]:
    """Module name -> the modules of the package at ``root`` it imports (not itself); with
    ``late``, imports inside functions count too."""
    modules = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {
        name: {t for t in map(resolve, imported_names(path, name, late)) if t and t != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while (w := stack.pop()) != v:
                component.add(w)
            if component:
                found.append(component | {v})

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
