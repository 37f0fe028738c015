"""What a box that ended left behind, and that nothing of it meets the next box of its number.

On the host (as root, in private stand-ins of the shared directories): ``leftovers.nothing_left``
picks a box's reset (root removes two empty directories, or a zygote helper forks to remove
files as the box's uid), so a wrong "something left" costs every item two forks and a wrong
"nothing left" leaves a box's files to the next box of its number; ``leftovers.owned_entries`` is
the helper's search, which must find the box's files wherever another box let it write them.

In a docker sandbox whose boxes fell back to uids (``uid_sandbox``): a box's files in a
neighbour's world-writable directory or opened workspace, and in ``/var/tmp``, are gone before
a session gets its uid again.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from farm.kernel.boxes import leftovers
from tests.conftest import Cells
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to a box's uid")

UID = 61_234  # no user of this machine or of the sandbox images
NEIGHBOUR = 61_235  # another box's uid
T = TypeVar("T")


@pytest.fixture
def base() -> Iterator[Path]:
    """Where the stand-ins go: a directory others may enter, as / is (pytest's tmp_path is
    0700, which a box's uid could not traverse)."""
    path = Path(tempfile.mkdtemp(prefix="box-cleanup-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def shared(base: Path) -> Path:
    """A stand-in of /tmp: root's, sticky, closed to listing (as the kernel makes /tmp)."""
    path = base / "shared"
    path.mkdir()
    path.chmod(0o1733)
    return path


@pytest.fixture
def box(base: Path, shared: Path) -> Iterator[dict[str, Any]]:
    """A box as the kernel describes it: its workspace beside a neighbour's, its TMPDIR in
    the shared directory; searched there only (the host's /tmp is not a sandbox's)."""
    workspaces = base / "workspace"
    workspaces.mkdir()
    workspaces.chmod(0o711)
    box = {
        "uid": UID,
        "gid": UID,
        "workspace": str(workspaces / "box-1"),
        "tmp": str(shared / "box-1"),
    }
    for path in (box["workspace"], box["tmp"]):
        os.mkdir(path, 0o700)
        os.chown(path, UID, UID)
    neighbour = workspaces / "box-2"
    neighbour.mkdir(0o700)
    os.chown(neighbour, NEIGHBOUR, NEIGHBOUR)
    box["roots"] = (str(shared), str(workspaces))
    yield box


def left(box: dict[str, Any]) -> bool:
    return not leftovers.nothing_left(box, "uids", roots=box["roots"])


def owned(path: Path, uid: int = UID, mode: int = 0o600, directory: bool = False) -> Path:
    if directory:
        path.mkdir()
    else:
        path.write_text("x")
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


def as_helper(work: Callable[[], T]) -> T:
    """``work()`` in a forked child, as the zygote's helper runs it (it changes its ids)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(write, json.dumps(work()).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(out)  # type: ignore[no-any-return]


def test_a_box_that_kept_to_its_own_empty_directories_left_nothing(box: dict[str, Any]) -> None:
    assert sorted(leftovers.owned_entries(UID, box["roots"])) == sorted(
        [box["tmp"], box["workspace"]]
    )
    assert not left(box)


def test_a_file_in_its_tmpdir_or_workspace_is_something_left(box: dict[str, Any]) -> None:
    for directory in (box["tmp"], box["workspace"]):
        path = Path(directory, "x")
        path.write_text("x")
        assert left(box)
        path.unlink()
    assert not left(box)


def test_a_file_of_its_uid_anywhere_in_the_shared_directory_is_something_left(
    box: dict[str, Any], shared: Path
) -> None:
    stray = owned(shared / "stray")
    assert left(box) and str(stray) in leftovers.owned_entries(UID, box["roots"])
    stray.unlink()
    assert not left(box)


def test_its_files_inside_a_neighbours_open_directories_are_found(
    box: dict[str, Any], shared: Path, base: Path
) -> None:
    """A neighbour's 0777 directory in /tmp, or its workspace opened to everyone: the box's
    files there (nested too) are something left, and the helper's search finds each."""
    drop = owned(shared / "x", NEIGHBOUR, 0o777, directory=True)
    deep = owned(owned(drop / "sub", NEIGHBOUR, 0o1777, directory=True) / "secret")
    workspace = base / "workspace" / "box-2"
    workspace.chmod(0o777)
    beside = owned(workspace / "secret-too")
    assert left(box)
    found = set(leftovers.owned_entries(UID, box["roots"]))
    assert {str(deep), str(beside)} <= found
    deep.unlink()
    beside.unlink()
    assert not left(box)


def test_boxes_that_end_together_are_judged_by_one_search_each_as_if_alone(
    box: dict[str, Any], shared: Path, base: Path
) -> None:
    """One search serves many boxes (``nothing_left_all``), and each gets its own answer: the
    neighbour's open directory is the neighbour's own (it goes whole with the neighbour) but
    someone else's for the box, whose file in it is found."""
    neighbour = {
        "uid": NEIGHBOUR,
        "gid": NEIGHBOUR,
        "workspace": str(base / "workspace" / "box-2"),
        "tmp": str(owned(shared / "box-2", NEIGHBOUR, 0o700, directory=True)),
    }
    drop = owned(shared / "open", NEIGHBOUR, 0o777, directory=True)
    assert leftovers.nothing_left_all([box, neighbour], "uids", box["roots"]) == [True, False]
    mine = owned(drop / "mine")
    assert leftovers.nothing_left_all([box, neighbour], "uids", box["roots"]) == [False, False]
    mine.unlink()
    drop.rmdir()
    assert leftovers.nothing_left_all([box, neighbour], "uids", box["roots"]) == [True, True]


def test_a_directory_root_may_not_read_is_read_as_its_owner(
    box: dict[str, Any], base: Path
) -> None:
    """A neighbour's workspace 0711 with a 0733 drop box in it: root (no DAC override in a
    sandbox; here, dropped for the check) cannot list either, so the supervisor's check says
    "don't know" (while such a directory exists) and the helper reads them as their owner."""
    workspace = base / "workspace" / "box-2"
    workspace.chmod(0o711)
    drop = owned(workspace / "drop", NEIGHBOUR, 0o733, directory=True)
    secret = owned(drop / "secret")

    def without_dac_override() -> tuple[bool, list[str]]:
        _drop_dac_override()
        return left(box), leftovers.owned_entries(UID, box["roots"])

    something_left, found = as_helper(without_dac_override)
    assert something_left and str(secret) in found
    secret.unlink()  # the supervisor still cannot tell; the helper sees it is gone
    something_left, found = as_helper(without_dac_override)
    assert something_left and sorted(found) == sorted([box["tmp"], box["workspace"]])


def test_links_are_entries_never_followed(box: dict[str, Any], shared: Path) -> None:
    """A neighbour's link to the box's workspace is the neighbour's, and not a way in; the
    box's own link is an entry of its uid (removed as one, never its target)."""
    drop = owned(shared / "x", NEIGHBOUR, 0o777, directory=True)
    os.symlink(box["workspace"], drop / "into-box")
    os.lchown(drop / "into-box", NEIGHBOUR, NEIGHBOUR)
    Path(box["workspace"], "kept").write_text("x")
    os.chown(Path(box["workspace"], "kept"), UID, UID)
    mine = drop / "mine"
    os.symlink("/etc", mine)
    os.lchown(mine, UID, UID)
    found = leftovers.owned_entries(UID, box["roots"])
    assert str(mine) in found and str(drop / "into-box" / "kept") not in found
    assert not any(path.startswith("/etc") for path in found)


def test_the_supervisors_check_is_bounded_and_hands_a_big_tree_to_a_helper(
    box: dict[str, Any], shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop = owned(shared / "x", NEIGHBOUR, 0o777, directory=True)
    for n in range(50):
        owned(drop / f"n{n}", NEIGHBOUR)
    monkeypatch.setattr(leftovers, "FAST_SEARCH_MAX", 20)
    assert left(box)  # past its limit it cannot tell: a helper looks
    assert sorted(leftovers.owned_entries(UID, box["roots"])) == sorted(
        [box["tmp"], box["workspace"]]
    )


def _drop_dac_override() -> None:
    """Make this (forked) root process like the sandbox's kernel: no CAP_DAC_OVERRIDE or
    CAP_DAC_READ_SEARCH in its effective set (the others it needs stay)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    assert libc.capget(header, data) == 0
    dac = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    data[0] &= ~dac  # effective, first 32 capabilities
    data[1] &= ~dac  # permitted: not back in the effective set when the euid returns to 0
    assert libc.capset(header, data) == 0, os.strerror(ctypes.get_errno())


# --- in a docker sandbox ----------------------------------------------------------------------

OPEN_UP = (
    "import os\nos.makedirs('/tmp/open-x')\nos.chmod('/tmp/open-x', 0o777)\n"
    "os.chmod('.', 0o777)\nos.getcwd()"
)
WRITE = (
    "import os\nfor path in ('/tmp/open-x/secret', '{ws}/secret', '/var/tmp/secret'):\n"
    "    with open(path, 'w') as f:\n        f.write('of box B')\nos.getuid()"
)
FIND = (
    "import os\n[p for p in ('/tmp/open-x/secret', '{ws}/secret', '/var/tmp/secret') "
    "if os.path.lexists(p)]"
)


@pytest.mark.docker
def test_a_box_files_in_a_neighbours_open_directories_do_not_meet_its_next_session(
    uid_sandbox: Any,
) -> None:
    """B writes into A's world-writable /tmp directory, A's workspace opened to everyone and
    /var/tmp, then closes: a new session with B's uid finds none of it, A's directories hold
    nothing of B's, and root's listing of /var/tmp is empty again."""
    with uid_sandbox.kernel() as client:
        a = Cells(client)
        workspace = ast.literal_eval(str(a.value(OPEN_UP)))
        b = Cells(client)
        uid = int(str(b.value(WRITE.format(ws=workspace))))
        assert a.value("sorted(os.listdir('/tmp/open-x'))") == "['secret']"
        client.close_session(b.id)
        opened = _sessions_until_uid(client, uid)
        assert opened[-1].value(FIND.format(ws=workspace)) == "[]"
        assert a.value("os.listdir('/tmp/open-x'), os.listdir('.')") == "([], [])"
        assert _root_listing(uid_sandbox, "/var/tmp") == []
        for session in (a, *opened):
            client.close_session(session.id)


@pytest.mark.docker
def test_var_tmp_is_private_per_box_and_emptied_at_its_end(uid_sandbox: Any) -> None:
    """``/var/tmp`` (Inspect's tools install there) is writable, sticky and closed to listing:
    a box's file there is its own (0600), and it is removed when the box ends."""
    with uid_sandbox.kernel() as client:
        a, b = Cells(client), Cells(client)
        mode = a.value(
            "import os, stat\nopen('/var/tmp/mine', 'w').write('a')\n"
            "oct(stat.S_IMODE(os.stat('/var/tmp').st_mode)), "
            "oct(os.stat('/var/tmp/mine').st_mode & 0o777)"
        )
        assert mode == "('0o1733', '0o600')"
        for code in (
            "open('/var/tmp/mine').read()",
            "os.listdir('/var/tmp')",
            "os.remove('/var/tmp/mine')",
        ):
            refused = b.run(f"import os\n{code}")
            assert refused.error is not None and refused.error.ename == "PermissionError", code
        assert _root_listing(uid_sandbox, "/var/tmp") == ["mine"]
        client.close_session(a.id)
        assert wait_for(lambda: _root_listing(uid_sandbox, "/var/tmp") == [], 30)
        client.close_session(b.id)


def _sessions_until_uid(client: Any, uid: int) -> list[Cells]:
    """Sessions until one runs as ``uid`` (boxes are taken lowest number first, and a box is
    used again only after its reset), the last one that one."""
    opened = []
    for _ in range(12):
        opened.append(Cells(client))
        if int(str(opened[-1].value("import os; os.getuid()"))) == uid:
            return opened
    pytest.fail(f"no session got uid {uid} back (its box was not reset, or is quarantined)")


def _root_listing(sandbox: Any, directory: str) -> list[str]:
    """``directory``'s entries as the container's root sees them (the kernel's identity)."""
    done = sandbox.container.exec_run(["ls", "-A", directory], user="0:0")
    assert done.exit_code == 0, done.output.decode()
    return sorted(done.output.decode().split())


@pytest.mark.docker
def test_a_box_that_could_not_be_emptied_is_out_of_use_until_it_can_be(
    uid_sandbox: Any,
) -> None:
    """A writes into B's open directory, then B closes it to A (0755): A's end cannot remove
    A's file, so A's number is quarantined (never given to a session that would find the
    file); once B ends, its directory goes whole with A's file in it, and A's number comes back
    at the next try instead of staying out of use for good (two boxes could otherwise use up a
    sandbox's boxes)."""
    with uid_sandbox.kernel() as client:
        b, a = Cells(client), Cells(client)
        b.value("import os\nos.makedirs('/tmp/lend')\nos.chmod('/tmp/lend', 0o777)\n1")
        a.value("open('/tmp/lend/mine', 'w').write('of box A')")
        b.value("os.chmod('/tmp/lend', 0o755)\n1")
        assert client.ping()["quarantined"] == 0
        client.close_session(a.id)
        assert wait_for(lambda: client.ping()["quarantined"] == 1, 30), client.ping()
        assert _root_listing(uid_sandbox, "/tmp/lend") == ["mine"]
        client.close_session(b.id)
        assert wait_for(lambda: client.ping()["quarantined"] == 0, 60), client.ping()
        assert "lend" not in _root_listing(uid_sandbox, "/tmp")
