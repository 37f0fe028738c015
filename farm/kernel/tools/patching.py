"""Apply unified diffs (multi-file, create, delete) all or nothing.

Every hunk of every file is matched first (at its stated line, else the nearest exact match
of its context); only when all match is anything written. A hunk that does not match fails
the whole patch with a message naming the file, the hunk and the line it expected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
DEV_NULL = "/dev/null"


class PatchError(ValueError):
    """The patch is malformed or does not apply; nothing was changed."""


@dataclass
class Hunk:
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    no_newline_at_end: bool = False


@dataclass
class FilePatch:
    source: str
    target: str
    hunks: list[Hunk] = field(default_factory=list)


def _path(header: str) -> str:
    name = header[4:].split("\t")[0].strip()
    if name != DEV_NULL and name[:2] in ("a/", "b/"):
        name = name[2:]
    return name


def parse(diff: str) -> list[FilePatch]:
    patches: list[FilePatch] = []
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            patches.append(FilePatch(_path(line), _path(lines[i + 1])))
            i += 2
            continue
        match = HUNK.match(line)
        if match:
            if not patches:
                raise PatchError("a hunk comes before any '---'/'+++' file header")
            hunk = Hunk(old_start=int(match.group(1)))
            old_left = int(match.group(2) or 1)
            new_left = int(match.group(4) or 1)
            i += 1
            while i < len(lines) and (old_left > 0 or new_left > 0):
                body = lines[i]
                tag, text = body[:1], body[1:]
                if tag == " " or body == "":
                    hunk.old.append(text)
                    hunk.new.append(text)
                    old_left -= 1
                    new_left -= 1
                elif tag == "-":
                    hunk.old.append(text)
                    old_left -= 1
                elif tag == "+":
                    hunk.new.append(text)
                    new_left -= 1
                elif tag != "\\":
                    raise PatchError(f"unexpected line in hunk: {body!r}")
                i += 1
            if i < len(lines) and lines[i].startswith("\\"):
                hunk.no_newline_at_end = True
                i += 1
            if old_left > 0 or new_left > 0:
                raise PatchError(
                    f"hunk at line {hunk.old_start} of {patches[-1].source} "
                    "is shorter than its header says"
                )
            patches[-1].hunks.append(hunk)
            continue
        i += 1
    if not patches:
        raise PatchError("no file headers ('--- a/...', '+++ b/...') found in the patch")
    return patches


def _locate(lines: list[str], hunk: Hunk, offset: int) -> int | None:
    size = len(hunk.old)
    want = max(hunk.old_start - 1 + offset, 0) if size else min(hunk.old_start + offset, len(lines))
    if lines[want : want + size] == hunk.old:
        return want
    candidates = [i for i in range(len(lines) - size + 1) if lines[i : i + size] == hunk.old]
    return min(candidates, key=lambda i: abs(i - want)) if candidates else None


def _apply_file(patch: FilePatch, lines: list[str], name: str) -> tuple[list[str], bool]:
    offset = 0
    result = list(lines)
    trailing_newline = True
    for number, hunk in enumerate(patch.hunks, 1):
        at = _locate(result, hunk, offset)
        if at is None:
            expected = hunk.old[0] if hunk.old else "(end of file)"
            raise PatchError(
                f"hunk {number} of {name} does not apply: expected at line "
                f"{hunk.old_start}: {expected!r}"
            )
        result[at : at + len(hunk.old)] = hunk.new
        offset += len(hunk.new) - len(hunk.old)
        trailing_newline = not hunk.no_newline_at_end
    return result, trailing_newline


def apply_unified_diff(diff: str, confine: Callable[[str], Path]) -> list[str]:
    """Apply ``diff`` with every path passed through ``confine``; return what changed."""
    planned: list[tuple[Path, str | None]] = []
    changed: list[str] = []
    for patch in parse(diff):
        creating = patch.source == DEV_NULL
        deleting = patch.target == DEV_NULL
        name = patch.source if deleting else patch.target
        path = confine(name)
        if creating:
            if path.exists():
                raise PatchError(f"{name} already exists; the patch wants to create it")
            lines: list[str] = []
        else:
            if not path.is_file():
                raise PatchError(f"{name} does not exist")
            lines = path.read_text(encoding="utf-8").splitlines()
        new_lines, trailing = _apply_file(patch, lines, name)
        if deleting:
            planned.append((path, None))
            changed.append(f"deleted {name}")
        else:
            content = "\n".join(new_lines) + ("\n" if trailing and new_lines else "")
            planned.append((path, content))
            changed.append(f"{'created' if creating else 'patched'} {name}")
    for target, new_text in planned:  # every hunk matched: now write
        if new_text is None:
            target.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.farm-patch")
        tmp.write_text(new_text, encoding="utf-8")
        os.replace(tmp, target)
    return changed
