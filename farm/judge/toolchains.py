"""The judge's language table (``farm.judge.languages``): its row (``Language``) and the rows,
each language as the major judges run it (Judge0 CE's ids and commands, Codeforces' and DMOJ's
flags), from Debian bookworm's packages. ``OPT_IN``: rows an image holds only when asked for by
name (``farm image build judge --languages ...``), their toolchains too large for every judge
image. Why these languages and flags: docs/design/judge.md, "Languages".
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Language(BaseModel):
    """One row of the table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="the source's file name")
    entry: Literal["java", "go", "kotlin"] | None = Field(
        default=None,
        description="the rule reading {file} and {main} from the source "
        "(farm.kernel.judge.entries); none: 'file' and its stem",
    )
    compile: tuple[str, ...] = ()
    run: tuple[str, ...] = Field(min_length=1)
    version: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    judge0: int | None = Field(default=None, description="Judge0 CE's language id")
    out_of_memory: tuple[str, ...] = Field(
        default=(),
        description="what the runtime writes on stderr when its heap, bounded at the memory "
        "limit, is full: a failing run saying it is MLE",
    )
    title: str = ""

    def for_image(self) -> dict[str, Any]:
        """The row as the image's table holds it (the kernel reads these keys)."""
        return {
            "file": self.file,
            "entry": self.entry,
            "compile": list(self.compile),
            "run": list(self.run),
            "version": list(self.version),
            "out_of_memory": list(self.out_of_memory),
        }


_PY_CHECK = 'import sys; compile(open(sys.argv[1], "rb").read(), sys.argv[1], "exec")'
# The JVM as the judge runs it: one GC thread, C1 only (a short program starts sooner), a deep
# stack for recursion, the heap bounded at the limit as DMOJ and Kattis do (sized from the
# host's memory, it filled with garbage before the first collection: a 71 MB peak for a loop of
# splits), its OutOfMemoryError MLE. -PrintWarnings: Debian's kotlinc passes flags JDK 17
# deprecates.
_JVM = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
_JVM_RUN = ("java", *_JVM, "-Xss64m", "-Xmx{memory_mb}m")
_JVM_OUT_OF_MEMORY = ("java.lang.OutOfMemoryError", "Too small maximum heap")
# compile-file reads and compiles the whole file first (a reader or compile error is CE, as
# with a compiler), then the run loads the fasl. failure-p: an ERROR or WARNING, not a style one.
_LISP_COMPILE = (
    '(multiple-value-bind (fasl warned failed) (compile-file "main.lisp") '
    "(declare (ignore fasl warned)) (sb-ext:exit :code (if failed 1 0) :abort t))"
)

