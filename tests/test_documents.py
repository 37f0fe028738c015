"""``read_document`` in the docs image: real documents of each kind, made here and read back
in a real docs sandbox through a local farm (``farm.session(image="docs")``)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.sandbox.variants import ensure_variant_image
from tests.conftest import Cells

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def make_docx() -> bytes:
    import docx

    document = docx.Document()
    document.add_heading("Quarterly Report", level=1)
    document.add_paragraph("Revenue grew by 42 percent.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "region", "sales"
    table.cell(1, 0).text, table.cell(1, 1).text = "north", "1234"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_pptx() -> bytes:
    import pptx

    deck = pptx.Presentation()
    for title, body in (("Farm Slides", "First slide body"), ("Results", "Second slide body")):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def make_xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Inventory"
    for row in (("fruit", "count"), ("apple", 3), ("pear", 7)):
        sheet.append(row)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def make_pdf() -> bytes:
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    out = io.BytesIO()
    pdf = canvas.Canvas(out, pagesize=A4)
    pdf.drawString(72, 750, "Hello from a PDF")
    pdf.showPage()
    pdf.drawString(72, 750, "Second PDF page")
    pdf.showPage()
    pdf.save()
    return out.getvalue()


def make_html() -> bytes:
    return (
        b"<html><head><title>T</title><script>var hidden = 'script text';</script></head>"
        b"<body><h1>Field Notes</h1><p>A <a href='https://example.org/'>link</a> and "
        b"<b>bold</b> text.</p><ul><li>one</li><li>two</li></ul></body></html>"
    )


def make_text() -> bytes:
    return "".join(f"line {i}\n" for i in range(1, 251)).encode()


KINDS: dict[str, tuple[Callable[[], bytes], list[str]]] = {
    "report.docx": (
        make_docx,
        ["# Quarterly Report", "Revenue grew by 42 percent.", "| north | 1234 |"],
    ),
    "slides.pptx": (make_pptx, ["# Farm Slides", "First slide body", "Second slide body"]),
    "sheet.xlsx": (make_xlsx, ["## Inventory", "| apple | 3 |", "| pear | 7 |"]),
    "paper.pdf": (make_pdf, ["Hello from a PDF", "Second PDF page"]),
    "page.html": (make_html, ["# Field Notes", "[link](https://example.org/)", "**bold**"]),
    "notes.txt": (make_text, ["line 1", "line 100"]),
}


@pytest.fixture(scope="module")
def docs_farm(docker_env: Any) -> Iterator[Farm]:
    ensure_variant_image("docs", docker_env)
    with Farm.local(images={"docs": 1}) as farm:
        yield farm


@pytest.fixture(scope="module")
def docs(docs_farm: Farm) -> Iterator[Session]:
    with docs_farm.session(image="docs") as session:
        for name, (make, _) in KINDS.items():
            session.files.write(name, make())
        yield session


def printed(session: Session, code: str) -> str:
    result = session.run(code, timeout_s=120)
    assert result.ok, result.error
    return result.stdout


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_of_document_reads_back_as_markdown(docs: Session, name: str) -> None:
    page = printed(docs, f"print(read_document({name!r}))")
    assert page.startswith("[Page 1/")
    for expected in KINDS[name][1]:
        assert expected in page, (expected, page)


def test_html_scripts_do_not_reach_the_markdown(docs: Session) -> None:
    assert "script text" not in printed(docs, "print(read_document('page.html'))")


def test_long_documents_are_paginated_with_a_page_header(docs: Session) -> None:
    first = printed(docs, "print(read_document('notes.txt'))").splitlines()
    assert first[:3] == ["[Page 1/3]", "", "line 1"]
    assert first[-1] == "line 100"
    last = printed(docs, "print(read_document('notes.txt', page=3))").splitlines()
    assert last[:3] == ["[Page 3/3]", "", "line 201"]
    assert last[-1] == "line 250"
    small = printed(docs, "print(read_document('notes.txt', 2, lines_per_page=50))").splitlines()
    assert small[:3] == ["[Page 2/5]", "", "line 51"]
    assert len(small) == 2 + 50


def test_lines_per_page_is_configurable_for_the_session(docs: Session) -> None:
    docs.run("read_document.lines_per_page = 125").raise_for_error()
    try:
        assert printed(docs, "print(read_document('notes.txt', 2))").startswith("[Page 2/2]")
    finally:
        docs.run("read_document.lines_per_page = 100").raise_for_error()


def test_a_page_past_the_end_is_a_clear_error(docs: Session) -> None:
    result = docs.run("read_document('notes.txt', page=9)")
    assert result.error is not None
    assert result.error.ename == "DocumentError"
    assert "has 3 page(s); there is no page 9" in result.error.evalue


@pytest.mark.parametrize(
    "path", ["../etc/passwd", "/etc/passwd", "escape/passwd"], ids=["dotdot", "abs", "symlink"]
)
def test_paths_outside_the_workspace_are_refused(docs: Session, path: str) -> None:
    docs.run("import os\nos.path.lexists('escape') or os.symlink('/etc', 'escape')")
    result = docs.run(f"read_document({path!r})")
    assert result.error is not None
    assert result.error.ename == "WorkspaceError"
    assert "outside the workspace" in result.error.evalue


def test_a_sibling_boxs_files_are_out_of_reach(docs_farm: Farm, docs: Session) -> None:
    """Two sessions on the one docs worker share its sandbox, not their files:
    ``read_document('/workspace/secret.txt')`` reads the sibling's own file there and finds
    none in the other session; a path out of the workspace is refused as before."""
    with docs_farm.session(image="docs") as sibling:
        assert sibling.worker == docs.worker
        sibling.files.write("secret.txt", b"the sibling's secret")
        assert workspace(sibling) == workspace(docs) == "/workspace"
        path = "/workspace/secret.txt"
        assert "the sibling's secret" in printed(sibling, f"print(read_document({path!r}))")
        result = docs.run(f"print(read_document({path!r}))")
        assert result.error is not None and "secret" not in result.stdout, result.stdout
        assert result.error.ename in ("FileNotFoundError", "WorkspaceError"), result.error
        result = docs.run("print(read_document('../etc/hostname'))")
        assert result.error is not None and result.error.ename == "WorkspaceError"
        assert "outside the workspace" in result.error.evalue


def workspace(session: Session) -> str:
    value = session.run("import os; os.getcwd()").value
    assert value is not None
    return str(value.text).strip("'")


def test_a_corrupt_document_is_an_error_and_the_session_lives_on(docs: Session) -> None:
    docs.files.write("broken.pdf", b"%PDF-1.7\n this is not really a pdf \x00\x01\x02")
    docs.files.write("broken.docx", b"PK\x03\x04 not a zip archive at all")
    for name in ("broken.pdf", "broken.docx"):
        result = docs.run(f"read_document({name!r})", timeout_s=60)
        if result.ok:  # a lenient parser may find no text: that must be an empty page then
            assert "[Page 1/1]" in (result.value.text if result.value else "")
        else:
            assert result.error is not None
            assert result.error.ename == "DocumentError", result.error
    assert printed(docs, "print(read_document('sheet.xlsx'))").startswith("[Page 1/1]")


def test_parsing_happens_inside_the_sandbox(docs: Session) -> None:
    """markitdown is imported in the sandboxed session process, not on the host's side."""
    out = printed(docs, "import markitdown, os\nprint(markitdown.__file__, os.getuid())")
    path, uid = out.split()
    assert path.startswith("/usr/") and int(uid) >= 100_000  # the session's own box uid


def test_the_docs_image_has_its_own_memory_limit(docs: Session, docker_env: Any) -> None:
    (container,) = docker_env.containers.list(
        ignore_removed=True, filters={"label": f"farm.owner={docs.worker}"}
    )
    memory = container.attrs["HostConfig"]["Memory"]
    # IMAGE_LIMITS["docs"] (the default stays 512 MiB), and the boxes' disks beside it
    assert memory == (1024 + 6144) * 1024 * 1024


def test_the_default_image_has_no_document_reader_or_browser(docker_sandbox: Any) -> None:
    with docker_sandbox.kernel() as client:
        cells = Cells(client)
        result = cells.run(
            "sorted(k for k in ('read_document', 'browser', 'ls') if k in globals())"
        )
        client.close_session(cells.id)
    assert result.ok, result.error
    assert result.value is not None and result.value.text == "['ls']"
