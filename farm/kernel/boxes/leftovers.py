"""What a box left behind (files, System V IPC objects): finding it, and removing it.

Invariants: finding runs as root, without following links, into every directory others may
enter (a box may write into another's open directory); removing runs as the box's uid (a link
it planted cannot make the cleanup delete more); a file of the uid still there afterwards keeps
the box's number out of use for good. Why, and what it leaves out: docs/design/boxes.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from .box_protocol import BoxInfo
from .uids import acting_as, libc

IPC_RMID = 0
EMPTY_TMPFS_DIR = 40  # tmpfs reports 20 bytes a directory entry, "." and ".." included
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")
FAST_SEARCH_MAX = 1024  # entries the supervisor looks at before it leaves a box to a helper
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SYSVIPC = {"shm": ("shmctl", 7), "msg": ("msgctl", 7), "sem": ("semctl", 4)}  # table: uid column


def box_roots(box: BoxInfo) -> tuple[str, ...]:
    """Where a box may have left files: the shared directories and the roots of the boxes'
    workspaces and temporary directories (another box may have opened its own to others)."""
    roots = [*SHARED_DIRS, os.path.dirname(box["workspace"]), os.path.dirname(box["tmp"])]
    return tuple(dict.fromkeys(roots))


def nothing_left(box: BoxInfo, isolation: str, roots: Iterable[str] | None = None) -> bool:
    """Whether a box whose processes are all gone left nothing to remove but its two empty
    directories (which root may remove itself): the common case, which needs no helper. Its
    cost is bounded (``FAST_SEARCH_MAX``): "don't know" is ``False``, and a helper looks."""
    return nothing_left_all([box], isolation, roots)[0]


def nothing_left_all(
    boxes: list[BoxInfo], isolation: str, roots: Iterable[str] | None = None
) -> list[bool]:
    """``nothing_left`` for each of ``boxes``, with one search of the shared directories and
    one read of the IPC tables for all of them: boxes end in bursts (a chunk's items end
    together), and each search lists every live box's directory."""
    clean = [_own_dirs_empty(box) for box in boxes]
    if isolation == "dirs" or not any(clean):
        return clean
    looked = [box for box, empty in zip(boxes, clean) if empty]
    where = dict.fromkeys(r for box in looked for r in (box_roots(box) if roots is None else roots))
    found = find_owned_by({box["uid"] for box in looked}, list(where), FAST_SEARCH_MAX)
    ipc = {uid for _, _, uid in _ipc_table()}
    for index, box in enumerate(boxes):
        if clean[index]:
            own = {box["workspace"], box["tmp"]}  # /tmp/box-N is the box's uid's, always there
            mine = found[box["uid"]]
            clean[index] = (
                mine.complete
                and not mine.unread
                and all(path in own for path in mine.paths)
                and box["uid"] not in ipc
            )
    return clean


def _own_dirs_empty(box: BoxInfo) -> bool:
    for path in (box["workspace"], box["tmp"]):
        try:
            if os.listdir(path):  # the box's own uid, or dirs isolation
                return False
        except PermissionError:  # root without DAC override: a tmpfs dir's size says it
            if os.stat(path).st_size > EMPTY_TMPFS_DIR:
                return False
        except FileNotFoundError:
            continue
    return True


class Found(NamedTuple):
    """What ``find_owned`` saw: the uid's entries (each to be removed whole), the directories
    others may enter that it could not read (path, owner), and whether it looked everywhere
    (``False``: it stopped at its limit, or a directory was replaced while it looked)."""

    paths: list[str]
    unread: list[tuple[str, int]]
    complete: bool


def find_owned(uid: int, roots: Iterable[str], limit: int | None = None) -> Found:
    """The entries of ``uid`` under ``roots`` (``find_owned_by`` for one uid)."""
    return find_owned_by({uid}, roots, limit)[uid]


