"""The distributed core against real Redis, real Celery worker processes and real Docker."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from farm.celeryconf import TASK_EXEC
from farm.client import Farm
from farm.client.broker import Watch
from farm.errors import FarmBusy, SandboxUnavailable, SessionLost, StateLost
from farm.events.run_events import ExecStart
from farm.local.embedded import LocalFarm
from tests.test_reliability_adversarial import session_on
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def metric(url: str, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    pattern = rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$"
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.fixture
def own_farm(docker_env: Any, request: Any) -> Iterator[Farm]:
    env = getattr(request, "param", {})
    local = LocalFarm(2, env=env).start()
    farm = Farm(local.settings(), owned=local)
    try:
        yield farm
    finally:
        farm.close()


def test_interleaved_sessions_see_only_their_own_state(farm: Farm) -> None:
    workers = sorted(str(w["id"]) for w in farm.workers())
    sessions = [session_on(farm, workers[i % 2]) for i in range(20)]  # 10 on each, interleaved
    try:
        assert {s.worker for s in sessions} == set(workers) and len(workers) == 2
        for i, s in enumerate(sessions):
            s.run(f"mine = {i}\nlog = []")
        for round_ in range(3):
            for s in sessions:
                s.run(f"log.append({round_})")
        for i, s in enumerate(sessions):
            value = s.run("(mine, log)").value
            assert value is not None and value.text == f"({i}, [0, 1, 2])"
    finally:
        for s in sessions:
            s.close()


def test_one_shot_runs_and_results_name_their_worker(farm: Farm) -> None:
    result = farm.run("print('hello')\n6 * 7")
    assert result.ok and result.stdout == "hello\n"
    assert result.value is not None and result.value.text == "42"
    assert result.worker in {w["id"] for w in farm.workers()}
    failed = farm.run("raise ValueError('bad input')")
    assert failed.kind == "user" and failed.error is not None
    assert failed.error.ename == "ValueError"


def test_an_image_no_worker_serves_fails_fast(farm: Farm) -> None:
    connected = Farm(farm.settings)  # a client of a running farm: it cannot start workers
    try:
        t0 = time.monotonic()
        with pytest.raises(SandboxUnavailable, match="no live worker serves image 'gpu'"):
            connected.session(image="gpu")
        with pytest.raises(SandboxUnavailable):
            connected.run("1", image="gpu")
        assert time.monotonic() - t0 < 5
    finally:
        connected.close()
    no_image = "no image farm-sandbox:gpu; build it first: `farm image build gpu"
    with pytest.raises(SandboxUnavailable, match=no_image):
        farm.session(image="gpu")  # a local farm would start a worker, but there is no image


def test_a_duplicated_exec_message_runs_the_code_once(farm: Farm) -> None:
    with farm.session() as s:
        s.run("counter = 0")
        request = s.exec_request("counter += 1\ncounter").model_dump(mode="json")
        first = farm.app.send_task(TASK_EXEC, args=[request], queue=s.queue)
        second = farm.app.send_task(TASK_EXEC, args=[request], queue=s.queue)
        results = [p.get(timeout=60) for p in (first, second)]
        assert [r["value"]["text"] for r in results] == ["1", "1"]
        value = s.run("counter").value
        assert value is not None and value.text == "1"


def test_attach_continues_a_session_from_another_client(farm: Farm) -> None:
    with farm.session() as s:
        s.run("shared = 'from the first client'")
        other = Farm(farm.settings)
        try:
            attached = other.attach(s.id)
            value = attached.run("shared").value
            assert value is not None and value.text == "'from the first client'"
        finally:
            other.close()
    with pytest.raises(SessionLost):
        farm.attach("no-such-session")


def test_state_loss_raises_until_the_caller_restarts(farm: Farm) -> None:
    with farm.session() as s:
        s.run("x = 1")
        with pytest.raises(StateLost) as info:
            s.run("import os; os._exit(1)")
        assert info.value.result.state_lost
        with pytest.raises(StateLost):
            s.run("print('must not run in a fresh namespace')")
        s.restart()
        result = s.run("'x' in globals()")
        assert result.value is not None and result.value.text == "False"


def test_metrics_move_after_a_timeout_and_an_oom(farm: Farm) -> None:
    """Two kinds of ``oom``: an allocation past the box's limit (``MemoryError``, variables
    kept), and the box's processes together past it, each under its own limit (the kernel's
    memory watch kills the largest, the session process last)."""
    with farm.session(limits={"memory_mb": 512}) as s:
        url = next(w["metrics"] for w in farm.workers() if w["id"] == s.worker)
        timeouts = metric(url, "farm_exec_timeouts_total")
        ooms = metric(url, "farm_exec_oom_total")
        s.run("import time\ntime.sleep(30)", timeout_s=0.5)
        refused = s.run("kept = 1\nx = bytearray(2 * 10**9)", timeout_s=60)
        assert refused.kind == "oom" and not refused.state_lost
        assert refused.error is not None and refused.error.ename == "MemoryError"
        bomb = s.run(  # 300 + 250 MB, touched, past the box's 512: the child is killed and
            # the cell fails for it (a cell that succeeds anyway stays ok, with the note)
            "import subprocess, sys\nheld = bytearray(300 * 2**20)\n"
            "held[::4096] = b'x' * len(held[::4096])\nsubprocess.run([sys.executable, '-c', "
            '\'import time; more = bytearray(250 * 2**20); more[::4096] = b"y" * '
            "len(more[::4096]); time.sleep(20)'], check=True)",
            timeout_s=60,
        )
        assert bomb.kind == "oom" and not bomb.state_lost, bomb
        assert "over its 512 MB" in bomb.stderr, bomb.stderr
        assert metric(url, "farm_exec_timeouts_total") == timeouts + 1
        assert metric(url, "farm_exec_oom_total") == ooms + 2
        assert metric(url, "farm_sandbox_up") == 1
        assert metric(url, "farm_exec_total", '{kind="timeout",status="error"}') >= 1
        ready = urllib.request.urlopen(f"{url}/readyz", timeout=5)
        assert ready.status == 200


def test_killing_a_worker_loses_only_its_sessions(own_farm: Farm) -> None:
    local = own_farm.local_farm
    workers = sorted(str(w["id"]) for w in own_farm.workers())
    sessions = [session_on(own_farm, workers[i % 2]) for i in range(6)]
    victim = sessions[0].worker
    survivors = [s for s in sessions if s.worker != victim]
    doomed = [s for s in sessions if s.worker == victim]
    assert survivors and doomed
    for s in sessions:
        s.run("state = 'kept'")
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        try:
            doomed[0].run("print('running', flush=True)\nimport time\ntime.sleep(60)", 120)
        except SessionLost as exc:
            outcome["lost_at"] = time.monotonic()
            outcome["error"] = exc

    journaled = len(list(own_farm.replay(doomed[0].id)))
    thread = threading.Thread(target=in_flight)
    thread.start()

    def started() -> bool:  # its start and its print are journaled: the cell runs
        return len(list(own_farm.replay(doomed[0].id))) >= journaled + 2

    assert wait_for(started, 30)
    killed_at = time.monotonic()
    local.kill_worker(victim)
    thread.join(timeout=60)
    error = outcome.get("error")
    assert isinstance(error, SessionLost)
    assert outcome["lost_at"] - killed_at < 10
    assert (error.session_id, error.worker) == (doomed[0].id, victim)  # not "session ?"
    assert f"session {doomed[0].id} on worker {victim} is lost" in str(error)
    for s in doomed[1:]:
        with pytest.raises(SessionLost):
            s.run("state")
    for s in survivors:
        value = s.run("state").value
        assert value is not None and value.text == "'kept'"
    fresh = own_farm.session()
    assert fresh.worker != victim
    fresh.close()


@pytest.mark.parametrize(
    "own_farm", [{"FARM_MAX_SESSIONS": "1", "FARM_OPEN_WAIT_S": "2"}], indirect=True
)
def test_a_full_farm_raises_farm_busy_after_the_deadline(own_farm: Farm) -> None:
    held = [own_farm.session(), own_farm.session()]
    assert {s.worker for s in held} == {w["id"] for w in own_farm.workers()}
    busy = Farm(own_farm.settings.model_copy(update={"open_wait_s": 2.0}))
    try:
        with pytest.raises(FarmBusy):
            busy.session()
    finally:
        busy.close()
    held[0].close()
    again = own_farm.session()  # room again
    again.close()
    held[1].close()


@pytest.mark.parametrize("own_farm", [{"FARM_IDLE_TIMEOUT_S": "3"}], indirect=True)
def test_idle_sessions_expire(own_farm: Farm) -> None:
    s = own_farm.session()
    s.run("x = 1")
    assert wait_for(lambda: own_farm.registry.session(s.id) is None, 20, 0.2)
    with pytest.raises(SessionLost, match="expired"):
        s.run("x")
    # the worker's reaper closes the kernel session too
    expired = f"session {s.id} expired"
    assert wait_for(lambda: expired in own_farm.local_farm.log_tail(s.worker, 200), 20, 0.2)


def test_sigterm_finishes_the_call_in_flight_then_deregisters(own_farm: Farm) -> None:
    import signal

    local = own_farm.local_farm
    s = own_farm.session()
    outcome: dict[str, Any] = {}

    started = threading.Event()

    def in_flight() -> None:
        stream = s.stream("import time\ntime.sleep(3)\n'finished'", timeout_s=30)
        for event in stream:
            if isinstance(event, ExecStart):
                started.set()  # the worker runs it: the state under test
        outcome["result"] = stream.result

    thread = threading.Thread(target=in_flight)
    thread.start()
    assert started.wait(60), "the call never started"
    stopped = s.worker
    local.kill_worker(stopped, signal.SIGTERM)
    thread.join(timeout=60)
    assert outcome["result"].value.text == "'finished'"
    local.workers[stopped].wait(30)
    assert stopped not in {w["id"] for w in own_farm.workers()}
    moved = s.run("1")  # it drained first (drain_on_stop): the session lives on the other
    assert moved.ok and s.worker != stopped


def test_a_restarted_worker_never_runs_its_predecessors_messages(own_farm: Farm) -> None:
    local = own_farm.local_farm
    s = own_farm.session()
    s.run("x = 'old generation'")
    old_queue, old_worker = s.queue, s.worker
    local.kill_worker(old_worker)
    local.workers[old_worker].wait(30)
    assert wait_for(lambda: own_farm.registry.worker(old_worker) is None, 30)  # heartbeat expired
    # a message left for the dead generation, e.g. sent just before it died
    request = s.exec_request("open('/workspace/ran', 'w').write('ran')").model_dump(mode="json")
    own_farm.app.send_task(TASK_EXEC, args=[request], queue=old_queue)
    # the same worker id comes back: a new generation with a queue of its own
    new_id = local.add_worker("default", FARM_WORKER_ID=old_worker)
    local.workers[old_worker] = local.workers.pop(new_id)  # its process, under its real id
    local.wait_ready([old_worker])
    entry = own_farm.registry.worker(old_worker)
    assert entry is not None and entry["generation"] == s.generation + 1
    assert entry["queue"] != old_queue
    with pytest.raises(SessionLost) as lost:
        s.run("x")
    message = str(lost.value)  # the caller learns which session, on which worker, and why
    assert message.startswith(f"session {s.id} on worker {old_worker} is lost: "), message
    assert f"worker {old_worker} (generation {s.generation}) is gone" in message, message
    assert (lost.value.session_id, lost.value.worker) == (s.id, old_worker)
    assert own_farm.registry.queue_length(old_queue) == 1  # still there, never consumed
    assert own_farm.registry.exec_record(request["exec_id"]) is None
    assert own_farm.registry.dead_direct_queues() == [old_queue]
    assert own_farm.registry.drop_queues([old_queue]) == 1


def test_a_crashing_task_is_a_typed_error_and_the_worker_serves_on(farm: Farm) -> None:
    from farm.errors import WorkerFailed

    with farm.session() as s:
        pending = farm.app.send_task(TASK_EXEC, args=[], queue=s.queue)  # no request at all
        with pytest.raises(WorkerFailed, match="TypeError"):
            farm.broker.wait(pending, time.monotonic() + 60, Watch(worker=(s.worker, s.generation)))
        value = s.run("'still serving'").value
        assert value is not None and value.text == "'still serving'"


@pytest.mark.parametrize("own_farm", [{}], indirect=True)
def test_a_one_shot_run_that_started_is_not_retried_behind_the_callers_back(
    own_farm: Farm,
) -> None:
    local = own_farm.local_farm
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["result"] = own_farm.run("import time\ntime.sleep(60)", timeout_s=120, retries=3)
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()

    def claimed() -> dict[str, Any] | None:
        keys = list(own_farm.registry.redis.scan_iter("farm:exec:*"))
        return own_farm.registry.exec_record(keys[0].split(":")[-1]) if keys else None

    record = wait_for(claimed, 30)  # a worker has claimed (started) the run
    assert record is not None and record["state"] == "running"
    killed_at = time.monotonic()
    local.kill_worker(str(record["worker"]))
    thread.join(timeout=90)
    result = outcome["result"]
    assert result.kind == "sandbox_lost"
    assert outcome["at"] - killed_at < 30  # reported, not re-run (a re-run sleeps 60 s)


def test_celery_with_a_prefork_pool_is_refused_with_a_clear_message(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    celery = Path(sys.executable).parent / "celery"
    done = subprocess.run(
        [str(celery), "-A", "farm.worker", "worker", "--pool", "prefork"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**__import__("os").environ, "FARM_BROKER_URL": "redis://127.0.0.1:1/0"},
    )
    assert done.returncode != 0
    assert "farm workers need `--pool threads`" in done.stderr + done.stdout


def test_celery_with_the_threads_pool_starts_a_farm_worker(farm: Farm) -> None:
    """The other half of the pool check: the pool `farm worker` uses is accepted."""
    assert all(w["ready"] for w in farm.workers()) and len(farm.workers()) == 2
