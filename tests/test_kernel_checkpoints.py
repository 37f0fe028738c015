"""Checkpoints at the kernel, over the process backend (``dirs`` isolation: every box one uid,
so a held copy is woken only by the supervisor's pid): fast, no Docker. The full farm's cases
are in tests/test_checkpoints.py."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from farm.kernel.wire.client import KernelClient, KernelRequestError
from tests.conftest import Cells
from tests.waiting import wait_for


def branch(cells: Cells, op: str, **fields: object) -> dict[str, Any]:
    reply = cells.client.branch(
        {"type": "branch", "op": op, "session_id": cells.id, **fields}  # type: ignore[typeddict-item]
    )
    cells.epoch = int(reply["epoch"])
    return dict(reply)


def test_a_rollback_returns_to_the_checkpoint(cells: Cells) -> None:
    cells.run("x = 1\nopen('f.txt', 'w').write('one')")
    cp = branch(cells, "checkpoint")["checkpoint_id"]
    cells.run("x = 2\nopen('f.txt', 'w').write('two')\nopen('g.txt', 'w').write('g')")
    before = cells.epoch
    branch(cells, "rollback", checkpoint_id=cp)
    assert cells.epoch == before + 1
    assert cells.value("import os; (x, open('f.txt').read(), sorted(os.listdir('.')))") == (
        "(1, 'one', ['f.txt'])"
    )


def test_a_signal_from_the_box_does_not_wake_a_checkpoint(cells: Cells) -> None:
    """Every box shares one uid here: only the supervisor's pid may wake a held copy."""
    cells.run("x = 'kept'")
    cp = branch(cells, "checkpoint")["checkpoint_id"]
    poke = (
        "import os, signal\nkids = [int(p) for p in open(f'/proc/{os.getpid()}/task/"
        "{os.getpid()}/children').read().split()]\n"
        "for k in kids: os.kill(k, signal.SIGUSR2)\nx = 'changed'\nlen(kids)"
    )
    assert cells.value(poke) == "1"
    assert cells.value("x") == "'changed'"
    branch(cells, "rollback", checkpoint_id=cp)
    assert cells.value("x") == "'kept'"


def test_an_unknown_checkpoint_is_refused_and_the_session_lives_on(cells: Cells) -> None:
    cells.run("x = 3")
    with pytest.raises(KernelRequestError) as refused:
        branch(cells, "rollback", checkpoint_id="nope")
    assert refused.value.code == "no_such_checkpoint"
    assert cells.value("x") == "3"


def test_closing_the_session_ends_its_checkpoints(client: KernelClient) -> None:
    cells = Cells(client)
    for _ in range(3):
        branch(cells, "checkpoint")
    kids = "import os\nopen(f'/proc/{os.getpid()}/task/{os.getpid()}/children').read().split()"
    held = [int(pid) for pid in eval(cells.value(kids) or "[]")]
    assert len(held) == 3
    client.close_session(cells.id)
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in held), 10)


def test_a_rollback_may_spend_its_checkpoint(cells: Cells) -> None:
    cells.run("x = 1")
    cp = branch(cells, "checkpoint")["checkpoint_id"]
    cells.run("x = 2")
    assert branch(cells, "rollback", checkpoint_id=cp, keep=False)["checkpoints"] == 0
    assert cells.value("x") == "1"
    with pytest.raises(KernelRequestError):
        branch(cells, "rollback", checkpoint_id=cp)
    cells.run("x = 5")
    assert cells.value("x") == "5"


def test_a_process_that_dies_in_a_cell_while_a_checkpoint_shares_its_socket_is_lost_at_once(
    cells: Cells,
) -> None:
    """The checkpoint keeps the control socket open, so only the process's exit (the zygote's
    report, or after a rollback a pidfd's) wakes the wait on the cell, well before its timeout."""
    die = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    for rollback in (False, True):
        cp = branch(cells, "checkpoint")["checkpoint_id"]
        if rollback:
            branch(cells, "rollback", checkpoint_id=cp)
        t0 = time.monotonic()
        result = cells.run(die, timeout_s=120)
        assert result.error is not None and result.error.kind == "state_lost"
        assert time.monotonic() - t0 < 60  # not the cell's timeout
        assert cells.value("1 + 1") == "2"


def test_branch_frames_validate_on_the_host(client: KernelClient) -> None:
    """What a real kernel answers to each op passes the host's check of the protocol."""
    from farm.models import frames

    cells = Cells(client)
    cells.run("def f(n): return n * 2\ny = f(21)")
    replies = [frames.validate(branch(cells, "checkpoint"))]
    cp = str(replies[0]["checkpoint_id"])
    for fields in ({"op": "rollback", "checkpoint_id": cp}, {"op": "fork", "n": 2}):
        frames.validate({"type": "branch", "session_id": cells.id, **fields})
        replies.append(frames.validate(branch(cells, **fields)))
    forks = replies[-1]["forks"]
    assert len(forks) == 2
    for forked in forks:
        got = client.execute(forked["session_id"], "f(y)", epoch=forked["epoch"], timeout_s=10)
        assert got["value"] is not None and got["value"]["text"] == "84"
        client.close_session(forked["session_id"])
    client.close_session(cells.id)


KIDS = (
    "import os\n"
    "def kids(p):\n"
    "    return [int(k) for k in open(f'/proc/{p}/task/{p}/children').read().split()]\n"
    "def group(p):\n"
    "    return int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[2])\n"
    "def standbys(copy):\n"
    "    return [k for k in kids(copy) if group(k) == copy]\n"
)


