"""docs/architecture.md's module tables: which part each module of farm belongs to, and the
"Imported by" column, generated from the real import graph (``tests.import_graph``, imports
inside functions included). ``python -m tests.architecture_table`` rewrites that column in
place; ``tests/test_architecture.py`` fails when the doc and the code disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import farm
from tests.import_graph import import_graph, module_name

FARM = Path(farm.__file__).parent
DOC = FARM.parent / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([\w/]+\.py)` \|([^|]*)\|([^|]*)\|([^|]*)\|$")


def part(module: str) -> str:
    """``client``, ``kernel.wire``, ``kernel`` (its ``__init__``/``__main__``), or a
    top-level module's own name (``errors``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "farm"
    if parts[1] == "kernel":
        return "kernel" if len(parts) == 2 or parts[2] == "__main__" else f"kernel.{parts[2]}"
    return parts[1]


def imported_by() -> dict[str, str]:
    """Module's path under farm/ -> the parts whose modules import it, or an em dash."""
    graph = import_graph(FARM, late=True)
    importers: dict[str, set[str]] = {name: set() for name in graph}
    for name, targets in graph.items():
        for target in targets:
            importers[target].add(part(name))
    paths = {module_name(FARM, p): str(p.relative_to(FARM)) for p in FARM.rglob("*.py")}
    return {paths[n]: ", ".join(sorted(found)) or "—" for n, found in importers.items()}


def listed(text: str) -> list[str]:
    """The module paths the doc's tables list, in order."""
    return [m.group(1) for line in text.splitlines() if (m := ROW.match(line))]


def rewrite(text: str) -> str:
    """``text`` with every table row's "Imported by" cell as the code has it now."""
    found = imported_by()
    lines = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m and m.group(1) in found:
            path, holds, _, runs = m.groups()
            line = f"| `{path}` |{holds}| {found[path]} |{runs}|"
        lines.append(line)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    DOC.write_text(rewrite(DOC.read_text()))
    sys.exit(0)
