"""Module docstrings stay short: a few lines on what the module is for and which invariants it
keeps; the reasoning goes to docs/design/, and every page a docstring names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import farm

FARM = Path(farm.__file__).parent
ROOT = FARM.parent
MAX_LINES = 10


def docstrings() -> dict[str, str]:
    return {
        path.relative_to(FARM).as_posix(): ast.get_docstring(ast.parse(path.read_text())) or ""
        for path in sorted(FARM.rglob("*.py"))
    }


def test_every_module_docstring_fits_in_a_few_lines() -> None:
    found = docstrings()
    assert len(found) > 100  # the walk found the package
    long = sorted(name for name, doc in found.items() if len(doc.splitlines()) > MAX_LINES)
    assert long == [], "move the reasoning to docs/design/"


def test_the_design_pages_docstrings_name_exist() -> None:
    named = {
        page
        for doc in docstrings().values()
        for page in re.findall(r"docs/design/[\w.-]+\.md", doc)
    }
    assert named, "docstrings link their design pages"
    assert sorted(page for page in named if not (ROOT / page).exists()) == []
