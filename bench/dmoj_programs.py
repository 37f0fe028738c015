"""DMOJ's bridged checkers and interactors as farm ``JudgeProgram``s (for ``bench/dmoj_cases.py``).

``checker: {name: bridged, args: {files, lang, type}}`` and ``interactive: {files, lang, type}``
name a program of the problem's: its ``files`` (a source and its local headers, inlined as
``farm.judge.packages.program`` does a package's), its DMOJ language and the contrib module
whose protocol it speaks. ``testlib`` is farm's; ``default`` runs as testlib (alike for exits 0
and 1, which is all DMOJ's default knows besides failure). What farm cannot express raises
``ValueError`` with the reason: arguments (``args_format_string``), compiler ``flags``, the
``coci`` and ``peg`` protocols, a language the image lacks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from farm.judge.packages import PackageError, language_of, program
from farm.models.judge import JudgeProgram

# DMOJ's contrib module -> farm's protocol, and what the mapping leaves out (a case's note).
PROTOCOLS = {"testlib": ("testlib", ""), "default": ("testlib", "DMOJ's default as testlib")}
NOT_SPOKEN = {
    "coci": "coci's protocol (exit 7 with 'partial a/b' on stderr) is not farm's testlib",
    "peg": "peg's protocol (answer, output, input; a ratio on stdout) is not one farm speaks",
}
ARTICLE = {"checker": "a", "interactor": "an"}


def judge_program(
    root: Path, spec: dict[str, Any], languages: dict[str, str], who: str
) -> tuple[JudgeProgram, str]:
    """The program DMOJ's ``spec`` names (``languages``: DMOJ's names -> the image's), and a
    note on the mapping ("" when exact); ``ValueError`` when farm cannot run it as DMOJ does."""
    kind = str(spec.get("type", "default"))
    if spec.get("args_format_string"):
        raise ValueError(
            f"{ARTICLE[who]} {who} with DMOJ's args_format_string (farm passes testlib's)"
        )
    if spec.get("flags"):
        raise ValueError(
            f"{ARTICLE[who]} {who} compiled with flags {spec['flags']} (a JudgeProgram has none)"
        )
    if kind in NOT_SPOKEN:
        raise ValueError(f"a {kind} {who}: {NOT_SPOKEN[kind]}")
    if kind not in PROTOCOLS:
        raise ValueError(
            f"{ARTICLE[who]} {who} of type {kind!r}, not a DMOJ contrib module (DMOJ: IE)"
        )
    protocol, note = PROTOCOLS[kind]
    files = spec["files"]
    names = [files] if isinstance(files, str) else list(files)
    dmoj = spec.get("lang")
    language = languages.get(dmoj) if dmoj else language_of(names[0])
    if language is None:
        raise ValueError(
            f"{ARTICLE[who]} {who} in {dmoj or names[0]}, which farm's judge image lacks"
        )
    with tempfile.TemporaryDirectory() as temp:  # the listed files alone, as one program
        for name in names:
            (Path(temp) / Path(name).name).symlink_to((root / name).resolve())
        try:
            made = program(Path(temp) if len(names) > 1 else root / names[0], protocol, language)
        except PackageError as error:
            raise ValueError(f"the {who}: {error}") from None
    return made, f"{who}: {note}" if note else ""
