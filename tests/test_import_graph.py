"""The import graph that ``test_layering`` checks for cycles, on a made-up package: relative
and absolute imports, ``from . import module``, imports seen only by type checkers, and late
imports inside functions (not edges)."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import cycles, import_graph

SOURCES = {
    "__init__.py": "from .a import A\nVALUE = 1\n",
    "a.py": "from . import b\nA = 1\n",  # b is a module: the edge goes to it
    "b.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .sub.c import C\n"  # only type checkers see it
    ),
    "sub/__init__.py": "",
    "sub/c.py": "import os\nfrom ..a import A\nC = 1\n",  # two levels up
    "d.py": "import pkg.b\nfrom pkg import VALUE\n\n\ndef late():\n    from pkg import e\n",
    "e.py": "from pkg.a import A\nfrom .d import late\n",
}


def write_package(root: Path, sources: dict[str, str]) -> Path:
    for name, text in sources.items():
        (root / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "pkg" / name).write_text(text)
    return root / "pkg"


def test_the_graph_resolves_relative_absolute_and_typing_imports(tmp_path: Path) -> None:
    graph = import_graph(write_package(tmp_path, SOURCES))
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a"},
        "pkg.d": {"pkg.b", "pkg"},  # ``VALUE`` is the package's; ``late`` imports no edge
        "pkg.e": {"pkg.a", "pkg.d"},
    }


def test_late_imports_count_when_asked_for(tmp_path: Path) -> None:
    """Who imports a module at all (docs/architecture.md) counts imports inside functions."""
    graph = import_graph(write_package(tmp_path, SOURCES), late=True)
    assert graph["pkg.d"] == {"pkg.b", "pkg", "pkg.e"}


def test_a_cycle_only_type_checking_sees_is_found(tmp_path: Path) -> None:
    assert cycles(import_graph(write_package(tmp_path, SOURCES))) == [
        {"pkg.a", "pkg.b", "pkg.sub.c"}
    ]


def test_a_late_import_and_a_one_way_import_make_no_cycle(tmp_path: Path) -> None:
    """d imports e only inside a function, e imports d at module level: no cycle; nor
    without the typing-only import that closed a -> b -> c -> a."""
    sources = {**SOURCES, "b.py": "import typing\n"}
    assert cycles(import_graph(write_package(tmp_path, sources))) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
