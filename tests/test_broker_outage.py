"""A broker outage seen from the client: a short one is waited out, a long one ends in a typed
``BrokerUnavailable`` that says whether the call may have run, and a sweep stops with its
unsent items left for ``--resume``.

Real redis-server (stopped and started again by the test), real Celery worker processes; the
sandboxes are the process backend, because what is tested is the broker path, not isolation.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.errors import BrokerUnavailable
from farm.local.embedded import LocalFarm
from farm.sweep import Sweep, SweepSummary, plan_sweep
from tests.redis_outage import start_redis, stop_redis
from tests.waiting import stays, wait_for

pytestmark = [pytest.mark.slow]


@pytest.fixture
def local_farm() -> Iterator[Farm]:
    local = LocalFarm(1, backend="process").start()
    farm = Farm(local.settings(), owned=local)
    try:
        yield farm
    finally:
        farm.close()


def impatient(farm: Farm, wait_s: float) -> Farm:
    """Another client of the same farm that waits out outages of ``wait_s`` at most."""
    return Farm(farm.settings.model_copy(update={"broker_wait_s": wait_s}))


def test_a_call_made_during_a_short_outage_runs_once_the_broker_is_back(
    local_farm: Farm,
) -> None:
    local = local_farm.local_farm
    with local_farm.session() as s, ThreadPoolExecutor(1) as pool:
        s.run("x = 41\nruns = 0")
        stop_redis(local, save=True)  # a restart with persistence: nothing is lost
        call = pool.submit(s.run, "runs += 1\nx + 1")
        assert stays(lambda: not call.done(), 1.0), "the call returned while the broker was down"
        start_redis(local)
        result = call.result(timeout=120)
        assert result.ok and result.value is not None and result.value.text == "42"
        assert s.run("runs").value.text == "1"  # type: ignore[union-attr]


def test_a_longer_outage_is_a_typed_error_and_the_session_survives_it(
    local_farm: Farm,
) -> None:
    local = local_farm.local_farm
    with impatient(local_farm, 1.0) as farm:
        s = farm.session()
        s.run("x = 1")
        stop_redis(local, save=True)
        try:
            t0 = time.monotonic()
            with pytest.raises(BrokerUnavailable) as caught:
                s.run("x = 2")
            assert time.monotonic() - t0 < 30, "the outage was not bounded by broker_wait_s"
            assert not caught.value.sent and "nothing was sent" in str(caught.value)
            assert f"127.0.0.1:{local.redis.port}" in str(caught.value)
            with pytest.raises(BrokerUnavailable) as caught:
                farm.run("1")  # nothing sent: an error, not a result
            assert not caught.value.sent
        finally:
            start_redis(local)
        value = s.run("x").value  # nothing ran: the state is as it was
        assert value is not None and value.text == "1"
        s.close()


def test_a_sweep_stops_on_a_long_outage_and_a_resume_runs_every_item_once(
    local_farm: Farm, tmp_path: Path
) -> None:
    local = local_farm.local_farm
    source, out = tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    ids = [f"item-{n}" for n in range(60)]
    source.write_text(
        "".join(
            json.dumps({"id": i, "code": "import time\ntime.sleep(0.1)\n7"}) + "\n" for i in ids
        )
    )
    summaries: list[SweepSummary] = []
    with impatient(local_farm, 1.0) as farm:
        sweep = Sweep(farm, concurrency=2, timeout_s=30)

        def run() -> None:
            try:
                summaries.append(sweep.run(plan_sweep(source, out), out))
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        errors: list[BaseException] = []
        runner = threading.Thread(target=run)
        runner.start()

        def progressed() -> bool:
            return not runner.is_alive() or (
                out.exists() and len(out.read_text().splitlines()) >= 5
            )

        assert wait_for(progressed, 120) and runner.is_alive(), "the sweep made no progress"
        stop_redis(local, save=True)
        runner.join(120)
        start_redis(local)
    assert not runner.is_alive(), "the sweep did not stop during the outage"
    assert not errors, "".join(traceback.format_exception(errors[0])) if errors else ""
    (stopped,) = summaries
    assert stopped.interrupted and stopped.stopped and "--resume" in stopped.stopped
    first = Counter(json.loads(line)["id"] for line in out.read_text().splitlines())
    assert len(first) < len(ids) and max(first.values()) == 1
    resumed = Sweep(local_farm, concurrency=2, timeout_s=30).run(
        plan_sweep(source, out, resume=True), out
    )
    assert not resumed.interrupted and resumed.stopped is None
    final = Counter(json.loads(line)["id"] for line in out.read_text().splitlines())
    assert sorted(final) == sorted(ids) and max(final.values()) == 1


def test_results_of_a_map_that_end_during_an_outage_arrive_once_the_broker_is_back(
    local_farm: Farm, tmp_path: Path
) -> None:
    """Items end while Redis is down: the worker cannot push their results, and waits the
    outage out (a result dropped there would leave its item claimed by a live worker, and the
    map waiting for it forever)."""
    local = local_farm.local_farm
    items = [
        f"open({str(tmp_path)!r} + '/{i}', 'w').close()\nimport time\ntime.sleep(2)\n{i}"
        for i in range(4)
    ]
    records: list[Any] = []
    runner = threading.Thread(target=lambda: records.extend(local_farm.map(items)))
    runner.start()
    try:
        assert wait_for(lambda: len(list(tmp_path.iterdir())) == 4, 60), "the items never started"
        stop_redis(local, save=True)  # a restart with persistence: nothing is lost
        assert stays(runner.is_alive, 3.0)  # the items ended meanwhile; their map waits
    finally:
        start_redis(local)
    runner.join(90)
    assert not runner.is_alive(), "the map never got the results pushed during the outage"
    assert [(r.id, r.status, r.cells[-1].value.text) for r in records] == [
        (i, "ok", str(i)) for i in range(4)
    ]
