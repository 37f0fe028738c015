"""Agent tools, globals in every session unless opted out: ``ls``, ``read``, ``grep``,
``apply_patch``, ``bash``; plus the workspace file operations behind ``session.files``.

Every path goes through ``confine``: resolved with ``realpath`` (symlinks included) and then
required to be ``is_relative_to`` the workspace, so ``../``, absolute paths, symlinks that
point out and the ``/workspace2`` prefix trick are refused. No user string is ever spliced
into a shell command (``grep`` gets an argv list); ``bash`` runs in its own process group and
the whole group is killed on timeout. Outputs are clipped head+tail with a marker.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from .patching import PatchError, apply_unified_diff
from .variants import variant_globals

DEFAULT_LIMIT = 3000
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_UPLOAD_BYTES = 64 * 1024 * 1024


class WorkspaceError(PermissionError):
    """A path outside the workspace, or a file operation over its bounds."""


def clip(text: str, limit: int = DEFAULT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} chars cut ...]\n{text[-tail:]}"


class Workspace:
    def __init__(self, root: str | os.PathLike[str], limit: int = DEFAULT_LIMIT) -> None:
        self.root = Path(os.path.realpath(root))
        self.limit = limit

    def confine(self, path: str | os.PathLike[str]) -> Path:
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        resolved = Path(os.path.realpath(candidate))
        if not resolved.is_relative_to(self.root):
            raise WorkspaceError(f"{os.fspath(path)!r} is outside the workspace {self.root}")
        return resolved

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

    # --- files (session.files) ---------------------------------------------------------

    def write_file(self, path: str, data_b64: str) -> dict[str, Any]:
        data = base64.b64decode(data_b64)
        if len(data) > MAX_FILE_BYTES:
            raise WorkspaceError(f"file of {len(data)} bytes exceeds {MAX_FILE_BYTES} bytes")
        target = self.confine(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return {"path": str(target.relative_to(self.root)), "size": len(data)}

    def read_file(self, path: str) -> dict[str, Any]:
        target = self.confine(path)
        size = target.stat().st_size
        if size > MAX_FILE_BYTES:
            raise WorkspaceError(f"{path!r} has {size} bytes, more than {MAX_FILE_BYTES}")
        return {"data": base64.b64encode(target.read_bytes()).decode("ascii")}

    def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        target = self.confine(path)
        out = []
        for entry in sorted(target.rglob("*")):
            rel = str(entry.relative_to(self.root))
            kind = "link" if entry.is_symlink() else "dir" if entry.is_dir() else "file"
            size = entry.lstat().st_size if kind == "file" else 0
            out.append({"path": rel, "type": kind, "size": size})
        return out

    def remove(self, path: str) -> dict[str, Any]:
        target = self.confine(path)
        if target == self.root:
            raise WorkspaceError("refusing to remove the workspace itself")
        if target.is_dir() and not target.is_symlink():
            import shutil

            shutil.rmtree(target)
        else:
            target.unlink()
        return {"removed": str(target.relative_to(self.root))}

    def extract(self, tar_b64: str, dest: str = ".") -> dict[str, Any]:
        """Unpack a tarball into the workspace; members that would land outside are refused."""
        data = base64.b64decode(tar_b64)
        if len(data) > MAX_UPLOAD_BYTES:
            raise WorkspaceError(f"upload of {len(data)} bytes exceeds {MAX_UPLOAD_BYTES}")
        base = self.confine(dest)
        count = 0
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
            for member in members:
                self._check_member(base, member)
            for member in members:
                target = base / member.name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    assert source is not None
                    target.write_bytes(source.read())
                    count += 1
        return {"files": count}

    def _check_member(self, base: Path, member: tarfile.TarInfo) -> None:
        if not (member.isfile() or member.isdir()):
            raise WorkspaceError(f"tar member {member.name!r}: only files and dirs are allowed")
        if not Path(os.path.realpath(base / member.name)).is_relative_to(self.root):
            raise WorkspaceError(f"tar member {member.name!r} would land outside the workspace")

    def globals(self) -> dict[str, Any]:
        """What a session sees: the tools, and the hidden object ``session.files`` calls."""
        return {
            "ls": self.ls,
            "read": self.read,
            "grep": self.grep,
            "apply_patch": self.apply_patch,
            "bash": self.bash,
            "__farm_files__": self,
            **variant_globals(self),  # read_document, browser: only in images that have them
        }


def files_call(method: str, *args: str | bytes) -> str:
    """The cell that calls ``Workspace.<method>`` in a session (``session.files``, sweep items'
    files): bytes travel as base64, and the reply is JSON in the cell's value."""
    values = [base64.b64encode(a).decode("ascii") if isinstance(a, bytes) else a for a in args]
    call = ", ".join(repr(v) for v in values)
    return f"__import__('json').dumps(__farm_files__.{method}({call}))"
