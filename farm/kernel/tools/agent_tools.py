"""Agent tools, globals in every session unless opted out: ``ls``, ``read``, ``grep``,
``apply_patch``, ``bash``, on a ``Workspace`` (``workspace``), which confines every path they
take. No user string is ever spliced into a shell command (``grep`` gets an argv list);
``bash`` runs in its own process group and the whole group is killed on timeout. Outputs are
clipped head+tail with a marker.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from .patching import PatchError, apply_unified_diff
from .variant_globals import variant_globals
from .workspace import Workspace

DEFAULT_LIMIT = 3000


def clip(text: str, limit: int = DEFAULT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} chars cut ...]\n{text[-tail:]}"


class AgentTools(Workspace):
    """The tools of a session, on its workspace; outputs clipped to ``limit`` characters."""

    def __init__(self, root: str | os.PathLike[str], limit: int = DEFAULT_LIMIT) -> None:
        super().__init__(root)
        self.limit = limit

    # --- tools (text in, clipped text out) ---------------------------------------------

    def ls(self, path: str = ".") -> str:
        target = self.confine(path)
        if not target.is_dir():
            raise NotADirectoryError(f"{path!r} is not a directory")
        lines = []
        for entry in sorted(target.iterdir(), key=lambda p: p.name):
            if entry.is_symlink():
                lines.append(f"{entry.name} -> {os.readlink(entry)}")
            elif entry.is_dir():
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name}  {entry.stat().st_size}")
        return clip("\n".join(lines), self.limit)

    def read(self, path: str, start: int | None = None, end: int | None = None) -> str:
        """Lines ``start``..``end`` (1-based, inclusive) of a text file, numbered."""
        target = self.confine(path)
        with target.open(encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        first = max(start or 1, 1)
        last = min(end or len(lines), len(lines))
        width = len(str(last))
        body = "\n".join(f"{n:>{width}}| {lines[n - 1]}" for n in range(first, last + 1))
        return clip(body, self.limit)

    def grep(self, pattern: str, path: str = ".", glob: str | None = None) -> str:
        target = self.confine(path)
        argv = ["grep", "-rnIE", "--", pattern, str(target)]
        if glob:
            argv[1:1] = [f"--include={glob}"]
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=60, cwd=self.root
        )
        if done.returncode > 1:
            raise ValueError(f"grep failed: {done.stderr.strip()}")
        prefix = f"{self.root}/"
        return clip(done.stdout.replace(prefix, "").rstrip("\n"), self.limit)

    def apply_patch(self, diff: str) -> str:
        try:
            changed = apply_unified_diff(diff, self.confine)
        except PatchError as exc:
            raise PatchError(f"{exc}; no file was changed") from None
        return "\n".join(changed)

    def bash(self, cmd: str, timeout_s: float = 30.0) -> str:
        proc = subprocess.Popen(
            ["bash", "-c", cmd],
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            status = f"[exit {proc.returncode}]"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: no orphan left behind
            out, _ = proc.communicate()
            status = f"[killed after {timeout_s:g}s timeout]"
        text = out.decode("utf-8", errors="replace")
        return clip(f"{text}{status}", self.limit)

    def globals(self) -> dict[str, Any]:
        """What a session sees: the tools (``session.files`` is ``fileops``, not a global)."""
        return {
            "ls": self.ls,
            "read": self.read,
            "grep": self.grep,
            "apply_patch": self.apply_patch,
            "bash": self.bash,
            **variant_globals(self),  # read_document, browser: only in images that have them
        }
