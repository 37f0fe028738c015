"""The judge's language table, as an image holds it: ``/etc/farm/judge/languages.json``.

Each language: ``file`` (the source's name), ``entry`` (a rule of ``entries`` naming the file
and the ``{main}`` to run from the source, or none), ``compile`` (argv, or none: the source runs
as it is), ``run`` (argv; ``{memory_mb}`` is the test's limit), ``version`` (argv whose first
output line names the toolchain). The table is written by the image build from
``farm.judge.languages`` (or a spec's own table); ``python3 -m farm.kernel.judge.language_table
FILE`` runs in that build and records each ``version`` answer in the file, so that a result can
name its toolchain without starting one per item.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

TABLE = "/etc/farm/judge/languages.json"
VERSION_TIMEOUT_S = 60.0


def load(path: str = TABLE) -> dict[str, dict[str, Any]]:
    """The table (empty when the image judges nothing)."""
    try:
        with open(path) as f:
            table: dict[str, dict[str, Any]] = json.load(f)
    except FileNotFoundError:
        return {}
    return table


def version_of(argv: list[str]) -> str:
    """The first non-empty output line of ``argv`` (stdout, else stderr: ``javac -version``
    answered on stderr before JDK 9), or why there is none."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    for stream in (done.stdout, done.stderr):
        for line in stream.decode(errors="replace").splitlines():
            if line.strip():
                return line.strip()
    return f"unknown (exit {done.returncode}, no output)"


def resolve_versions(path: str) -> None:
    """Record each language's ``version`` answer in the table at ``path`` (at build time)."""
    table = load(path)
    for language in table.values():
        language["version_text"] = (
            version_of(language["version"]) if language.get("version") else ""
        )
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    for name, language in sorted(table.items()):
        print(f"{name}: {language['version_text']}")


if __name__ == "__main__":
    resolve_versions(sys.argv[1] if len(sys.argv) > 1 else TABLE)
