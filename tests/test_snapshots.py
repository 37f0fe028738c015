"""Session snapshots, restores, pause and resume on a real Redis and a real Celery worker
(in-process, process backend): variables and workspace files come back, what cannot be
carried is named with why, limits and bad bytes are typed errors. Docker farms, other workers,
cloudpickle images and drains: ``tests/test_snapshots_docker.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from farm.client.snapshots import Snapshot
from farm.errors import SessionPaused, SnapshotError, SnapshotNotFound, SnapshotTooLarge
from tests.conftest import inproc_worker

SETUP = """
import os, socket, threading
x = {"answer": 41, "items": [1, 2, 3]}
alias = x
blob = b"\\x00" * 1000
lock = threading.Lock()
sock = socket.socket()
gen = (i for i in range(3))
def f(y):
    return y + 1
os.makedirs("data/deep", exist_ok=True)
open("data/deep/note.txt", "w").write("kept")
open("top.bin", "wb").write(bytes(range(256)))
"""


@pytest.fixture(scope="module")
def pair(redis_server: Any) -> Iterator[tuple[Any, Any]]:
    """``(farm, worker)``: one in-process worker of the test module's own."""
    with inproc_worker(redis_server.url) as both:
        yield both


@pytest.fixture
def farm(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def test_a_snapshot_restores_variables_and_files_and_names_what_it_could_not_carry(
    farm: Any,
) -> None:
    with farm.session() as session:
        assert session.run(SETUP).ok
        snap = session.snapshot()
        assert isinstance(snap.data, bytes) and snap.id is None
        assert {"x", "alias", "blob"} <= set(snap.info.names)
        assert snap.info.modules == {"os": "os", "socket": "socket", "threading": "threading"}
        assert "lock" in snap.info.lost["lock"] or "_thread.lock" in snap.info.lost["lock"]
        assert "generator" in snap.info.lost["gen"]
        assert "socket" in snap.info.lost["sock"].lower()
        if snap.info.pickler == "pickle":  # no cloudpickle in this Python: code is not carried
            assert "cloudpickle" in snap.info.lost["f"]
        assert snap.info.files == 2
    with farm.restore(snap) as restored:
        assert restored.id != session.id
        assert restored.restored is not None and set(restored.restored.lost) >= {"lock", "gen"}
        check = restored.run(
            "x['answer'] + 1, alias is x, len(blob), open('data/deep/note.txt').read(), "
            "open('top.bin', 'rb').read() == bytes(range(256)), os.sep"
        )
        assert check.ok, check.error
        assert check.value is not None
        assert check.value.text == "(42, True, 1000, 'kept', True, '/')"
        gone = restored.run("lock")
        assert gone.error is not None and gone.error.ename == "NameError"


def test_a_kept_snapshot_is_restored_by_id_and_the_session_goes_on_meanwhile(farm: Any) -> None:
    with farm.session() as session:
        session.run("n = 1")
        kept = session.snapshot(keep=True)
        assert kept.data is None and kept.id
        session.run("n = 2")
        with farm.restore(kept.id) as first, farm.restore(kept) as second:
            assert first.run("n").value.text == "1"
            assert second.run("n").value.text == "1"
        assert session.run("n").value.text == "2"
        with pytest.raises(SnapshotError):
            bytes(kept)  # kept by the farm: no bytes in hand


def test_bytes_that_are_not_a_snapshot_and_unknown_ids_are_typed_errors(farm: Any) -> None:
    with pytest.raises(SnapshotError, match="not a farm session snapshot"):
        farm.restore(b"hello")
    with farm.session() as session:
        session.run("v = 1")
        data = session.snapshot().data
    with pytest.raises(SnapshotError, match="bytes"):
        farm.restore(data[:-10])
    with pytest.raises(SnapshotNotFound):
        farm.restore("no-such-snapshot")


def test_a_snapshot_over_the_farms_limit_is_refused_with_its_size(
    pair: tuple[Any, Any],
) -> None:
    farm, worker = pair
    settings = worker.settings
    worker.settings = settings.model_copy(update={"snapshot_max_bytes": 1 << 20})
    try:
        with farm.session() as session:
            session.run("big = b'x' * (3 << 20)")
            with pytest.raises(SnapshotTooLarge) as raised:
                session.snapshot()
            assert raised.value.size > 3 << 20 and raised.value.limit == 1 << 20
            assert session.run("len(big)").value.text == str(3 << 20)  # it lives on
    finally:
        worker.settings = settings


def test_a_paused_session_refuses_calls_and_resumes_with_its_id_and_state(farm: Any) -> None:
    with farm.session() as session:
        session.run("count = 10\nopen('f.txt', 'w').write('x')")
        paused = session.pause()
        assert isinstance(paused, Snapshot) and paused.id
        with pytest.raises(SessionPaused):
            session.run("count")
        session.resume()
        result = session.run("count + 1, open('f.txt').read()")
        assert result.ok, result.error
        assert result.value.text == "(11, 'x')"
        with pytest.raises(SnapshotNotFound):  # a resumed session's snapshot is used up
            farm.resume(session.id)


def test_a_paused_session_is_resumed_from_another_client_by_id(farm: Any) -> None:
    from farm.client import Farm

    session = farm.session()
    session.run("word = 'again'")
    session.pause()
    with pytest.raises(SessionPaused):
        farm.attach(session.id)
    with Farm(farm.settings) as other, other.resume(session.id) as resumed:
        assert resumed.id == session.id
        assert resumed.run("word").value.text == "'again'"
        events = [e for e in other.replay(session.id) if e.type == "lifecycle"]
        assert [e.action for e in events] == ["paused", "restored"]


def test_a_restore_asks_for_the_limits_its_session_had(farm: Any) -> None:
    probe = "import resource\nresource.getrlimit(resource.RLIMIT_DATA)[0] >> 20"
    with farm.session(limits={"memory_mb": 100}) as session:
        assert session.run(probe).value.text == "100"
        snap = session.snapshot()
    assert snap.info.limits == {"memory_mb": 100}
    with farm.restore(snap) as same, farm.restore(snap, limits={"memory_mb": 120}) as bigger:
        assert same.run(probe).value.text == "100"
        assert bigger.run(probe).value.text == "120"


def test_the_asyncio_twins_snapshot_restore_pause_and_resume(farm: Any) -> None:
    import asyncio

    from farm.client import AsyncFarm

    async def main() -> tuple[str, str]:
        afarm = AsyncFarm(farm)
        session = await afarm.session()
        await session.arun("word = 'twin'")
        snap = await session.snapshot()
        restored = await afarm.restore(snap)
        copied = (await restored.arun("word")).value.text
        await restored.aclose()
        await session.pause()
        await session.resume()
        resumed = (await session.arun("word")).value.text
        await session.aclose()
        return copied, resumed

    assert asyncio.run(main()) == ("'twin'", "'twin'")


def test_a_box_that_lies_about_its_snapshot_gets_a_typed_error_and_lives_on(
    pair: tuple[Any, Any],
) -> None:
    """The session's code can replace what writes its snapshot: the worker reads it bounded
    and checked, as the box's word."""
    farm, worker = pair
    settings = worker.settings
    worker.settings = settings.model_copy(update={"snapshot_max_bytes": 1 << 20})
    liar = (
        "import farm.kernel.repl.namespace_snapshot as ns, os\n"
        "def lie(g):\n"
        "    os.makedirs(ns.DIR, exist_ok=True)\n"
        "    open(os.path.join(ns.DIR, ns.MANIFEST), 'w').write({manifest!r})\n"
        "    open(os.path.join(ns.DIR, ns.NAMESPACE), 'wb').write(b'x' * {size})\n"
        "    open(os.path.join(ns.DIR, ns.WORKSPACE), 'wb').write(b'')\n"
        "ns.dump = lie\nalive = 1"
    )
    try:
        with farm.session() as session:
            session.run(liar.format(manifest="[1, 2]", size=10)).raise_for_error()
            with pytest.raises(SnapshotError, match="manifest"):
                session.snapshot()
            good = '{"python": "3.11", "pickler": "pickle", "namespace_bytes": 1}'
            session.run(liar.format(manifest=good, size=5 << 20)).raise_for_error()
            with pytest.raises(SnapshotTooLarge):
                session.snapshot()  # it said 1 byte: 5 MB are refused before they are read
            assert session.run("alive").value.text == "1"
    finally:
        worker.settings = settings