def standby_of(cells: Cells, copy: int) -> list[int]:
    """The held copy's standbys, as the box's own code finds them."""
    return [int(pid) for pid in eval(cells.value(f"standbys({copy})") or "[]")]


def test_a_rollback_that_keeps_its_checkpoint_goes_on_in_the_standby(cells: Cells) -> None:
    """The copy forks a standby once it holds; a rollback wakes that standby, and the copy
    forks the next one: every rollback after the first too."""
    cells.run(KIDS + "x = 1")
    cp = branch(cells, "checkpoint")["checkpoint_id"]
    (copy,) = [int(pid) for pid in eval(cells.value("kids(os.getpid())") or "[]")]
    assert wait_for(lambda: len(standby_of(cells, copy)) == 1, 10)
    for _ in range(3):
        (standby,) = standby_of(cells, copy)
        cells.run("x = 2")
        branch(cells, "rollback", checkpoint_id=cp)
        assert cells.value("(x, os.getpid(), os.getpgrp() == os.getpid())") == (
            f"(1, {standby}, True)"  # the standby, in a group of its own now
        )
        assert wait_for(lambda s=standby: standby_of(cells, copy) not in ([], [s]), 10)


def test_a_standby_the_box_kills_or_signals_costs_only_a_fork(cells: Cells) -> None:
    """The box's code can find the standby and signal it (one uid here): a wake-up from it is
    ignored, a stop is undone, what else it sent is dropped before the standby goes on as the
    session, and a SIGKILL leaves the copy to fork the session's process itself."""
    cells.run(KIDS + "import signal\nx = 1")
    cp = branch(cells, "checkpoint")["checkpoint_id"]
    (copy,) = [int(pid) for pid in eval(cells.value("kids(os.getpid())") or "[]")]
    assert wait_for(lambda: len(standby_of(cells, copy)) == 1, 10)
    (standby,) = standby_of(cells, copy)
    pokes = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGSTOP")
    cells.run("".join(f"os.kill({standby}, signal.{sig})\n" for sig in pokes) + "x = 2")
    assert standby_of(cells, copy) == [standby]  # still holding: the wake-up was not its own
    t0 = time.monotonic()
    branch(cells, "rollback", checkpoint_id=cp)  # the stopped standby is continued, goes on
    assert time.monotonic() - t0 < 30  # not the minute a silent process is waited for
    assert cells.value("(x, os.getpid())") == f"(1, {standby})"  # SIGTERM was not the session's
    assert wait_for(lambda: len(standby_of(cells, copy)) == 1, 10)
    (standby,) = standby_of(cells, copy)
    cells.run(f"os.kill({standby}, signal.SIGKILL)\nx = 3")
    branch(cells, "rollback", checkpoint_id=cp)
    assert cells.value("x") == "1"
    assert wait_for(lambda: standby_of(cells, copy) not in ([], [standby]), 10)
    branch(cells, "rollback", checkpoint_id=cp)
    assert cells.value("x") == "1"


def test_a_dropped_checkpoint_takes_its_standby_along(cells: Cells) -> None:
    cells.run(KIDS + "x = 1")
    cells.run("gone = lambda p: not os.path.exists(f'/proc/{p}')")  # no open: it may go first
    for spent in (False, True):
        cp = branch(cells, "checkpoint")["checkpoint_id"]
        (copy,) = [int(pid) for pid in eval(cells.value("kids(os.getpid())") or "[]")]
        assert wait_for(lambda c=copy: len(standby_of(cells, c)) == 1, 10)
        (standby,) = standby_of(cells, copy)
        if spent:  # the standby goes on as the session, and the copy ends
            cells.run("x = 2")
            branch(cells, "rollback", checkpoint_id=cp, keep=False)
            assert cells.value("(x, os.getpid())") == f"(1, {standby})"
            assert wait_for(lambda c=copy: cells.value(f"gone({c})") == "True", 10)
        else:
            branch(cells, "drop", checkpoint_id=cp)
            pair = f"[gone({copy}), gone({standby})]"
            assert wait_for(lambda p=pair: cells.value(p) == "[True, True]", 10)


def test_a_held_process_that_ends_is_no_answer_at_once_and_its_last_frame_is_read() -> None:
    """``ask`` with the answering process's pidfd: a process that ends without a word ends the
    wait at once (not after its minute); one that wrote its frame, then ended, is read."""
    import asyncio
    import socket
    import subprocess
    import sys

    from farm.kernel.supervisor.held_answers import ask
    from farm.kernel.supervisor.session_process import SessionProcess
    from farm.kernel.wire.framing import encode

    frame = encode({"type": "restored", "pid": 7})
    says = "import os, sys; os.write(int(sys.argv[1]), " + repr(frame) + ")"

    async def answer(code: str) -> tuple[dict[str, Any], float]:
        here, there = socket.socketpair()
        out, err = os.pipe(), os.pipe()
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(there.fileno())], pass_fds=[there.fileno()]
        )
        proc = SessionProcess(child.pid, here, out[0], err[0])
        await proc.attach(asyncio.get_running_loop())
        pidfd = os.pidfd_open(child.pid)
        try:
            t0 = time.monotonic()
            reply = await ask(proc, None, timeout_s=60, watch=pidfd)
            return reply, time.monotonic() - t0
        finally:
            os.close(pidfd)
            child.wait()
            there.close()  # held open meanwhile, as a held copy holds the session's socket
            proc.close(asyncio.get_running_loop())
            for fd in (out[1], err[1]):
                os.close(fd)

    silent, waited = asyncio.run(answer("pass"))
    assert silent == {"error": "the process to answer ended first"} and waited < 30
    spoke, _ = asyncio.run(answer(says))
    assert spoke == {"type": "restored", "pid": 7}
