"""docs/architecture.md cannot drift: its tables list every module of farm/ once, and each
row's "Imported by" is what the code's imports say (``python -m tests.architecture_table``
rewrites that column)."""

from __future__ import annotations

from collections import Counter

from tests.architecture_table import DOC, FARM, imported_by, listed, part, rewrite


def test_the_tables_list_every_module_once() -> None:
    modules = {str(p.relative_to(FARM)) for p in FARM.rglob("*.py")}
    rows = listed(DOC.read_text())
    assert len(rows) > 150  # the tables were read
    assert [path for path, n in Counter(rows).items() if n > 1] == []
    assert sorted(modules - set(rows)) == [], "add a row for each new module"
    assert sorted(set(rows) - modules) == [], "remove the rows of modules that are gone"


def test_the_imported_by_column_is_what_the_code_imports() -> None:
    text = DOC.read_text()
    assert rewrite(text) == text, "run: python -m tests.architecture_table"


def test_a_stale_imported_by_cell_is_rewritten() -> None:
    row = "| `worker/session_calls.py` | calls | client | worker |"
    assert listed(row) == ["worker/session_calls.py"]
    importers = imported_by()["worker/session_calls.py"]
    assert "client" not in importers  # a worker never imports the client's side
    assert rewrite(row) == f"| `worker/session_calls.py` | calls | {importers} | worker |\n"


def test_parts_are_packages_kernel_packages_and_top_level_modules() -> None:
    assert part("farm.client.session") == "client"
    assert part("farm.kernel.wire.framing") == "kernel.wire"
    assert part("farm.kernel.__main__") == part("farm.kernel") == "kernel"
    assert part("farm.errors") == "errors"
    assert part("farm") == "farm"
