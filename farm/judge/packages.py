"""Problem packages read into a ``Problem``: the Kattis problem package format
(``problem.yaml``: ``farm.judge.kattis``) and Polygon's (``problem.xml``:
``farm.judge.polygon``), from a directory; and what both need: a file's text, a program's
language from its file name (the judge's language table), a checker's single source.

Invariants: a package is read whole or refused with ``PackageError`` naming the file at fault
(nothing half read is judged); the files read are bounded (``MAX_FILE_BYTES`` each, the
problem's ``MAX_BYTES`` in all) and must be UTF-8 text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from farm.errors import ProblemError
from farm.judge.languages import LANGUAGES
from farm.judge.problems import MAX_BYTES, Problem
from farm.models.judge import JudgeProgram

MAX_FILE_BYTES = MAX_BYTES
# File extensions the language table does not name, and the row they mean.
EXTRA_SUFFIXES = {".cc": "cpp17", ".cxx": "cpp17", ".c++": "cpp17", ".py3": "python3"}
HEADERS = (".h", ".hpp", ".hh")
SOURCES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".py", ".py3", ".java", ".go", ".rs", ".js")
LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.MULTILINE)
IMAGE_HEADERS = {"testlib.h"}  # the judge image's own: left to its include path


class PackageError(ProblemError):
    """A package farm cannot read: the message says what, ``path`` names the file."""


@dataclass(frozen=True)
class Package:
    """A package read: its ``problem``, each test's file in it (``names``, in the tests'
    order: ``data/secret/01``, ``tests/01``) and its ``format`` (``kattis``, ``polygon``)."""

    problem: Problem
    names: list[str]
    format: str


def read_package(root: str | Path) -> Problem:
    """The problem in directory ``root``: a Kattis package (``problem.yaml``) or a Polygon
    one (``problem.xml``)."""
    return open_package(root).problem


def open_package(root: str | Path) -> Package:
    """``read_package`` with the names of the tests' files."""
    path = Path(root)
    if (path / "problem.yaml").is_file():
        from farm.judge.kattis import read_kattis

        return read_kattis(path)
    if (path / "problem.xml").is_file():
        from farm.judge.polygon import read_polygon

        return read_polygon(path)
    raise PackageError(
        "not a problem package: no problem.yaml (Kattis) or problem.xml (Polygon)", path=str(path)
    )


def read_text(path: Path) -> str:
    """A package file's text; ``PackageError`` when missing, too large or not UTF-8."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PackageError(f"{size} bytes, over {MAX_FILE_BYTES}", path=str(path))
        return path.read_bytes().decode()
    except FileNotFoundError:
        raise PackageError("missing", path=str(path)) from None
    except UnicodeDecodeError as exc:
        raise PackageError(f"not UTF-8 text ({exc.reason})", path=str(path)) from None
    except OSError as exc:
        raise PackageError(f"cannot be read: {exc.strerror}", path=str(path)) from None


def language_of(name: str) -> str | None:
    """The judge language whose source file name ends like ``name`` (the table's first row:
    ``.cpp`` is ``cpp17``), or ``None``."""
    suffix = Path(name).suffix.lower()
    if suffix in EXTRA_SUFFIXES:
        return EXTRA_SUFFIXES[suffix]
    for language, row in LANGUAGES.items():
        if Path(row.file).suffix == suffix:
            return language
    return None


def program(
    path: Path, protocol: Literal["testlib", "kattis"], language: str | None = None
) -> JudgeProgram:
    """A checker or interactor from its source file, or from a directory holding one source
    and its local headers (``#include "x.h"`` of the directory's own files is inlined, once
    each: a ``JudgeProgram`` is one source); ``language``: else from the file name."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        sources = [p for p in files if p.suffix.lower() in SOURCES]
        if any(p.name in ("build", "run") for p in files):
            why = "a program built by a 'build' or 'run' script is not supported"
            raise PackageError(why, path=str(path))
        if len(sources) != 1:
            names = ", ".join(p.name for p in sources) or "none"
            raise PackageError(f"one source file expected, found: {names}", path=str(path))
        headers = {p.name: p for p in files if p.suffix.lower() in HEADERS}
        source_path = sources[0]
    else:
        headers = {}
        source_path = path
    language = language or language_of(source_path.name)
    if language is None:
        raise PackageError("no judge language has this file's extension", path=str(source_path))
    source = _inline(read_text(source_path), headers, set())
    return JudgeProgram(language=language, source=source, protocol=protocol)


def _inline(source: str, headers: dict[str, Path], done: set[str]) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in IMAGE_HEADERS or name not in headers:
            return match.group(0)
        if name in done:
            return f"// {name}: inlined above"
        done.add(name)
        return _inline(read_text(headers[name]), headers, done)

    return LOCAL_INCLUDE.sub(include, source)