def find_owned_by(
    uids: set[int], roots: Iterable[str], limit: int | None = None
) -> dict[int, Found]:
    """The entries of each of ``uids`` under ``roots`` (boxes cannot list the shared
    directories: run as root, or as a directory's owner), in one search, without following
    links: a directory is entered through a descriptor opened with ``O_NOFOLLOW`` and checked
    to be the one its listing showed. It descends into every directory that others may enter
    (``o+x``) and that is not the own of the only uid looked for: a box can have written only
    there, outside its own entries, which go whole. What it could not read, and whether it
    looked everywhere, is the same for all of ``uids``."""
    paths: dict[int, list[str]] = {uid: [] for uid in uids}
    unread: list[tuple[str, int]] = []
    pending: list[tuple[str, tuple[int, int] | None, int]] = [(r, None, 0) for r in roots]
    seen = 0

    def found(complete: bool) -> dict[int, Found]:
        return {uid: Found(paths[uid], unread, complete) for uid in uids}

    while pending:
        directory, identity, owner = pending.pop()
        try:
            listing = _listing(directory, identity)
        except PermissionError:
            unread.append((directory, owner))
            continue
        except OSError:  # gone, or not a directory (a root that this sandbox has not)
            continue
        if listing is None:
            return found(False)
        for name, st in listing:
            seen += 1
            if limit is not None and seen > limit:
                return found(False)
            path = os.path.join(directory, name)
            if st.st_uid in uids:
                paths[st.st_uid].append(path)
            others = uids - {st.st_uid}  # for whom this is someone else's directory
            if others and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IXOTH:
                pending.append((path, (st.st_dev, st.st_ino), st.st_uid))
    return found(True)


def _listing(directory: str, identity: tuple[int, int] | None) -> list[tuple[str, Any]] | None:
    """(name, lstat) of each entry of ``directory``; ``None`` when it is no longer the
    directory ``identity`` names (replaced, by a link or anything else, since it was seen)."""
    fd = os.open(directory, _DIR_FLAGS)
    try:
        if identity is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != identity:
                return None
        entries = []
        with os.scandir(fd) as it:
            for entry in it:
                with contextlib.suppress(OSError):  # gone meanwhile
                    entries.append((entry.name, entry.stat(follow_symlinks=False)))
        return entries
    finally:
        os.close(fd)


def owned_entries(uid: int, roots: Iterable[str] = SHARED_DIRS) -> list[str]:
    """Every entry of ``uid`` under ``roots`` that can be found (a helper's search, as root,
    unbounded): each directory root may not read is read as its owner, in turn."""
    found = find_owned(uid, roots)
    paths = list(found.paths)
    unread, tried = list(found.unread), set()
    while unread:
        directory, owner = unread.pop()
        if directory in tried or owner in (0, uid):  # root's own, or going whole
            continue
        tried.add(directory)
        with acting_as(owner, owner):  # a box's gid is its uid
            more = find_owned(uid, [directory])
        paths += more.paths
        unread += more.unread
    return paths


def _writable(function: Any, path: str, exc: Any) -> None:
    """``rmtree``'s error hook: a directory the box made unwritable is opened up and retried."""
    parent = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def remove(paths: Iterable[str], keep_roots: Iterable[str] = ()) -> None:
    """As the box's uid: remove ``paths`` whole, and the contents of ``keep_roots`` (the box's
    own directories, which root removes once empty)."""
    targets = list(paths)
    for root in keep_roots:
        with contextlib.suppress(OSError):
            os.chmod(root, stat.S_IRWXU)
            targets += [os.path.join(root, name) for name in os.listdir(root)]
    for path in targets:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=_writable)  # onexc: 3.12+ only
            else:
                os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError:
            _writable(os.unlink, path, OSError())


def _ipc_table() -> Iterator[tuple[str, int, int]]:
    """(table, id, uid) of every System V object, once for its owner and once for its creator."""
    for table, (_, uid_column) in _SYSVIPC.items():
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            yield table, int(row[1]), int(row[uid_column])  # owner
            yield table, int(row[1]), int(row[uid_column + 2])  # creator


def _ipc_rows(uid: int) -> Iterator[tuple[str, int]]:
    """(table, id) of the System V objects ``uid`` owns or made."""
    seen = set()
    for table, ipc_id, owner in _ipc_table():
        if owner == uid and (table, ipc_id) not in seen:
            seen.add((table, ipc_id))
            yield table, ipc_id


def remove_ipc(uid: int) -> None:
    """As the box's uid: remove the System V shared memory, queues and semaphores it made
    (they outlive processes, like files)."""
    for table, ipc_id in list(_ipc_rows(uid)):
        function = getattr(libc, _SYSVIPC[table][0])
        if table == "sem":
            function(ipc_id, 0, IPC_RMID)
        else:
            function(ipc_id, IPC_RMID, None)
