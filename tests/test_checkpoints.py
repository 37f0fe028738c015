"""Checkpoints and rollbacks of a session, on a real farm (Docker sandbox, Celery, Redis).

A rollback must give back exactly what the checkpoint held (variables, imported modules, files)
and nothing of what came after (processes started since end); a checkpoint is a process of the
box and counts in its budgets; the box's own code cannot wake one. Design: docs/design/fork.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.errors import BudgetExceeded, StateLost, TooManyCheckpoints, UnknownCheckpoint
from tests.test_cotenancy import value
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]


@pytest.fixture
def session(one_worker: Farm) -> Iterator[Session]:
    with one_worker.session() as s:
        yield s


def test_rollback_restores_variables_modules_and_files(session: Session) -> None:
    session.run("import os\nx = [1, 2]\nopen('a.txt', 'w').write('one')\nos.mkdir('d')")
    cp = session.checkpoint()
    assert cp.files >= 3 and cp.bytes >= 3
    changed = "import csv\nx.append(3)\nopen('a.txt', 'w').write('two')\nopen('b.txt', 'w')"
    session.run(changed + "\nos.rmdir('d')\nopen('/tmp/t', 'w').write('t')")
    session.rollback(cp)
    state = "(x, open('a.txt').read(), sorted(os.listdir('.')), os.listdir('/tmp'))"
    assert value(session, state) == ([1, 2], "one", ["a.txt", "d"], [])
    assert value(session, "'csv' in __import__('sys').modules") is False
    session.run("x = 'again'")
    session.rollback(cp)  # a checkpoint outlives a rollback to it
    assert value(session, "x") == [1, 2]
    session.run("x = 'once more'")
    session.rollback(cp, keep=False)  # unless it is spent
    assert value(session, "x") == [1, 2]
    with pytest.raises(UnknownCheckpoint):
        session.rollback(cp)


def test_a_run_from_a_checkpoint_rolls_back_first(session: Session) -> None:
    """``run(code, rollback_to=cp)``: one call that returns to ``cp`` and runs ``code`` there,
    what a search or a best-of-N tries from one state. The session goes on from that run,
    and a checkpoint it does not hold is an ``input`` result: nothing ran, nothing lost."""
    session.run("x = [1]\nopen('f', 'w').write('a')")
    cp = session.checkpoint()
    for _ in range(3):
        tried = session.run("x.append(2)\nopen('f', 'a').write('b')\n(x, open('f').read())",
                            rollback_to=cp)  # fmt: skip
        assert tried.ok and tried.value is not None, tried.error
        assert eval(tried.value.text) == ([1, 2], "ab")
    assert value(session, "x") == [1, 2]  # no StateLost: the session follows the new epoch
    missing = session.run("x.append(3)", rollback_to="no-such-checkpoint")
    assert missing.kind == "input" and missing.error is not None
    assert missing.error.ename == "UnknownCheckpoint"
    assert value(session, "x") == [1, 2]
    with pytest.raises(StateLost):  # the run's own loss of state is still said
        session.run("import os\nos._exit(3)", rollback_to=cp)
    after = session.run("x", rollback_to=cp)  # the checkpoint outlives the crash
    assert after.ok and after.value is not None and eval(after.value.text) == [1]


def test_a_rollback_ends_processes_started_since_and_keeps_sockets(session: Session) -> None:
    """Children are not carried (the checkpoint has none; those started since end); a socket
    opened before the checkpoint is the same socket after it (it listens on)."""
    session.run(
        "import socket, subprocess\nsrv = socket.create_server(('127.0.0.1', 8123))\n"
        "before = subprocess.Popen(['sleep', '600'])"
    )
    cp = session.checkpoint()
    session.run("after = subprocess.Popen(['sleep', '600']); after_pid = after.pid")
    after_pid = value(session, "after_pid")
    session.rollback(cp)
    alive = "lambda pid: __import__('os').path.exists(f'/proc/{pid}')"
    assert value(session, f"({alive})(before.pid)") is False  # ended with the old line
    assert value(session, f"({alive})({after_pid})") is False
    connected = "socket.create_connection(('127.0.0.1', 8123), timeout=2) is not None"
    assert value(session, connected) is True


def test_a_rollback_ends_the_boxs_daemons_and_goes_on_in_the_standby(session: Session) -> None:
    """A process that left every group of the session (``setsid``) ends at a rollback too (the
    box's uid is searched), while the checkpoint's standby, spared as a member of the held
    copy's group, is the process that goes on."""
    session.run(
        "import os, subprocess\n"
        "kids = lambda p: open(f'/proc/{p}/task/{p}/children').read().split()\n"
        "group = lambda p: open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[2]\n"
        "standby = lambda c: [k for k in kids(c) if group(k) == c]"
    )
    cp = session.checkpoint()
    (copy,) = value(session, "kids(os.getpid())")
    assert wait_for(lambda: len(value(session, f"standby('{copy}')")) == 1, 10)
    (standby,) = value(session, f"standby('{copy}')")
    daemon = "subprocess.Popen(['sleep', '600'], start_new_session=True).pid"
    daemon_pid = value(session, daemon)
    session.rollback(cp)
    assert value(session, "str(os.getpid())") == standby
    assert value(session, f"os.path.exists('/proc/{daemon_pid}')") is False


def test_checkpoints_are_bounded_and_a_drop_frees_one(session: Session) -> None:
    taken = []
    with pytest.raises(TooManyCheckpoints):
        for _ in range(64):
            taken.append(session.checkpoint())
    assert len(taken) == 8
    session.drop_checkpoint(taken[0])
    with pytest.raises(UnknownCheckpoint):
        session.rollback(taken[0])
    session.checkpoint()  # the dropped one's room is free again
    assert value(session, "1 + 1") == 2


def test_a_rollback_recovers_a_crashed_session(session: Session) -> None:
    session.run("x = 41")
    cp = session.checkpoint()
    with pytest.raises(StateLost):
        session.run("import os; os._exit(3)")
    session.restart()
    session.rollback(cp)
    assert value(session, "x + 1") == 42


def test_checkpoints_count_in_the_boxs_pids_budget(one_worker: Farm) -> None:
    with one_worker.session(limits={"pids": 4}) as s:
        s.run("x = 1")
        with pytest.raises(BudgetExceeded):
            for _ in range(4):
                s.checkpoint()
        assert value(s, "x") == 1


def test_the_boxs_own_code_cannot_wake_a_checkpoint(session: Session) -> None:
    """The box's code can signal its checkpoints (same uid), but a SIGUSR2 or SIGCONT from it
    never makes one take over: only the supervisor's does."""
    session.run("x = 'kept'")
    cp = session.checkpoint()
    poke = (
        "import os, signal\nfor p in [int(n) for n in os.listdir('/proc') if n.isdigit()]:\n"
        "    if p != os.getpid():\n"
        "        for sig in (signal.SIGUSR2, signal.SIGCONT):\n"
        "            try: os.kill(p, sig)\n"
        "            except OSError: pass\n"
        "x = 'changed'"
    )
    assert session.run(poke).ok
    assert value(session, "x") == "changed"  # the session is still this process
    session.rollback(cp)
    assert value(session, "x") == "kept"


def test_the_journal_says_which_cells_a_rollback_undid(one_worker: Farm) -> None:
    """Branches are journaled, so a replay after a loss of state runs the cells the session
    held: those before the checkpoint, and after the rollback, never the undone ones."""
    from farm.client.journal_replay import live_cells
    from farm.events.run_events import Branch

    with one_worker.session() as s:
        for code in ("log = []", "log.append('a')"):
            s.run(code)
        cp = s.checkpoint()
        s.run("log.append('b')")
        s.rollback(cp)
        s.run("log.append('c')")
        events = list(one_worker.journal.events(s.id))
        ops = [(e.op, e.checkpoint_id) for e in events if isinstance(e, Branch)]
        assert ops == [("checkpoint", cp.id), ("rollback", cp.id)]
        cells = [start.code for start in live_cells(events, "none")]
        assert cells == ["log = []", "log.append('a')", "log.append('c')"]
        assert value(s, "log") == ["a", "c"]


def test_checkpoints_count_in_the_boxs_memory_budget(one_worker: Farm) -> None:
    """A checkpoint's pages become its own as the session writes its copy: once the box is
    over its memory budget, the memory watch ends the checkpoint, never the session."""
    with one_worker.session(limits={"memory_mb": 256}) as s:
        s.run("big = bytearray(150 * 1024 * 1024)\nfor i in range(0, len(big), 4096): big[i] = 1")
        cp = s.checkpoint()
        rewrite = (
            "import os, time\nfor i in range(0, len(big), 4096): big[i] = 7\n"
            "def others():\n"
            "    me = os.getuid()\n"
            "    return [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()"
            " and os.stat(f'/proc/{p}').st_uid == me"
            " and 'State:\\tZ' not in open(f'/proc/{p}/status').read()]\n"
            "deadline = time.monotonic() + 20\n"
            "while others() and time.monotonic() < deadline: time.sleep(0.05)\n"
            "others()"
        )
        assert value(s, rewrite) == []  # the checkpoint was the one to go
        with pytest.raises(UnknownCheckpoint):
            s.rollback(cp)
        assert value(s, "big[0]") == 7


def test_a_sessions_big_blocks_are_in_huge_pages(session: Session) -> None:
    """The kernel starts with glibc's malloc asking for transparent huge pages
    (``sandbox.backend.KERNEL_ENV``), and its sessions inherit that heap: a checkpoint of a
    session holding 100 MB then forks ~50 page-table entries instead of ~25,600. The setting
    is the kernel's own: user code and the programs it starts do not see it. Where the host
    turned THP off, only the latter is checked."""
    hold = "big = bytearray(100 * 1024 * 1024)\nfor i in range(0, len(big), 4096): big[i] = 1"
    session.run(hold)
    assert value(session, "'GLIBC_TUNABLES' in __import__('os').environ") is False
    assert "GLIBC_TUNABLES" not in session.exec(["env"]).stdout
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if "[never]" not in thp:
        huge = "[l.split()[1] for l in open('/proc/self/smaps_rollup') if 'AnonHuge' in l][0]"
        assert int(value(session, huge)) >= 50 * 1024  # kB: at least half of it


def test_the_async_twins(session: Session) -> None:
    from farm.client.aio import AsyncSession

    async def main() -> tuple[Any, Any]:
        twin = AsyncSession(session)
        await twin.arun("x = 1")
        cp = await twin.checkpoint()
        await twin.arun("x = 2")
        await twin.rollback(cp)
        forks = await twin.fork(1)
        try:
            got = (await forks[0].arun("x")).value
        finally:
            await forks[0].aclose()
        await twin.drop_checkpoint(cp)
        return (await twin.arun("x")).value, got

    mine, forked = asyncio.run(main())
    assert mine is not None and forked is not None and mine.text == forked.text == "1"
