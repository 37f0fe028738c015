"""Forks of a session into boxes of their own, on a real farm (Docker sandbox, Celery, Redis).

A fork starts from its parent's files and variables (cell-defined functions and classes
included) and is a box of its own: it cannot read its parent's files, signal its processes or
reach its loopback, and a fork bomb of forks is refused by the budgets. Design:
docs/design/fork.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from farm.client import Farm, Session
from farm.errors import BudgetExceeded
from tests.test_cotenancy import value
from tests.test_reliability_adversarial import record

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]

STATE = """
import os, json
class Point:
    def __init__(self, x): self.x = x
    @property
    def twice(self): return 2 * self.x
def grow(n): return [Point(i).twice for i in range(n)]
table = {"k": [1, 2, 3]}
p = Point(21)
fh = open('notes.txt', 'w'); fh.write('kept'); fh.flush()
"""


@pytest.fixture
def parent(one_worker: Farm) -> Iterator[Session]:
    with one_worker.session() as s:
        assert s.run(STATE).ok
        yield s


def test_a_fork_starts_from_its_parents_state(parent: Session) -> None:
    forks = parent.fork(2)
    try:
        assert len(forks) == 2 and len({f.id for f in forks} | {parent.id}) == 3
        for f in forks:
            got = "(table, p.twice, grow(3), open('notes.txt').read(), json.dumps(1))"
            assert value(f, got) == ({"k": [1, 2, 3]}, 42, [0, 2, 4], "kept", "1")
        assert any(name.startswith("fh:") for name in forks.not_carried)
        forks[0].run("table['k'].append(4)")
        assert value(forks[1], "table") == {"k": [1, 2, 3]}  # each its own copy
        assert value(parent, "table") == {"k": [1, 2, 3]}
    finally:
        for f in forks:
            f.close()


def test_forks_are_boxes_of_their_own(parent: Session, record_property: Any) -> None:
    """A fork has its own uid and disk: the parent's files, processes and loopback are out
    of its reach, and so are its sibling's."""
    parent.run(
        "import subprocess, socket\nsleeper = subprocess.Popen(['sleep', '600'])\n"
        "srv = socket.create_server(('127.0.0.1', 8124))\nuid = os.getuid()"
    )
    parent_uid = value(parent, "uid")
    forks = parent.fork(2)
    try:
        probe = (
            "import signal, errno\nseen = [int(n) for n in os.listdir('/proc') if n.isdigit()]\n"
            "owners = sorted({os.stat(f'/proc/{n}').st_uid for n in seen})\n"
            "for n in seen:\n    if n != os.getpid():\n"
            "        try: os.kill(n, signal.SIGKILL)\n        except OSError: pass\n"
            "try: socket.create_connection(('127.0.0.1', 8124), timeout=2); reach = 'reached'\n"
            "except OSError as e: reach = errno.errorcode[e.errno]\n"
            "(os.getuid(), owners, reach, sorted(os.listdir('/workspace')))"
        )
        facts = [value(f, probe) for f in forks]
        record(
            record_property,
            "each fork: its own uid, no process of another in sight, its own loopback",
            f"parent uid {parent_uid}; forks (uid, owners seen, connect): "
            + "; ".join(f"{u}, {o}, {r}" for u, o, r, _ in facts),
        )
        uids = {uid for uid, _, _, _ in facts}
        assert len(uids | {parent_uid}) == 3
        for uid, owners, reach, files in facts:
            assert set(owners) <= {0, uid}  # no process of the parent's or a sibling's in sight
            assert reach == "ECONNREFUSED"  # its own loopback, not the parent's
            assert files == ["notes.txt"]  # its own copy
        assert value(parent, "sleeper.poll() is None") is True  # the kills reached nothing
        assert [value(f, "p.x") for f in forks] == [21, 21]
    finally:
        for f in forks:
            f.close()


def test_a_fork_bomb_of_forks_is_refused_by_the_budget(
    parent: Session, record_property: Any
) -> None:
    forks: list[Session] = []
    try:
        with pytest.raises(BudgetExceeded) as refused:
            for _ in range(64):
                forks += (forks[-1] if forks else parent).fork(4)
        record(
            record_property,
            "forks of forks refused by the budget (BudgetExceeded), the parent lives on",
            f"{len(forks)} forks made, then: {refused.value}",
        )
        assert forks, "some forks fit before the budget said no"
        assert value(parent, "p.x") == 21  # the parent lives on
    finally:
        for f in forks:
            f.close()
    with parent.fork(1)[0] as again:  # their room came back
        assert value(again, "p.x") == 21
