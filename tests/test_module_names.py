"""A grep for a file name lands in one place: no two modules under farm/ share a file name
(packages' ``__init__``/``__main__`` aside), and farm/'s top level keeps few loose modules,
the rest grouped by what runs them (``cli``, ``local``, ``events``, ...)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import farm

FARM = Path(farm.__file__).parent
PACKAGE_FILES = {"__init__.py", "__main__.py"}
MAX_LOOSE = 8


def shared_names(root: Path) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name not in PACKAGE_FILES:
            where[path.name].append(path.relative_to(root).as_posix())
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def loose_modules(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("*.py") if p.name not in PACKAGE_FILES)


def test_the_checks_see_a_shared_name_and_loose_modules(tmp_path: Path) -> None:
    for rel in ("a/calls.py", "b/calls.py", "b/__init__.py", "a/__init__.py", "x.py", "y.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert shared_names(tmp_path) == {"calls.py": ["a/calls.py", "b/calls.py"]}
    assert loose_modules(tmp_path) == ["x.py", "y.py"]


def test_no_two_modules_under_farm_share_a_file_name() -> None:
    assert len(list(FARM.rglob("*.py"))) > 100  # the walk found the package
    assert shared_names(FARM) == {}


def test_farms_top_level_keeps_at_most_eight_loose_modules() -> None:
    loose = loose_modules(FARM)
    assert "settings.py" in loose
    assert len(loose) <= MAX_LOOSE, loose
