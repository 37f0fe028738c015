"""Where a submission's program starts, read from its source (a language's ``entry`` rule).

``java``: the source file is named after its public top-level type (javac insists) and the
type holding ``static void main`` runs, whatever their names (``Solution``, ``CF1234A``,
unicode), as on Codeforces and DMOJ. ``go``: only ``package main`` is a program. ``kotlin``:
the class of ``main``, top-level or an object's. Comments and
literals are blanked first: ``// public class Foo`` names nothing. A source that cannot be a
program is a compile error (``EntryError``), never a failure of the runner.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

NAME_BYTES = 255  # a file name's limit on Linux


class EntryError(Exception):
    """The source cannot be a program of its language: a ``CE`` with this message."""


class Entry(NamedTuple):
    """The source's file name in the build directory, and what the run command starts."""

    file: str
    main: str


def find(rule: str | None, source: str, default_file: str) -> Entry:
    """The entry of ``source`` by ``rule`` (none: the table's file and its stem)."""
    if not rule:
        return Entry(default_file, _stem(default_file))
    finder = RULES.get(rule)
    if finder is None:  # the image's table names a rule this kernel lacks: farm's fault
        raise ValueError(f"no entry rule {rule!r} (known: {', '.join(sorted(RULES))})")
    return finder(source, default_file)


def _stem(file: str) -> str:
    return os.path.splitext(file)[0]


# Java: one pass, the leftmost match first, so that a "//" inside a string stays the string's.
_JAVA_UNICODE = re.compile(r"(?<!\\)((?:\\\\)*)\\u+([0-9a-fA-F]{4})")
_JAVA_NOISE = re.compile(
    r"//[^\n]*"
    r"|/\*.*?(?:\*/|\Z)"
    r'|"""(?:\\.|[^\\])*?(?:"""|\Z)'
    r'|"(?:\\.|[^"\\\n])*"?'
    r"|'(?:\\.|[^'\\\n])*'?",
    re.S,
)
# Bounded repetitions: a source of a thousand modifiers stays linear.
_JAVA_MODIFIERS = (
    r"(?:(?:public|protected|private|abstract|static|final|strictfp|sealed|non-sealed)\s+"
    r"|@[\w$.]+\s*(?:\([^()]*\)\s*)?){0,16}"
)
_JAVA_TOKENS = re.compile(
    r"(?P<end>[{};])"
    rf"|(?P<modifiers>(?<![\w$.]){_JAVA_MODIFIERS})"
    r"(?:class|interface|enum|record)\s+(?P<name>[^\W\d][\w$]*|\$[\w$]*)"
    r"|(?P<main>\bvoid\s+main\s*\()"
)
_JAVA_PACKAGE = re.compile(r"\bpackage\s+([\w$]+(?:\s*\.\s*[\w$]+)*)\s*;")


@dataclass
class _JavaType:
    name: str
    public: bool
    main: bool = False


def _blank(match: re.Match[str]) -> str:
    """A comment or literal as spaces, its line breaks kept."""
    return re.sub(r"[^\n]", " ", match[0])


def _java_code(source: str) -> str:
    """``source`` as javac reads it (unicode escapes translated), comments and literals
    blanked."""
    source = _JAVA_UNICODE.sub(lambda m: m[1] + chr(int(m[2], 16)), source)
    return _JAVA_NOISE.sub(_blank, source)


def _java_types(code: str) -> list[_JavaType]:
    """The top-level types of ``code``, in order, each with whether it is public and has a
    ``static void main`` of its own (among its members, not a nested type's)."""
    types: list[_JavaType] = []
    depth = 0
    member = 0  # where the current member's declaration began: after a brace or ";"
    for match in _JAVA_TOKENS.finditer(code):
        if match["end"] is not None:
            depth += {"{": 1, "}": -1, ";": 0}[match["end"]]
            depth, member = max(depth, 0), match.end()
        elif match["name"] is not None and depth == 0:
            public = "public" in re.findall(r"[\w-]+", match["modifiers"])
            types.append(_JavaType(match["name"], public))
        elif match["main"] is not None and depth == 1 and types:
            types[-1].main |= re.search(r"\bstatic\b", code[member : match.start()]) is not None
            member = match.end()
    return types


