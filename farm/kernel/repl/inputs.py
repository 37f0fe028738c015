"""IPython's input cleaning, which model-written code relies on: a cell is cleaned before it runs.

The four cleanups of IPython 9.x (``inputtransformer2``), with the same rules: leading blank
lines, common indentation, doctest prompts and IPython's own prompts. Magics and ``!shell`` are
not supported: a cell that does not parse and uses them gets ``UnsupportedSyntax`` naming the
feature (``tests/test_kernel_repl.py`` checks every rule against IPython). The rules:
docs/design/kernel.md.
"""

from __future__ import annotations

import re
from textwrap import dedent

_DOCTEST_INITIAL = re.compile(r"^\s*>>>")
_DOCTEST_PS1 = re.compile(r"^\s*>>>[ \t]?")
_DOCTEST_PS2 = re.compile(r"^\s*\.\.\.[ \t]?")
_TRIPLE_QUOTE = re.compile(r"(?<!\\)(\"\"\"|''')")
_STRING_PREFIX = re.compile(r"(?i)^[rubf]*$")
_IPYTHON_PROMPT = re.compile(r"^(((\[nav\]|\[ins\])?\ )?In\ \[\d+\]:\ |\s*\.{3,}:\ ?)")
_SPECIAL = re.compile(r"^\s*(?:[\w.]+\s*=\s*)?(%%?|!!?)(\S*)")


class UnsupportedSyntax(SyntaxError):
    """IPython-only syntax (magics, shell escapes) that a farm session does not run."""


def clean(code: str) -> str:
    """The cell as IPython would run it, after its cleanup transforms."""
    if "\n" not in code and not code[:1].isspace() and not code.startswith((">>>", "In [")):
        return code  # the common one-liner: nothing to clean
    lines = code.splitlines(keepends=True)
    lines = _leading_empty_lines(lines)
    if lines:
        lines = dedent("".join(lines)).splitlines(keepends=True)
    lines = _classic_prompts(lines)
    lines = _ipython_prompts(lines)
    return "".join(lines)


def _leading_empty_lines(lines: list[str]) -> list[str]:
    for i, line in enumerate(lines):
        if line and not line.isspace():
            return lines[i:]
    return lines


def _triple_quote_mask(lines: list[str]) -> list[bool]:
    """True for each line inside a triple-quoted string whose prompts must be kept (a string
    that is data, not a prompted statement), as IPython decides it."""
    mask: list[bool] = []
    inside: str | None = None
    keep = False
    seen_prompt = False
    for line in lines:
        mask.append(inside is not None and keep)
        for match in _TRIPLE_QUOTE.finditer(line):
            quote = match.group(1)
            if inside is None:
                inside = quote
                before = line[: match.start()]
                stripped = _DOCTEST_PS2.sub("", _DOCTEST_PS1.sub("", before, count=1), count=1)
                prompted = stripped != before and seen_prompt
                keep = bool(not prompted and _STRING_PREFIX.match(stripped.strip()))
                mask[-1] = keep
            elif inside == quote:
                inside = None
                keep = False
        seen_prompt = seen_prompt or bool(_DOCTEST_INITIAL.match(line))
    return mask


def _classic_prompts(lines: list[str]) -> list[str]:
    if not lines:
        return lines
    mask = _triple_quote_mask(lines)
    pairs = list(zip(lines, mask))  # equal lengths by construction
    if not any(not inside and _DOCTEST_INITIAL.match(line) for line, inside in pairs):
        return lines
    out: list[str] = []
    stripped: list[bool] = []
    for line, inside in pairs:
        new = line
        if not inside:
            if _DOCTEST_PS1.match(line):
                new = _DOCTEST_PS1.sub("", line, count=1)
            elif _DOCTEST_PS2.match(line):
                new = _DOCTEST_PS2.sub("", line, count=1)
        out.append(new)
        stripped.append(new != line)
    result: list[str] = []
    start = 0
    while start < len(out):  # dedent each run of lines outside strings that lost a prompt
        end = start
        while end < len(out) and mask[end] == mask[start]:
            end += 1
        segment = out[start:end]
        if not mask[start] and any(stripped[start:end]):
            segment = dedent("".join(segment)).splitlines(keepends=True)
        result.extend(segment)
        start = end
    return result


def _ipython_prompts(lines: list[str]) -> list[str]:
    if lines and (
        _IPYTHON_PROMPT.match(lines[0]) or (len(lines) > 1 and _IPYTHON_PROMPT.match(lines[1]))
    ):
        return [_IPYTHON_PROMPT.sub("", line, count=1) for line in lines]
    return lines


def unsupported(code: str) -> UnsupportedSyntax | None:
    """For a cell that did not parse: the IPython-only syntax it uses, if any."""
    for number, line in enumerate(code.splitlines(), 1):
        match = _SPECIAL.match(line)
        if match is None:
            continue
        sigil, word = match.groups()
        what = {
            "%": f"the IPython magic %{word}",
            "%%": f"the IPython cell magic %%{word}",
            "!": "an IPython shell escape (!)",
            "!!": "an IPython shell escape (!!)",
        }[sigil]
        instead = (
            "run commands with bash('...') or subprocess"
            if sigil.startswith("!")
            else "write it as plain Python (e.g. time.perf_counter() for %time)"
        )
        error = UnsupportedSyntax(
            f"line {number} uses {what}, which farm sessions do not support; {instead}"
        )
        error.lineno = number
        return error
    return None
