"""Whether a box that ended left anything behind (``uids.nothing_left``), on the host's real
``/tmp``: the answer picks a box's reset (root removes two empty directories, or a zygote
helper forks to remove files as the box's uid), so a wrong "something left" costs every item
two forks and a wrong "nothing left" leaves a box's files to the next box of its number."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.kernel import uids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to a box's uid")

UID = 61_234  # no user of this machine or of the sandbox images


@pytest.fixture
def box(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A box as the kernel describes it: its workspace, and its TMPDIR under the shared /tmp."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    tmp = Path(tempfile.mkdtemp(prefix="box-test-", dir="/tmp"))
    for path in (workspace, tmp):
        os.chown(path, UID, UID)
    yield {"uid": UID, "gid": UID, "workspace": str(workspace), "tmp": str(tmp)}
    for path in uids.owned_entries(UID):
        if os.path.isdir(path):
            for name in os.listdir(path):
                os.unlink(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.unlink(path)


def test_a_box_that_kept_to_its_own_empty_directories_left_nothing(box: dict[str, Any]) -> None:
    assert uids.owned_entries(UID) == [box["tmp"]]  # its TMPDIR is in /tmp, and is its own
    assert uids.nothing_left(box, "uids")


def test_a_file_in_its_tmpdir_or_workspace_is_something_left(box: dict[str, Any]) -> None:
    for directory in (box["tmp"], box["workspace"]):
        left = Path(directory, "x")
        left.write_text("x")
        assert not uids.nothing_left(box, "uids")
        left.unlink()
    assert uids.nothing_left(box, "uids")


def test_a_file_of_its_uid_anywhere_in_tmp_is_something_left(box: dict[str, Any]) -> None:
    stray = Path(tempfile.mktemp(prefix="stray-", dir="/tmp"))
    stray.write_text("x")
    os.chown(stray, UID, UID)
    try:
        assert not uids.nothing_left(box, "uids")
    finally:
        stray.unlink()
    assert uids.nothing_left(box, "uids")
