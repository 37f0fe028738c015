"""Every relative link in README.md, docs/**/*.md and the chart's README names a file that
exists, and every ``#anchor`` names a heading of its target page as GitHub spells it (its
slug), so moving a section between pages cannot leave a reader at a dead link. Parsed with
markdown-it-py, so links inside code blocks are not links."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
PARSER = MarkdownIt("commonmark").enable("table")


def pages() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [ROOT / "README.md", ROOT / "helm" / "farm" / "README.md", *docs]


def tokens(page: Path) -> Iterator[Token]:
    for token in PARSER.parse(page.read_text()):
        yield token
        yield from token.children or ()


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    found: list[str] = []
    stream = PARSER.parse(page.read_text())
    for heading, inline in zip(stream, stream[1:], strict=False):
        if heading.type == "heading_open":
            text = "".join(child.content for child in inline.children or ())
            base = slug(text)
            found.append(f"{base}-{found.count(base)}" if base in found else base)
    return frozenset(found)


def links(page: Path) -> Iterator[str]:
    for token in tokens(page):
        target = token.attrGet("href") if token.type == "link_open" else token.attrGet("src")
        if isinstance(target, str) and not re.match(r"[a-z][a-z0-9+.-]*:", target):
            yield target


def broken(page: Path, root: Path = ROOT) -> Iterator[str]:
    for link in links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / unquote(path)).resolve() if path else page
        if not target.exists():
            yield f"{page.relative_to(root)}: {link} (no such file)"
        elif anchor and target.suffix == ".md" and unquote(anchor) not in anchors(target):
            yield f"{page.relative_to(root)}: {link} (no such heading)"


def test_slugs_are_githubs() -> None:
    assert slug("Many items: `Farm.map`") == "many-items-farmmap"
    assert slug("Overload (bench/load.py, make load)") == "overload-benchloadpy-make-load"
    assert slug("Variants: `docs` and `judge`") == "variants-docs-and-judge"


def test_every_relative_link_in_the_docs_names_a_file_and_a_heading_that_exist() -> None:
    assert len(pages()) > 20  # the walk found the docs
    assert sum(1 for page in pages() for _ in links(page)) > 100  # and their links
    assert [problem for page in pages() for problem in broken(page)] == []


def reachable(start: Path) -> set[Path]:
    """The pages a reader reaches from ``start`` by following relative links to pages."""
    seen, todo = {start}, [start]
    while todo:
        page = todo.pop()
        for link in links(page):
            target = (page.parent / unquote(link.partition("#")[0])).resolve()
            if target.is_dir():
                target = target / "README.md"
            if target.suffix == ".md" and target.exists() and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_page_of_docs_is_reached_from_the_readme() -> None:
    found = reachable((ROOT / "README.md").resolve())
    assert [p.relative_to(ROOT).as_posix() for p in pages() if p.resolve() not in found] == []


def test_a_dead_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# B\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "a.md"
    page.write_text(
        "# A\n\n[ok](b.md#two-words-1) [ok](#a) [gone](c.md) [bad](b.md#three)\n\n"
        "```\n[not a link](nowhere.md)\n```\n"
    )
    problems = [p.split(": ", 1)[1] for p in broken(page, tmp_path)]
    assert problems == ["c.md (no such file)", "b.md#three (no such heading)"]
