"""A box's files as a value: read into memory (``snapshot``) and put back exactly (``restore``).

The workspace and the box's ``/tmp``, held by a checkpoint (``held_copies``) or carried to a
fork (``state_export``): directories, regular files and symbolic links with their modes and
times; sockets, fifos and devices are not kept. Restoring rewrites a file still there in place
(a file the session holds open stays the same file) and removes what the value lacks.
"""

from __future__ import annotations

import contextlib
import os
import stat

Entry = tuple[str, str, int, int, bytes]  # relative path, kind (d, f, l), mode, mtime_ns, data


def snapshot(root: str) -> list[Entry]:
    """Every directory, regular file and symbolic link under ``root`` (itself first), top
    down; sockets, fifos and devices are not kept."""
    entries: list[Entry] = []

    def walk(rel: str) -> None:
        path = os.path.join(root, rel) if rel else root
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            entries.append((rel, "d", stat.S_IMODE(info.st_mode), info.st_mtime_ns, b""))
            for name in sorted(os.listdir(path)):
                walk(os.path.join(rel, name))
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
            entries.append((rel, "f", stat.S_IMODE(info.st_mode), info.st_mtime_ns, data))
        elif stat.S_ISLNK(info.st_mode):
            target = os.readlink(path).encode("utf-8", "surrogateescape")
            entries.append((rel, "l", 0, info.st_mtime_ns, target))

    if os.path.isdir(root):
        walk("")
    return entries


def restore(root: str, entries: list[Entry]) -> None:
    """Make ``root`` hold exactly ``entries`` again. A file still there is rewritten in place
    (a file the session holds open stays the same file); what is not in ``entries`` goes."""
    wanted = {rel: kind for rel, kind, *_ in entries}
    _prune(root, "", wanted)
    for rel, kind, mode, _, data in entries:
        path = os.path.join(root, rel) if rel else root
        if kind == "d":
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            with contextlib.suppress(PermissionError):  # a root the box does not own (/tmp)
                os.chmod(path, mode | stat.S_IRWXU)  # its own mode once it is filled, below
        elif kind == "f":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(path, mode)
        elif kind == "l":
            target = data.decode("utf-8", "surrogateescape")
            if not os.path.islink(path) or os.readlink(path) != target:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                os.symlink(target, path)
    for rel, kind, mode, mtime_ns, _ in reversed(entries):  # directories after what they hold
        path = os.path.join(root, rel) if rel else root
        with contextlib.suppress(OSError):
            if kind == "d":
                os.chmod(path, mode)
            os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)


def _prune(root: str, rel: str, wanted: dict[str, str]) -> None:
    path = os.path.join(root, rel) if rel else root
    with contextlib.suppress(PermissionError):  # a directory made read-only is emptied too
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
    for name in os.listdir(path):
        child = os.path.join(rel, name)
        full = os.path.join(root, child)
        info = os.lstat(full)
        kind = "d" if stat.S_ISDIR(info.st_mode) else "f" if stat.S_ISREG(info.st_mode) else "l"
        if not stat.S_ISLNK(info.st_mode) and kind == "l":
            kind = "?"  # a socket, fifo or device: never kept
        if wanted.get(child) != kind:
            _remove(full, info)
        elif kind == "d":
            _prune(root, child, wanted)


def _remove(path: str, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        os.chmod(path, stat.S_IRWXU)
        for name in os.listdir(path):
            child = os.path.join(path, name)
            _remove(child, os.lstat(child))
        os.rmdir(path)
    else:
        os.unlink(path)
