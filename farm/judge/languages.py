"""The languages a judge image can hold: how to compile and run each, and its Debian packages.

An image built with ``farm image build judge --languages ...`` holds the chosen rows of this
table (plus a spec's own ``[languages.NAME]`` rows) as ``/etc/farm/judge/languages.json``,
which the kernel's runner reads (``farm.kernel.judge.languages``). ``compile`` runs in the build
directory and may be a syntax check (Python, node, bash), so that every language has ``CE``;
``run`` may name ``{memory_mb}``, both may name ``{file}`` and ``{main}``, which ``entry``
reads from the source (``farm.kernel.judge.entries``: Java's class); an item's
``compile_options`` go at a ``compile`` word ``{options}``, else before the source's name.
``judge0`` is the language's id in Judge0 CE's table, for ``/judge0`` (``farm.serve.judge0``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Language(BaseModel):
    """One row of the table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="the source's file name")
    entry: Literal["java", "go"] | None = Field(
        default=None,
        description="the rule reading {file} and {main} from the source "
        "(farm.kernel.judge.entries); none: 'file' and its stem",
    )
    compile: tuple[str, ...] = ()
    run: tuple[str, ...] = Field(min_length=1)
    version: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    judge0: int | None = Field(default=None, description="Judge0 CE's language id")
    title: str = ""

    def for_image(self) -> dict[str, Any]:
        """The row as the image's table holds it (the kernel reads these keys)."""
        return {
            "file": self.file,
            "entry": self.entry,
            "compile": list(self.compile),
            "run": list(self.run),
            "version": list(self.version),
        }


_PY_CHECK = "import sys; compile(open(sys.argv[1], 'rb').read(), sys.argv[1], 'exec')"

LANGUAGES: dict[str, Language] = {
    "python3": Language(
        file="main.py",
        compile=("python3", "-I", "-S", "-c", _PY_CHECK, "main.py"),  # no site: half the start
        run=("python3", "main.py"),
        version=("python3", "--version"),
        judge0=71,
        title="Python (3)",
    ),
    "c": Language(
        file="main.c",
        compile=("gcc", "-O2", "-std=gnu11", "-o", "main", "main.c", "-lm"),
        run=("./main",),
        version=("gcc", "--version"),
        apt=("gcc", "libc6-dev"),
        judge0=50,
        title="C (GCC)",
    ),
    "cpp17": Language(
        file="main.cpp",
        compile=("g++", "-O2", "-std=gnu++17", "-o", "main", "main.cpp"),
        run=("./main",),
        version=("g++", "--version"),
        apt=("g++",),
        judge0=52,
        title="C++17 (GCC)",
    ),
    "cpp20": Language(
        file="main.cpp",
        compile=("g++", "-O2", "-std=gnu++20", "-o", "main", "main.cpp"),
        run=("./main",),
        version=("g++", "--version"),
        apt=("g++",),
        judge0=54,
        title="C++20 (GCC)",
    ),
    "java17": Language(
        file="Main.java",  # unless the source names its class: Solution.java, A.java
        entry="java",
        compile=(
            "javac",
            "-encoding",
            "UTF-8",
            "-J-XX:+UseSerialGC",
            "-J-XX:TieredStopAtLevel=1",
            "-d",
            ".",
            "{file}",
        ),
        # No -Xmx{memory_mb}m: a heap at the limit turns MLE into an OutOfMemoryError (RE).
        run=("java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss64m", "{main}"),
        version=("javac", "-version"),
        apt=("openjdk-17-jdk-headless",),
        judge0=62,
        title="Java (OpenJDK 17)",
    ),
    "go": Language(
        file="main.go",
        entry="go",  # package main, or CE
        compile=("go", "build", "-o", "main", "main.go"),
        run=("./main",),
        version=("go", "version"),
        apt=("golang-go",),
        judge0=60,
        title="Go",
    ),
    "rust": Language(
        file="main.rs",
        compile=("rustc", "-O", "--edition", "2021", "-o", "main", "main.rs"),
        run=("./main",),
        version=("rustc", "--version"),
        apt=("rustc",),
        judge0=73,
        title="Rust",
    ),
    "javascript": Language(
        file="main.js",
        compile=("node", "--check", "main.js"),
        run=("node", "main.js"),
        version=("node", "--version"),
        apt=("nodejs",),
        judge0=63,
        title="JavaScript (Node.js)",
    ),
    "bash": Language(
        file="main.sh",
        compile=("bash", "-n", "main.sh"),
        run=("bash", "main.sh"),
        version=("bash", "--version"),
        judge0=46,
        title="Bash",
    ),
}


def apt_packages(table: dict[str, Language]) -> tuple[str, ...]:
    """The Debian packages of ``table``'s languages, sorted, each once."""
    return tuple(sorted({package for language in table.values() for package in language.apt}))