ROWS: dict[str, Language] = {
    "python3": Language(
        file="main.py",
        compile=("python3", "-I", "-S", "-c", _PY_CHECK, "main.py"),  # no site: half the start
        run=("python3", "main.py"),
        version=("python3", "--version"),
        judge0=71,
        title="Python (3)",
    ),
    "pypy3": Language(
        file="main.py",
        compile=("pypy3", "-I", "-S", "-c", _PY_CHECK, "main.py"),  # its own grammar: 3.9's
        run=("pypy3", "main.py"),
        version=("pypy3", "--version"),
        apt=("pypy3",),
        title="Python (PyPy 3)",  # Judge0 CE has no PyPy
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
            *(f"-J{flag}" for flag in _JVM),
            "-d",
            ".",
            "{file}",
        ),
        run=(*_JVM_RUN, "{main}"),
        out_of_memory=_JVM_OUT_OF_MEMORY,
        version=("javac", "-version"),
        apt=("openjdk-17-jdk-headless",),
        judge0=62,
        title="Java (OpenJDK 17)",
    ),
    "kotlin": Language(
        file="main.kt",
        entry="kotlin",  # the class of main: MainKt, or an object's (@JvmStatic)
        compile=(
            "kotlinc",
            # JNA's native library goes to /tmp, not to ./?/.cache (no user.home for a box uid)
            *(f"-J{flag}" for flag in (*_JVM, "-XX:-PrintWarnings", "-Djna.tmpdir=/tmp")),
            "main.kt",
            "-include-runtime",
            "-d",
            "main.jar",
        ),
        run=(*_JVM_RUN, "-cp", "main.jar", "{main}"),
        out_of_memory=_JVM_OUT_OF_MEMORY,
        # kotlinc -version says "1.3-SNAPSHOT" in Debian's build: the package names the release.
        version=("dpkg-query", "-W", "-f", "kotlinc-jvm ${Version}\\n", "kotlin"),
        apt=("kotlin",),
        judge0=78,
        title="Kotlin (JVM)",
    ),
    "csharp": Language(
        file="main.cs",
        compile=("mcs", "-optimize+", "-r:System.Numerics.dll", "-out:main.exe", "main.cs"),
        run=("mono", "main.exe"),
        version=("mcs", "--version"),
        apt=("mono-mcs", "mono-runtime"),
        judge0=51,
        title="C# (Mono)",
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
    "haskell": Language(
        file="main.hs",
        compile=("ghc", "-O2", "-o", "main", "main.hs"),
        run=("./main",),
        version=("ghc", "--version"),
        apt=("ghc",),
        judge0=61,
        title="Haskell (GHC)",
    ),
    "ocaml": Language(
        file="main.ml",
        compile=("ocamlopt", "-o", "main", "main.ml"),
        run=("./main",),
        version=("ocamlopt", "-v"),
        apt=("ocaml-nox",),
        judge0=65,
        title="OCaml",
    ),
    "pascal": Language(
        file="main.pas",
        compile=("fpc", "-O2", "-XS", "-Sgic", "-omain", "main.pas"),
        run=("./main",),
        version=("fpc", "-h"),
        apt=("fp-compiler",),
        judge0=67,
        title="Pascal (Free Pascal)",
    ),
    "fortran": Language(
        file="main.f90",
        compile=("gfortran", "-O2", "-o", "main", "main.f90"),
        run=("./main",),
        version=("gfortran", "--version"),
        apt=("gfortran",),
        judge0=59,
        title="Fortran (GFortran)",
    ),
    "d": Language(
        file="main.d",
        compile=("gdc", "-O2", "-frelease", "-o", "main", "main.d"),
        run=("./main",),
        version=("gdc", "--version"),
        apt=("gdc",),
        judge0=56,
        title="D (GDC)",
    ),
    "commonlisp": Language(
        file="main.lisp",
        compile=(
            "sbcl",
            "--noinform",
            "--non-interactive",
            "--no-sysinit",
            "--no-userinit",
            "--eval",
            _LISP_COMPILE,
        ),
        run=("sbcl", "--script", "main.fasl"),
        version=("sbcl", "--version"),
        apt=("sbcl",),
        judge0=55,
        title="Common Lisp (SBCL)",
    ),
    "prolog": Language(
        file="main.pl",  # :- initialization(main). runs it, as in Judge0
        compile=("gplc", "--no-top-level", "-o", "main", "main.pl"),
        run=("./main",),
        version=("gplc", "--version"),
        apt=("gprolog",),
        judge0=69,
        title="Prolog (GNU Prolog)",
    ),
    "ruby": Language(
        file="main.rb",
        compile=("ruby", "-c", "main.rb"),
        run=("ruby", "main.rb"),
        version=("ruby", "--version"),
        apt=("ruby",),
        judge0=72,
        title="Ruby",
    ),
    "php": Language(
        file="main.php",
        compile=("php", "-l", "main.php"),
        run=("php", "main.php"),
        version=("php", "--version"),
        apt=("php-cli",),
        judge0=68,
        title="PHP",
    ),
    "perl": Language(
        file="main.pl",
        compile=("perl", "-c", "main.pl"),
        run=("perl", "main.pl"),
        version=("perl", "-e", "print qq(perl $^V\\n)"),
        apt=("perl",),
        judge0=85,
        title="Perl",
    ),
    "lua": Language(
        file="main.lua",
        compile=("luac5.4", "-p", "main.lua"),
        run=("lua5.4", "main.lua"),
        version=("lua5.4", "-v"),
        apt=("lua5.4",),
        judge0=64,
        title="Lua",
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

OPT_IN = frozenset({"haskell", "ocaml"})

# What a judge image built from Debian bookworm's packages answered to each ``version``
# (its version_text), for docs/judge.md's table: a result names its own image's toolchain.
VERSIONS: dict[str, str] = {
    "python3": "Python 3.11.2",
    "pypy3": "Python 3.9.16 (7.3.11+dfsg-2+deb12u3, Dec 30 2024, 22:36:23)",
    "c": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0",
    "cpp17": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0",
    "cpp20": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0",
    "java17": "javac 17.0.19",
    "kotlin": "kotlinc-jvm 1.3.31+ds1-1",
    "csharp": "Mono C# compiler version 6.8.0.105",
    "go": "go version go1.19.8 linux/amd64",
    "rust": "rustc 1.63.0",
    "haskell": "The Glorious Glasgow Haskell Compilation System, version 9.0.2",
    "ocaml": "The OCaml native-code compiler, version 4.13.1",
    "pascal": "Free Pascal Compiler version 3.2.2+dfsg-20 [2023/03/30] for x86_64",
    "fortran": "GNU Fortran (Debian 12.2.0-14+deb12u1) 12.2.0",
    "d": "gdc (Debian 12.2.0-14+deb12u1) 12.2.0",
    "commonlisp": "SBCL 2.2.9.debian",
    "prolog": "Prolog compiler (GNU Prolog) 1.4.5",
    "ruby": "ruby 3.1.2p20 (2022-04-12 revision 4491bb740a) [x86_64-linux-gnu]",
    "php": "PHP 8.2.32 (cli) (built: Jul  3 2026 12:22:11) (NTS)",
    "perl": "perl v5.36.0",
    "lua": "Lua 5.4.4  Copyright (C) 1994-2022 Lua.org, PUC-Rio",
    "javascript": "v18.20.4",
    "bash": "GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)",
}
