"""A process tree as a judge's runner samples and kills it (``farm.kernel.boxes.trees``), on
this machine's own ``/proc``: a shell and the ``sleep`` it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from farm.kernel.boxes import trees


@pytest.fixture
def shell_with_child() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A shell that started a ``sleep`` and waits for it, with the sleep's pid."""
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        yield proc, child
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_tree_holds_the_root_and_what_it_started(
    shell_with_child: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, child = shell_with_child
    assert trees.tree(proc.pid) == {proc.pid, child}


def test_tree_stats_give_each_member_its_stat_fields(
    shell_with_child: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, child = shell_with_child
    stats = trees.tree_stats(proc.pid)
    parents = sorted(int(fields[1]) for fields in stats)  # ppid, after the command name
    assert len(stats) == 2
    assert proc.pid in parents  # the sleep's parent is the shell
    assert all(len(fields) >= 44 and int(fields[19]) > 0 for fields in stats)  # starttime


def _dead(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (its reaper may be another process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_kill_tree_ends_the_child_too(
    shell_with_child: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, child = shell_with_child
    trees.kill_tree(proc.pid)
    proc.wait(timeout=5)
    deadline = time.monotonic() + 5
    while not _dead(child):
        assert time.monotonic() < deadline, "the child outlived kill_tree"
        time.sleep(0.01)  # poll of a deadline
