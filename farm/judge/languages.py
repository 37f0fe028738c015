"""The languages a judge image can hold: how to compile and run each, and its Debian packages.

An image built with ``farm image build judge --languages ...`` holds the chosen rows of this
table (``farm.judge.toolchains``; by default all but ``OPT_IN``, plus a spec's own
``[languages.NAME]`` rows) as ``/etc/farm/judge/languages.json``, which the kernel's runner
reads (``farm.kernel.judge.language_table``). ``compile`` may be a syntax check, so that every
language has ``CE``; ``run`` may name ``{memory_mb}``, both ``{file}`` and ``{main}`` (read
from the source: ``farm.kernel.judge.entries``); an item's ``compile_options`` go at a word
``{options}``, else before the source's name. ``judge0``: Judge0 CE's id, for ``/judge0``.
``python -m farm.judge.languages [--markdown]`` prints the table (docs/judge.md's is its output).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping

from farm.judge.toolchains import OPT_IN, ROWS, VERSIONS, Language

__all__ = ["DEFAULT_LANGUAGES", "LANGUAGES", "OPT_IN", "Language", "apt_packages", "markdown"]

LANGUAGES: dict[str, Language] = dict(ROWS)
DEFAULT_LANGUAGES: tuple[str, ...] = tuple(name for name in LANGUAGES if name not in OPT_IN)


def apt_packages(table: Mapping[str, Language]) -> tuple[str, ...]:
    """The Debian packages of ``table``'s languages, sorted, each once."""
    return tuple(sorted({package for language in table.values() for package in language.apt}))


def _command(argv: tuple[str, ...]) -> str:
    return f"`{shlex.join(argv)}`".replace("|", "\\|") if argv else "(none)"


def markdown(versions: Mapping[str, str] | None = None) -> str:
    """The table as Markdown: each language's name, Judge0 id, compile and run commands, and
    its toolchain's version (``versions``: a built image's words, else the command asking)."""
    lines = [
        "| language | Judge0 id | compile | run | version |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in LANGUAGES.items():
        opt_in = " (opt-in)" if name in OPT_IN else ""
        version = (versions or {}).get(name) or _command(row.version)
        cells = [
            f"`{name}`{opt_in}: {row.title}",
            str(row.judge0 or "-"),
            _command(row.compile),
            _command(row.run),
            version.replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--markdown"]):
        sys.exit("usage: python -m farm.judge.languages [--markdown]")
    sys.stdout.write(markdown(VERSIONS))
