"""Names in the docs exist: every dotted ``farm.x.y`` and every ``farm/x/y.py`` path named in
a module docstring of ``farm/``, in README.md, in docs/**/*.md or in a build file (images/,
deploy/, helm/) is a module, a package or an attribute of one, or a file. A path without
``farm/`` (``worker/session_calls.py``) counts when it is a file under ``farm/`` or exactly
one file there ends with it; a name in double backticks from a package of farm
(``repl.session_loop``) when a module ends with it; ``tests/``, ``bench/`` and ``scripts/``
paths are files of the repository. The docs are read when the test runs (they change while
farm does).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import farm

FARM = Path(farm.__file__).parent
ROOT = FARM.parent
REPO_DIRS = ("tests", "bench", "scripts", "examples", "deploy", "images")

# Not after a word, a dot, a slash or a dash: ``farm.dev`` in a URL, ``x.farm.y`` are not names.
DOTTED = re.compile(r"(?<![\w./-])farm(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])(?:[\w-]+/)+[\w-]+\.py\b")
RELATIVE = re.compile(r"``([a-z_]+\.[a-z_]\w*)")  # ``package.module``, then maybe attributes
PACKAGES = {p.name for p in FARM.rglob("*") if p.is_dir() and p.name != "__pycache__"}
MODULES = {
    ".".join(p.relative_to(FARM).with_suffix("").parts).removesuffix(".__init__")
    for p in FARM.rglob("*.py")
}


def documents() -> dict[str, str]:
    """Where names are written: module docstrings, README.md and docs/**/*.md."""
    texts = {}
    for path in sorted(FARM.rglob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        if docstring:
            texts[str(path.relative_to(ROOT))] = docstring
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if path.exists():
            texts[str(path.relative_to(ROOT))] = path.read_text()
    return texts


def build_files() -> dict[str, str]:
    """Where farm's modules are run or named outside Python: Dockerfiles, the chart, the
    AppArmor profile, compose and the Makefile (a stale one there breaks a build)."""
    found = [*ROOT.glob("images/**/*"), *ROOT.glob("deploy/**/*"), *ROOT.glob("helm/**/*")]
    found += [ROOT / "docker-compose.yml", ROOT / "Makefile"]
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(found) if p.is_file()}


def checked(name: str) -> bool:
    """Whether ``name`` names farm's code: its second part is a module or package of farm, or
    a public name of ``farm`` (``farm.session(...)`` on a variable called farm is not)."""
    first = name.split(".")[1]
    return (FARM / first).is_dir() or (FARM / f"{first}.py").exists() or first in farm.__all__


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def path_exists(path: str) -> bool:
    first = path.split("/")[0]
    if first == "farm" or first in REPO_DIRS:
        return (ROOT / path).is_file()
    if (FARM / path).is_file():  # relative to farm/ (docs/architecture.md's tables)
        return True
    matches = [p for p in FARM.rglob(Path(path).name) if p.as_posix().endswith(f"/{path}")]
    return len(matches) == 1


def is_farm_path(path: str) -> bool:
    """A path of the repository, or one a directory under ``farm/`` could start."""
    first = path.split("/")[0]
    return first == "farm" or first in REPO_DIRS or any(FARM.rglob(first))


def relative_exists(name: str) -> bool:
    """``package.module`` of farm, written from inside farm: some module ends with it."""
    return any(m == name or m.endswith(f".{name}") for m in MODULES)


def stale_names(texts: dict[str, str]) -> list[str]:
    stale = []
    for where, text in texts.items():
        names = {n for n in DOTTED.findall(text) if checked(n) and not resolves(n)}
        paths = {p for p in PATH.findall(text) if is_farm_path(p) and not path_exists(p)}
        relative = {
            n
            for n in RELATIVE.findall(text)
            if n.split(".")[0] in PACKAGES and n.split(".")[0] != "farm" and not relative_exists(n)
        }
        stale += [f"{where}: {n}" for n in sorted(names | paths | relative)]
    return stale


def test_every_name_in_the_docstrings_and_docs_exists() -> None:
    texts = {where: text for where, text in documents().items() if where != "README.md"}
    assert len(texts) > 100  # the docstrings and the docs were found
    assert stale_names(texts) == []


def test_every_name_in_the_build_files_exists() -> None:
    """``python3 -m farm.kernel.judge.languages`` in a Dockerfile broke every environment's
    build when the module was renamed; so the build files are read too."""
    texts = build_files()
    assert any(where.endswith("Dockerfile") for where in texts)
    assert stale_names(texts) == []


def test_every_name_in_the_readme_exists() -> None:
    texts = documents()
    assert stale_names({"README.md": texts["README.md"]}) == []


def test_a_stale_name_or_path_is_found() -> None:
    text = (
        "See farm.kernel.wire.framing, farm.models.ExecResult.raise_for_error, "
        "kernel/wire/framing.py, ``repl.session_loop`` and tests/test_doc_names.py; but not "
        "farm.kernel.probe, farm.models.Nothing, farm/kernel/probe.py, wire/probe_gone.py, "
        "bench/nothing.py or ``repl.session``. "
        "A variable: farm.session(image). A URL: https://x.farm.dev/a.py."
    )
    assert stale_names({"doc": text}) == [
        "doc: bench/nothing.py",
        "doc: farm.kernel.probe",
        "doc: farm.models.Nothing",
        "doc: farm/kernel/probe.py",
        "doc: repl.session",
        "doc: wire/probe_gone.py",
    ]
