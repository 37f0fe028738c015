"""REPL semantics: the kernel must agree with IPython itself, asked in the same run."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from tests.conftest import Cells

SNIPPETS = [
    "1",
    "1 + 1",
    "2 + 2;",
    "x = 5",
    "x = 5\nx * 3",
    "x = 5; x * 3",
    "None",
    "print('hi')",
    "'abc'",
    "[1, 2, 3]",
    "{'a': 1, 'b': [1, 2]}",
    "(1,)",
    "# if True: return\n3",
    "s = 'if x: return; for while'\ns",
    "'''\nfor i in range(3):\n'''",
    "if True:\n    5",
    "for i in range(3):\n    i",
    "def f():\n    return 4\nf()",
    "class A:\n    pass",
    "import math\nmath.pi",
    "lst = [1]\nlst.append(2)",
    "3  # trailing comment",
    "3; # comment after the semicolon",
    "3;\n\n",
    "1\n2",
    "a, b = 1, 2\na + b",
    "[i * i for i in range(5)]",
    "1 / 0",
    "raise ValueError('boom')",
    "undefined_name",
    "x = (",
    "True",
    "1 if False else None",
    "try:\n    1\nexcept Exception:\n    pass",
    "y = 1\ndel y",
    "sum(range(10))",
    "'a' 'b'",
    "b'bytes'",
    "1e300 * 1e300",
    "{1, 2}",
    "frozenset()",
    "range(3)",
    "assert False, 'no'",
    "f'{1 + 1}'",
    "x = 1\nx += 1\nx",
    "while False:\n    pass",
    "with open('/dev/null') as fh:\n    fh.name",
    "import sys; sys.exit(3)",
    "'semicolon; inside a string'",
    # IPython's input cleaning: indentation, blank lines and prompts of pasted code
    "    x = 1\n    x + 1",
    "\n\n  if True:\n      7",
    "\tx = 2\n\tx * 4",
    "    def f():\n        return 5\n    f()",
    ">>> x = 3\n>>> x * 2",
    ">>> def g():\n...     return 9\n>>> g()",
    "    >>> 1 + 1\n    2",
    ">>> s = '''\n... >>> kept\n... '''\n>>> s",
    "In [1]: y = 4\n   ...: y + 1",
    "x = ...\nx",
    "'''\n    indented text\n'''",
]


def ipython_outcome(shell: Any, code: str) -> tuple[str | None, str | None]:
    """(repr of the displayed value or None, exception type name or None) from IPython."""
    shell.reset(new_session=False)
    result = shell.run_cell(code, store_history=True, silent=False)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        return None, type(error).__name__
    return (None if result.result is None else repr(result.result)), None


@pytest.fixture(scope="module")
def ipython() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
    shell.showtraceback = lambda *a, **k: None  # keep the test output quiet
    shell.showsyntaxerror = lambda *a, **k: None
    return shell


@pytest.mark.slow
def test_kernel_agrees_with_ipython_on_every_snippet(ipython: Any, client: Any) -> None:
    assert len(SNIPPETS) >= 30
    mismatches = []
    for code in SNIPPETS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = ipython_outcome(ipython, code)
        cells = Cells(client)  # a fresh namespace per snippet, like the reset IPython shell
        result = cells.run(code)
        client.close_session(cells.id)
        got = (
            result.value.data["text/plain"] if result.value else None,
            result.error.ename if result.error else None,
        )
        if got != expected:
            mismatches.append((code, expected, got))
    assert not mismatches, "\n".join(f"{c!r}: IPython {e}, farm {g}" for c, e, g in mismatches)


def test_ipython_only_syntax_is_a_clear_user_error(cells: Cells) -> None:
    for code, feature in [
        ("!pip install numpy", "shell escape"),
        ("files = !ls", "shell escape"),
        ("%timeit sum(range(10))", "magic %timeit"),
        ("%%bash\necho hi", "cell magic %%bash"),
        ("x = 1\n%matplotlib inline\nx", "magic %matplotlib"),
    ]:
        result = cells.run(code)
        assert result.error is not None and result.kind == "user", code
        assert result.error.ename == "UnsupportedSyntax", code
        assert feature in result.error.evalue and "not support" in result.error.evalue, code
    assert cells.value("10 % 3") == "1"  # the operator is untouched


def test_variables_persist_between_cells(cells: Cells) -> None:
    cells.run("import math\nitems = [1, 2, 3]\ndef double(v):\n    return 2 * v")
    assert cells.value("[double(i) for i in items]") == "[2, 4, 6]"
    assert cells.value("math.sqrt(16)") == "4.0"


def test_last_value_is_bound_to_underscore(cells: Cells) -> None:
    cells.run("40 + 2")
    cells.run("'second'")
    assert cells.value("(_, __)") == "('second', 42)"


def test_none_and_suppressed_values_do_not_rebind_underscore(cells: Cells) -> None:
    cells.run("7")
    cells.run("None")
    cells.run("8;")
    assert cells.value("_") == "7"


def test_top_level_await_works(cells: Cells) -> None:
    code = "import asyncio\nasync def f():\n    await asyncio.sleep(0.01)\n    return 9\nawait f()"
    assert cells.value(code) == "9"
    assert cells.value("asyncio.run(f())") == "9"  # plain asyncio.run still works


def test_name_is_main_and_definitions_pickle(cells: Cells) -> None:
    assert cells.value("__name__") == "'__main__'"
    cells.run("import pickle\nclass Point:\n    def __init__(self, x):\n        self.x = x")
    assert cells.value("pickle.loads(pickle.dumps(Point(3))).x") == "3"


def test_traceback_shows_user_frames_in_cell_with_line_numbers(cells: Cells) -> None:
    result = cells.run("def inner():\n    raise KeyError('k')\n\ninner()")
    assert result.error is not None
    assert result.error.ename == "KeyError"
    assert result.error.kind == "user"
    text = "".join(result.error.traceback)
    assert 'File "<cell>", line 4' in text
    assert 'File "<cell>", line 2, in inner' in text
    assert "farm/kernel" not in text


def test_syntax_error_reports_line_and_offset(cells: Cells) -> None:
    result = cells.run("a = 1\nb = (2 +\n")
    assert result.error is not None and result.error.ename == "SyntaxError"
    text = "".join(result.error.traceback)
    assert '<cell>", line 2' in text
    assert "^" in text


def test_system_exit_is_a_user_error_and_the_session_lives(cells: Cells) -> None:
    cells.run("keep = 'me'")
    result = cells.run("raise SystemExit(2)")
    assert result.error is not None
    assert (result.error.ename, result.error.kind) == ("SystemExit", "user")
    assert not result.state_lost
    assert cells.value("keep") == "'me'"


def test_input_raises_a_clear_error(cells: Cells) -> None:
    result = cells.run("input('name? ')")
    assert result.error is not None
    assert result.error.ename == "StdinNotImplementedError"
    assert "no stdin" in result.error.evalue


def test_output_of_child_processes_and_c_code_is_captured(cells: Cells) -> None:
    result = cells.run(
        "import os, subprocess, sys, ctypes\n"
        "print('py out')\n"
        "print('py err', file=sys.stderr)\n"
        "os.system('echo from-shell')\n"
        "subprocess.run(['sh', '-c', 'echo child-err >&2'])\n"
        "ctypes.CDLL(None).printf(b'from-c\\n');"
    )
    assert result.ok, result.error
    assert result.stdout.splitlines() == ["py out", "from-shell", "from-c"]
    assert result.stderr.splitlines() == ["py err", "child-err"]


def test_markdown_repr_leads_the_value_text(cells: Cells) -> None:
    cells.run(
        "class Doc:\n"
        "    def _repr_markdown_(self):\n        return '# Title'\n"
        "    def _repr_html_(self):\n        return '<h1>Title</h1>'\n"
        "    def __repr__(self):\n        return 'Doc()'"
    )
    result = cells.run("Doc()")
    assert result.value is not None
    assert result.value.text == "# Title"
    assert result.value.data["text/markdown"] == "# Title"
    assert result.value.data["text/html"] == "<h1>Title</h1>"
    assert result.value.data["text/plain"] == "Doc()"


def test_html_only_object_shows_plain_repr_as_text(cells: Cells) -> None:
    cells.run(
        "class Table:\n"
        "    def _repr_html_(self):\n        return '<table></table>'\n"
        "    def __repr__(self):\n        return 'Table(rows=0)'"
    )
    value = cells.run("Table()").value
    assert value is not None
    assert value.text == "Table(rows=0)"
    assert value.data["text/html"] == "<table></table>"


def test_png_and_json_reprs_travel_as_mime(cells: Cells) -> None:
    cells.run(
        "class Pic:\n"
        "    def _repr_png_(self):\n        return b'\\x89PNG fake'\n"
        "    def _repr_json_(self):\n        return {'k': [1, 2]}"
    )
    value = cells.run("Pic()").value
    assert value is not None
    import base64

    assert base64.b64decode(value.data["image/png"]) == b"\x89PNG fake"
    assert value.data["application/json"] == {"k": [1, 2]}


def test_big_containers_get_a_bounded_shape_summary(cells: Cells) -> None:
    text = cells.value("{i: i for i in range(10000)}")
    assert text is not None
    assert text.startswith("dict with 10000 items {0: 0, 1: 1,")
    assert len(text) <= 2048
    nested = cells.value("[list(range(1000))] * 3")
    assert nested is not None and len(nested) <= 2048
    assert "list with 1000 items" in nested


def test_repr_that_raises_is_contained(cells: Cells) -> None:
    cells.run("class Bad:\n    def __repr__(self):\n        raise RuntimeError('nope')")
    result = cells.run("Bad()")
    assert result.ok
    assert result.value is not None
    assert "repr of Bad object failed: RuntimeError: nope" in result.value.text


def test_repr_that_never_returns_is_stopped_by_the_timeout(cells: Cells) -> None:
    cells.run("class Slow:\n    def __repr__(self):\n        while True:\n            pass")
    result = cells.run("Slow()", timeout_s=1)
    assert result.error is not None and result.error.kind == "timeout"
    assert cells.value("1 + 1") == "2"


def test_memory_error_is_kind_oom_and_state_is_kept(cells: Cells) -> None:
    cells.run("kept = 1")
    result = cells.run("raise MemoryError()")
    assert result.error is not None and result.error.kind == "oom"
    assert cells.value("kept") == "1"


def test_asyncio_of_the_kernel_does_not_leak_into_user_code(cells: Cells) -> None:
    assert cells.value("import asyncio\nasyncio._get_running_loop() is None") == "True"