def java(source: str, default_file: str) -> Entry:
    """The file is the public type's (else the one with ``main``'s, else the default); the
    class run is the one with ``main`` (the public one first), else the file's: the JVM then
    says there is no main method, a runtime error of a source that compiled."""
    code = _java_code(source)
    types = _java_types(code)
    public = [t for t in types if t.public]
    with_main = sorted((t for t in types if t.main), key=lambda t: not t.public)
    named = public[0] if public else with_main[0] if with_main else None
    file = f"{named.name}.java" if named is not None else default_file
    if len(file.encode()) + 1 > NAME_BYTES:  # .class is a byte longer than .java
        raise EntryError(f"class {file[:32]}...: its name is too long for a file name")
    main = with_main[0].name if with_main else _stem(file)
    package = _JAVA_PACKAGE.search(code)
    if package is not None:  # compiled with -d .: the class is at its package's path
        main = "".join(package[1].split()) + "." + main
    return Entry(file, main)


_GO_COMMENTS = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_GO_PACKAGE = re.compile(r"\s*package\s+([^\W\d]\w*)")


def go(source: str, default_file: str) -> Entry:
    """The table's file, if its package clause (the first thing after comments) says
    ``main``: ``go build`` of another package makes no program."""
    code = _GO_COMMENTS.sub(_blank, source.removeprefix("\ufeff"))
    clause = _GO_PACKAGE.match(code)
    if clause is not None and clause[1] != "main":
        raise EntryError(
            f"{default_file}: package {clause[1]} is not a program: a Go submission must be "
            "package main, with func main"
        )
    return Entry(default_file, _stem(default_file))


# Kotlin: a top-level main is the file's class (main.kt: MainKt); an object's @JvmStatic main, or
# a companion object's, is a static method of the object, or of the class holding the companion.
_KOTLIN_TOKENS = re.compile(
    r"(?P<brace>[{}])"
    r"|(?P<companion>\bcompanion\s+object\b)(?:\s+[^\W\d]\w*)?"
    r"|\b(?:object|class|interface)\s+(?P<name>[^\W\d]\w*|`[^`\n]+`)"
    r"|(?P<main>\bfun\s+main\s*\()"
    r"|(?P<fun>\bfun\b)"
)
_KOTLIN_PACKAGE = re.compile(r"^\s*package\s+([\w.`]+)", re.M)


def kotlin(source: str, default_file: str) -> Entry:
    """The table's file; the class to run: the file's (``MainKt``) for a top-level ``fun
    main``, else the object or class whose body (or companion object) holds one: Codeforces'
    ``object Main { @JvmStatic fun main(...) }``."""
    code = _java_code(source)  # the same comments and string literals as Java's, blanked
    stem = _stem(default_file)
    main = stem[:1].upper() + stem[1:] + "Kt"
    stack: list[str | None] = []  # per open brace: the type it is the body of, if any
    pending: str | None = None  # a type declared, its body not yet open
    found: str | None = None
    for match in _KOTLIN_TOKENS.finditer(code):
        if match["brace"] == "{":
            stack.append(pending)
            pending = None
        elif match["brace"] == "}":
            if stack:
                stack.pop()
        elif match["companion"] is not None:  # its main is the enclosing class's
            pending = next((t for t in reversed(stack) if t), None)
        elif match["name"] is not None:
            pending = match["name"].strip("`")
        elif match["main"] is not None:
            if not stack:
                found = main
                break
            found = found or stack[-1]
        else:  # another function: a type declared before it had no body
            pending = None
    package = _KOTLIN_PACKAGE.search(code)
    name = found or main
    if package is not None:
        name = package[1].replace("`", "") + "." + name
    return Entry(default_file, name)


RULES: dict[str, Callable[[str, str], Entry]] = {"java": java, "go": go, "kotlin": kotlin}
