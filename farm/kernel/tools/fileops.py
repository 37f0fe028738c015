"""File operations of a session (``session.files``, sweep items' files, the Inspect provider),
done by the session process itself, as its box's uid, between cells.

Invariants: ``file`` frames of bounded size (chunks of ``MAX_CHUNK``, raw in the frame's
``blob``; a read says ``size`` first); errors are results, never a broken session;
``scope="workspace"`` confines every path to the workspace, symlinks included. Design:
docs/design/kernel.md.
"""

from __future__ import annotations

import errno
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

from ..wire.protocol import FILE_CHUNK, FileError, FileRequest
from ..wire.session_frames import FileDone
from .workspace import Workspace, WorkspaceError

MAX_CHUNK = FILE_CHUNK


def handle(workspace: Workspace, request: FileRequest) -> FileDone:
    """One ``file`` request -> its ``file_done`` frame."""
    op = request.get("op")
    try:
        path = _resolve(workspace, str(request.get("path", ".")), request.get("scope"))
        result = _OPS[str(op)](workspace, path, request)
        if isinstance(result, bytes):  # a read: its bytes ride raw, its sizes in the JSON
            return _read_done(path, request, result)
    except KeyError:
        return _error("ValueError", f"unknown file operation {op!r}", errno.EINVAL, request)
    except (OSError, WorkspaceError, tarfile.TarError, ValueError) as exc:
        code = getattr(exc, "errno", None)
        if not code:
            code = errno.EACCES if isinstance(exc, WorkspaceError) else errno.EINVAL
        return _error(type(exc).__name__, str(exc), code, request)
    return {"type": "file_done", "result": result}


def _read_done(path: Path, request: FileRequest, data: bytes) -> FileDone:
    size = os.stat(path).st_size
    eof = int(request.get("offset", 0)) + len(data) >= size
    return {"type": "file_done", "result": {"size": size, "eof": eof}, "blob": data}


def _error(ename: str, evalue: str, code: int, request: FileRequest) -> FileDone:
    error: FileError = {
        "ename": ename,
        "evalue": evalue,
        "errno": code,
        "path": str(request.get("path")),
    }
    return {"type": "file_done", "error": error}


def _resolve(workspace: Workspace, path: str, scope: object) -> Path:
    if scope == "box":
        return Path(os.path.join(workspace.root, path))  # absolute paths stay absolute
    return workspace.confine(path)


def _write(workspace: Workspace, path: Path, request: FileRequest) -> dict[str, Any]:
    """Write a chunk at ``offset``; offset 0 creates (parents too) or truncates the file."""
    data = request.get("blob", b"")
    if len(data) > MAX_CHUNK:
        raise ValueError(f"a chunk of {len(data)} bytes is over {MAX_CHUNK}: send smaller ones")
    offset = int(request.get("offset", 0))
    if offset == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
    fd = os.open(path, flags, 0o666)  # the box's umask (077) applies
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return {"path": _shown(workspace, path), "size": size}


def _read(workspace: Workspace, path: Path, request: FileRequest) -> bytes:
    """``length`` bytes (at most ``MAX_CHUNK``) from ``offset`` (``_read_done`` adds the
    file's size)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    offset = int(request.get("offset", 0))
    length = min(int(request.get("length", MAX_CHUNK)), MAX_CHUNK)
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def _stat(workspace: Workspace, path: Path, request: FileRequest) -> dict[str, Any]:
    st = path.lstat()
    kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
    return {"path": _shown(workspace, path), "type": kind, "size": st.st_size, "mode": st.st_mode}


def _list(workspace: Workspace, path: Path, request: FileRequest) -> list[dict[str, Any]]:
    out = []
    for entry in sorted(path.rglob("*")):
        kind = "link" if entry.is_symlink() else "dir" if entry.is_dir() else "file"
        size = entry.lstat().st_size if kind == "file" else 0
        out.append({"path": _shown(workspace, entry), "type": kind, "size": size})
    return out


def _remove(workspace: Workspace, path: Path, request: FileRequest) -> dict[str, Any]:
    if path == workspace.root:
        raise WorkspaceError("refusing to remove the workspace itself")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    return {"removed": _shown(workspace, path)}


def _extract(workspace: Workspace, path: Path, request: FileRequest) -> dict[str, Any]:
    """Unpack the tarball staged at ``source`` (a workspace file, removed after) into ``path``;
    members that would land outside the workspace are refused, nothing is extracted then."""
    source = workspace.confine(str(request["source"]))
    try:
        with tarfile.open(source) as tar:
            members = tar.getmembers()
            for member in members:
                if not (member.isfile() or member.isdir()):
                    raise WorkspaceError(f"tar member {member.name!r}: only files and dirs")
                workspace.confine(os.path.join(path, member.name))
            count = 0
            for member in members:
                target = path / member.name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                extracted = tar.extractfile(member)
                assert extracted is not None
                with extracted, open(target, "wb") as out:
                    shutil.copyfileobj(extracted, out)
                count += 1
    finally:
        source.unlink(missing_ok=True)
    return {"files": count}


def _shown(workspace: Workspace, path: Path) -> str:
    """A path as the caller sees it: relative to the workspace when inside it."""
    try:
        return str(path.relative_to(workspace.root))
    except ValueError:
        return str(path)


_OPS: dict[str, Any] = {
    "write": _write,
    "read": _read,
    "stat": _stat,
    "list": _list,
    "remove": _remove,
    "extract": _extract,
}
