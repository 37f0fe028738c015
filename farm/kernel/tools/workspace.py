"""``Workspace``: the box's directory, to which the agent tools, the variant tools (``browser``,
``read_document``) and ``session.files`` (``fileops``) confine every path.

Every path goes through ``confine``: resolved with ``realpath`` (symlinks included) and then
required to be ``is_relative_to`` the workspace, so ``../``, absolute paths, symlinks that
point out and the ``/workspace2`` prefix trick are refused.
"""

from __future__ import annotations

import os
from pathlib import Path


class WorkspaceError(PermissionError):
    """A path outside the workspace, or a file operation over its bounds."""


class Workspace:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(root))

    def confine(self, path: str | os.PathLike[str]) -> Path:
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        resolved = Path(os.path.realpath(candidate))
        if not resolved.is_relative_to(self.root):
            raise WorkspaceError(f"{os.fspath(path)!r} is outside the workspace {self.root}")
        return resolved
