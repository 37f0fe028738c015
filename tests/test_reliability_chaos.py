"""Chaos with real processes, Docker and Redis: what a running farm does when its parts die.

- ``docker kill`` of a sandbox during a call: ``SessionLost`` within 2 s, a healthy
  replacement sandbox on the same worker;
- ``kill -9`` of a worker during a 500-item sweep: the sweep completes, every id exactly once,
  lost items retried per the rules, and no message left for the dead worker ever runs;
- a Redis restart during a sweep: it pauses and resumes, or fails with a clear error; no id
  is reported twice, and ``--resume`` finishes the rest;
- SIGTERM of a worker: the calls in flight finish, then it deregisters and removes its sandbox.

Each test owns its farm, since each breaks it. Expected and observed outcomes go to junit
properties for ``scripts/reliability_report.py``.
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.errors import FarmError, SessionLost
from farm.events.run_events import ExecStart
from farm.image_name import ImageName
from farm.local.embedded import LocalFarm
from farm.models.batch import BatchItem, Chunk
from farm.registry import chunks_key
from farm.sweep import Sweep, SweepSummary, plan_sweep
from tests.redis_outage import start_redis, stop_redis
from tests.test_reliability_adversarial import record, session_on
from tests.waiting import stays, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability, pytest.mark.chaos]

LOST_WITHIN_S = 2.0
# A sweep hit by a worker's kill -9 has finished this long after it on an idle machine; on a
# loaded one the deadline stretches to twice what the items left take at the rate before the
# kill, so slowness is not taken for a hang (a hung item never finishes at any rate).
SWEEP_DEADLINE_S = 30.0
RESUME_DEADLINE_S = 60.0  # after Redis is back, the sweep must have moved on by then
RETRIES = 2


@pytest.fixture
def own_farm(docker_env: Any) -> Iterator[Farm]:
    local = LocalFarm(2).start()
    farm = Farm(local.settings(), owned=local)
    try:
        yield farm
    finally:
        farm.close()


# --- sweeps ---------------------------------------------------------------------------------


def sweep_items(n: int) -> list[dict[str, Any]]:
    """One item in five is a multi-cell session item; each takes a little time to run."""
    items: list[dict[str, Any]] = []
    for i in range(n):
        if i % 5 == 0:
            cells = [f"x = {i}", "import time\ntime.sleep(0.05)", "x * 2"]
            items.append({"id": f"cells-{i}", "cells": cells})
        else:
            items.append({"id": f"code-{i}", "code": f"import time\ntime.sleep(0.05)\n{i} * 2"})
    return items


class BackgroundSweep:
    """A ``Sweep`` running in a thread, so the test can break the farm under it."""

    def __init__(self, farm: Farm, tmp_path: Path, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.source = tmp_path / "in.jsonl"
        self.source.write_text("".join(json.dumps(i) + "\n" for i in items))
        self.out = tmp_path / "out.jsonl"
        self.summary: SweepSummary | None = None
        self.error: BaseException | None = None
        self.sweep = Sweep(farm, concurrency=8, retries=RETRIES, timeout_s=30)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.summary = self.sweep.run(plan_sweep(self.source, self.out), self.out)
        except BaseException as exc:
            self.error = exc

    def start(self) -> BackgroundSweep:
        self.started_at = time.monotonic()
        self.thread.start()
        return self

    def lines(self) -> int:
        return len(self.out.read_text().splitlines()) if self.out.exists() else 0

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines()]

    def missing(self) -> list[str]:
        done = {str(r["id"]) for r in self.records()}
        return [str(i["id"]) for i in self.items if str(i["id"]) not in done]


def worker_states(farm: Farm) -> str:
    """What the registry says of each worker, and the last lines of each worker's log."""
    local = farm.local_farm
    states = [(w["id"], w.get("ready"), w.get("generation")) for w in farm.workers()]
    tails = []
    for log in sorted(local.dir.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        tails.append(f"== {log.name}\n" + "\n".join(line[:300] for line in lines[-15:]))
    return f"registry: {states}\n" + "\n".join(tails)


def where_stuck(thread: threading.Thread) -> str:
    """Where the sweep's thread waits, innermost farm frames first (for the report)."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "-"
    stack = traceback.extract_stack(frame)
    ours = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack if "/farm/" in f.filename]
    return " <- ".join(reversed(ours[-3:])) or "-"


def value_is_right(record_: dict[str, Any]) -> bool:
    n = int(str(record_["id"]).rsplit("-", 1)[1])
    value = (record_["cells"][-1] or {}).get("value") or {}
    return value.get("text") == str(n * 2)


def judge_records(records: list[dict[str, Any]]) -> list[str]:
    """Problems with the outcome of each record, per the retry rules."""
    problems = []
    for r in records:
        if r["status"] == "ok":
            if not value_is_right(r):
                problems.append(f"{r['id']}: wrong value")
        elif r["kind"] != "sandbox_lost" or r["attempts"] != RETRIES + 1:
            problems.append(f"{r['id']}: {r['kind']} after {r['attempts']} attempts")
    return problems


UNACKED = "unacked"  # kombu's hash of messages a worker took but had not acked (started)


@dataclass(frozen=True)
class Waiting:
    """A message that has not started: a session call (its ``exec_id``) or a map chunk (its
    ``chunk_id`` and its items' exec ids), and the queue it waits in or was taken from."""

    queue: str
    exec_ids: tuple[str, ...]
    chunk_id: str | None = None
    taken: bool = False  # held by a worker that took it (kombu's unacked hash)


def waiting_messages(redis: Any, queues: list[str], chunks: str | None = None) -> list[Waiting]:
    """The messages waiting in ``queues`` (kombu lists), those a worker took from them but had
    not started (kombu restores these after the visibility timeout), and the map chunks in list
    ``chunks`` (``chunks_key``: workers take a chunk when they have room, and claim it at once):
    with tasks acked when they start, these are what a worker killed now leaves behind."""
    found: list[Waiting] = []
    for queue in queues:
        for raw in redis.lrange(queue, 0, -1):
            found += parse_message(json.loads(raw), queue, taken=False)
    for raw in redis.hvals(UNACKED):
        message, _exchange, routing_key = json.loads(raw)
        if routing_key in queues:
            found += parse_message(message, routing_key, taken=True)
    if chunks is not None:
        for raw in redis.lrange(chunks, 0, -1):
            chunk = Chunk.model_validate_json(raw)
            ids = tuple(item.exec_id for item in chunk.items)
            found.append(Waiting(chunks, ids, chunk.chunk_id))
    return found


def parse_message(message: dict[str, Any], queue: str, taken: bool) -> list[Waiting]:
    """A session call (exec, command, file) in a kombu message, by its exec id."""
    body = json.loads(base64.b64decode(message["body"]))
    args = body[0] if body else []
    payload = args[0] if args and isinstance(args[0], dict) else {}
    if "exec_id" in payload:
        return [Waiting(queue, (str(payload["exec_id"]),), None, taken)]
    return []


class SentChunks:
    """Every chunk the farm's client queues (a pass-through spy on ``Broker.queue_chunk``):
    each item's exec ids, one per attempt (a chunk sent again keeps its items' exec ids)."""

    def __init__(self, farm: Farm, monkeypatch: pytest.MonkeyPatch) -> None:
        self.exec_ids: dict[tuple[str, ...], set[str]] = {}  # an item's cells -> its exec ids
        self._lock = threading.Lock()
        queue_chunk = farm.broker.queue_chunk

        def recording(queue: str, body: str) -> tuple[int, int]:
            with self._lock:
                for item in Chunk.model_validate_json(body).items:
                    self.exec_ids.setdefault(tuple(item.cells), set()).add(item.exec_id)
            return queue_chunk(queue, body)

        monkeypatch.setattr(farm.broker, "queue_chunk", recording)

    def of(self, item: dict[str, Any]) -> set[str]:
        with self._lock:
            return set(self.exec_ids.get(tuple(BatchItem.model_validate(item).all_cells()), ()))


def runs_problems(
    farm: Farm,
    sent: SentChunks,
    items: list[dict[str, Any]],
    records: list[dict[str, Any]],
    dead: tuple[str, int],
) -> list[str]:
    """Items that ran other than once, by the exec claims in Redis (a batch item's claim names
    the worker generation that took it, and stays ten minutes past its run): every attempt sent
    was claimed once; the one the item's record comes from was claimed by the worker the record
    names; every earlier attempt was claimed by the killed generation (why it was retried)."""
    by_id = {str(r["id"]): r for r in records}
    problems = []
    for item in items:
        exec_ids = sent.of(item)
        claims = {e: farm.registry.exec_record(e) for e in exec_ids}
        ran = {
            e: (str(c["worker"]), int(c["generation"]))
            for e, c in claims.items()
            if c is not None and c.get("state") == "running"
        }
        record_ = by_id.get(str(item["id"]))
        name = f"{item['id']} (attempts sent {len(exec_ids)}, claimed by {sorted(ran.values())})"
        if record_ is None or not record_["cells"]:
            problems.append(f"{name}: no record of a run")
            continue
        last = record_["cells"][-1]
        recorded = str(last["exec_id"])  # the attempt's exec id, "-N" for its Nth cell
        final = [e for e in ran if recorded == e or recorded.startswith(f"{e}-")]
        earlier = [ran[e] for e in ran if e not in final]
        if len(final) != 1 or ran[final[0]][0] != last["worker"]:
            problems.append(f"{name}: its record ({recorded} on {last['worker']}) is no run")
        if any(owner != dead for owner in earlier):
            problems.append(f"{name}: ran twice")
        if len(ran) != len(exec_ids) or len(exec_ids) != record_["attempts"]:
            problems.append(f"{name}: {record_['attempts']} attempts recorded")
    return problems


# --- the cases ------------------------------------------------------------------------------


def test_docker_kill_of_a_sandbox_mid_call_is_sandbox_lost_then_replaced(
    own_farm: Farm, docker_env: Any, record_property: Any
) -> None:
    victim = own_farm.session()
    worker = victim.worker
    neighbour = session_on(own_farm, worker)
    other_worker = next(w["id"] for w in own_farm.workers() if w["id"] != worker)
    elsewhere = session_on(own_farm, other_worker)
    for s in (victim, neighbour, elsewhere):
        s.run("kept = 'yes'")
    before = own_farm.registry.worker(worker) or {}
    container_id = before["sandbox"]["container_id"]
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def in_flight() -> None:
        try:
            stream = victim.stream("import time\ntime.sleep(60)", timeout_s=120)
            for event in stream:
                if isinstance(event, ExecStart):
                    started.set()  # the kernel runs it: the state under test
            outcome["result"] = stream.result
        except FarmError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=in_flight)
    thread.start()
    assert started.wait(60), "the call never started"
    killed_at = time.monotonic()
    docker_env.containers.get(container_id).kill()
    thread.join(60)
    lost_after = outcome.get("at", float("inf")) - killed_at

    def replaced() -> bool:
        entry = own_farm.registry.worker(worker) or {}
        sandbox = entry.get("sandbox") or {}
        return bool(entry.get("ready")) and sandbox.get("container_id") not in (None, container_id)

    replaced_in_time = wait_for(replaced, 30)
    fresh = session_on(own_farm, worker)
    fresh_value = fresh.run("6 * 7").value
    fresh.close()
    try:
        neighbour.run("kept")
        neighbour_fate = "kept (ran in a new sandbox?)"
    except SessionLost:
        neighbour_fate = "SessionLost"
    elsewhere_value = elsewhere.run("kept").value
    old_removed = wait_for(
        lambda: (
            not docker_env.containers.list(
                ignore_removed=True, all=True, filters={"id": container_id}
            )
        ),
        10,
    )
    entry = own_farm.registry.worker(worker) or {}
    error = outcome.get("error")
    observed = (
        f"run raised {type(error).__name__ if error else 'nothing'} after {lost_after:.2f}s; "
        f"replacement ready: {replaced_in_time} (restarts {entry.get('restarts')}), fresh "
        f"session value {fresh_value.text if fresh_value else None}; neighbour on the worker "
        f"{neighbour_fate}; session on the other worker "
        f"{elsewhere_value.text if elsewhere_value else None}; old container removed: "
        f"{old_removed}"
    )
    record(
        record_property,
        f"SessionLost within {LOST_WITHIN_S:g}s; replacement sandbox serves a fresh session; "
        "neighbours on that sandbox SessionLost; other worker unaffected; old container gone",
        observed,
    )
    assert isinstance(error, SessionLost) and lost_after < LOST_WITHIN_S, observed
    assert replaced_in_time and entry.get("restarts") == 1, observed
    assert fresh_value is not None and fresh_value.text == "42", observed
    assert neighbour_fate == "SessionLost", observed
    assert elsewhere_value is not None and elsewhere_value.text == "'yes'", observed
    assert old_removed, observed


def test_kill_9_of_a_worker_mid_sweep_loses_no_item_and_runs_nothing_stale(
    own_farm: Farm, tmp_path: Path, record_property: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = own_farm.local_farm
    redis = own_farm.registry.redis
    sent = SentChunks(own_farm, monkeypatch)
    sweep = BackgroundSweep(own_farm, tmp_path, sweep_items(500)).start()
    assert wait_for(lambda: sweep.lines() >= 100, 120), "the sweep made no progress"
    victim = sorted(local.workers)[0]
    entry = own_farm.registry.worker(victim) or {}
    dead_queue, dead = str(entry["queue"]), (victim, int(entry["generation"]))
    local.kill_worker(victim)
    killed_at = time.monotonic()
    # what had not started at the kill: calls in its own queue and those it had taken
    # (kombu gives these to another worker after the visibility timeout), chunks in their list
    queues, chunks_list = [dead_queue, ImageName("default").queue], chunks_key("farm.default")
    waiting = waiting_messages(redis, queues, chunks_list)
    at_kill = sweep.lines()
    rate = at_kill / (killed_at - sweep.started_at)
    deadline_s = max(SWEEP_DEADLINE_S, 2 * (500 - at_kill) / rate)
    local.wait_ready([local.add_worker()])
    replaced_after = time.monotonic() - killed_at
    left = deadline_s - (time.monotonic() - killed_at)
    timeline: list[int] = []  # lines written, sampled every 0.5 s after the replacement

    def ended() -> bool:
        timeline.append(sweep.lines())
        return not sweep.thread.is_alive()

    finished = wait_for(ended, max(left, 0.0), 0.5)
    took = time.monotonic() - killed_at
    stuck = "" if finished else f" stuck: {where_stuck(sweep.thread)};"
    records = sweep.records()
    ids = Counter(str(r["id"]) for r in records)
    twice = sorted(i for i, n in ids.items() if n > 1)
    missing = sweep.missing()
    problems = judge_records(records)
    retried = sum(1 for r in records if r["attempts"] > 1)
    # Calls left in the dead generation's own queue never run, even with a new worker up:
    # any wrongly subscribed worker would take them within seconds; watch that none does.
    calls = [e for w in waiting if w.chunk_id is None for e in w.exec_ids]
    stays(lambda: not any(own_farm.registry.exec_record(e) for e in calls), 3.0, 0.2)
    ran_calls = [e for e in calls if own_farm.registry.exec_record(e) is not None]
    # A chunk the client gave up on (abandoned: claimed for nobody, its items sent again
    # with the same exec ids) runs nothing when its copy reaches a worker: wait until every
    # such copy has left its list, then its claim must still be the abandonment, and each
    # item must have run once (the exec claims say by whom).
    chunks = {w.chunk_id: w for w in waiting if w.chunk_id is not None}
    abandoned = [
        c for c in chunks if (own_farm.registry.exec_record(c) or {}).get("state") == "abandoned"
    ]

    def copies_left() -> list[str]:
        now = waiting_messages(redis, queues, chunks_list)
        return [w.chunk_id for w in now if w.chunk_id in abandoned]

    delivered = wait_for(lambda: not copies_left(), max(0.0, killed_at + 90 - time.monotonic()))
    ran_stale = [
        c for c in abandoned if (own_farm.registry.exec_record(c) or {}).get("state") != "abandoned"
    ]
    ran_wrong = runs_problems(own_farm, sent, sweep.items, records, dead)
    observed = (
        f"{'finished' if finished else 'NOT finished'} {took:.0f}s after the kill "
        f"(deadline {deadline_s:.0f}s; error: {sweep.error!r});{stuck} {at_kill} lines at the "
        f"kill ({rate:.0f}/s before), "
        f"replaced in {replaced_after:.0f}s, then every 5 s: {timeline[::10]}; "
        f"{len(records)} lines, {len(ids)} ids, "
        f"twice: {twice[:5]}, "
        f"missing: {missing[:5]}{'...' if len(missing) > 5 else ''}; {retried} retried; "
        f"problems: {problems[:3]}; {len(calls)} calls left in the dead queue, "
        f"{len(ran_calls)} of them ran; {len(chunks)} chunks waiting at the kill, "
        f"{len(abandoned)} abandoned, their "
        f"copies {'delivered' if delivered else f'NOT delivered: {copies_left()}'}, "
        f"{len(ran_stale)} ran; items not run exactly once: {len(ran_wrong)} {ran_wrong[:3]}"
    )
    record(
        record_property,
        f"sweep finishes within {SWEEP_DEADLINE_S:g}s of the kill (idle machine; loaded: twice "
        "what the items left take at the rate before it); 500 ids exactly once; ok with right "
        f"values or sandbox_lost after {RETRIES + 1} attempts; the dead worker's queue never "
        "runs; chunks abandoned after the kill run nothing when delivered; by the exec claims "
        "each item ran once, on the worker its record names (any earlier attempt: the killed "
        "one's)",
        observed,
    )
    assert finished and sweep.error is None, observed
    assert not twice and not missing and len(records) == 500, observed
    assert not problems, observed
    assert not ran_calls and not ran_stale, observed
    assert delivered, observed
    assert not ran_wrong, observed


def restart_redis(local: LocalFarm, down_s: float) -> None:
    """Stop the farm's redis-server and start a new, empty one on the same port."""
    stop_redis(local, save=False)
    time.sleep(down_s)  # how long the outage lasts: a parameter of the scenario, not a wait
    start_redis(local)


def test_a_redis_restart_mid_sweep_resumes_or_fails_clearly(
    own_farm: Farm, tmp_path: Path, record_property: Any
) -> None:
    local = own_farm.local_farm
    sweep = BackgroundSweep(own_farm, tmp_path, sweep_items(300)).start()
    assert wait_for(lambda: sweep.lines() >= 80, 120), "the sweep made no progress"
    restart_redis(local, down_s=3.0)
    back_at = time.monotonic()
    moved_on = wait_for(lambda: not sweep.thread.is_alive(), RESUME_DEADLINE_S, 0.5)
    took = time.monotonic() - back_at
    stuck = sweep.missing() if not moved_on else []
    first = Counter(str(r["id"]) for r in sweep.records())
    # whatever happened, the workers come back and a resumed sweep finishes the rest
    workers_back = wait_for(
        lambda: len([w for w in own_farm.workers() if w.get("ready")]) == 2, 30, 0.5
    )
    resumed: SweepSummary | None = None
    resume_error = ""
    if moved_on:
        try:
            resumed = Sweep(own_farm, concurrency=8, retries=RETRIES, timeout_s=30).run(
                plan_sweep(sweep.source, sweep.out, resume=True), sweep.out
            )
        except Exception as exc:
            resume_error = f"{type(exc).__name__}: {exc}"
    final = Counter(str(r["id"]) for r in sweep.records())
    twice = sorted(i for i, n in final.items() if n > 1)
    if not moved_on:
        how = (
            f"STILL RUNNING {took:.0f}s after Redis came back, {len(stuck)} items stuck "
            f"(e.g. {stuck[:3]}) in {where_stuck(sweep.thread)}"
        )
    elif sweep.error is not None:
        kind = f"{type(sweep.error).__module__}.{type(sweep.error).__name__}"
        how = f"failed with {kind}: {sweep.error}"
    else:
        summary = sweep.summary
        how = f"ended ({summary.by_outcome if summary else '?'}"
        how += f"; stopped: {summary.stopped})" if summary and summary.stopped else ")"
    observed = (
        f"first run {how}; {len(first)} ids written; workers back: {workers_back}; resume: "
        f"{resumed.by_outcome if resumed else resume_error or 'not run'}; final {len(final)} "
        f"ids, twice: {twice[:5]}"
    )
    record(
        record_property,
        f"within {RESUME_DEADLINE_S:g}s of Redis returning the sweep completes or fails with a "
        "clear error; no id twice; a resumed sweep finishes every id exactly once",
        observed,
    )
    assert moved_on, observed
    assert sweep.error is None, observed  # an outage is a pause or a typed stop
    assert not twice, observed
    assert workers_back, f"{observed}\n{worker_states(own_farm)}"
    assert not resume_error, observed
    assert sorted(final) == sorted(str(i["id"]) for i in sweep.items), observed


def test_sigterm_lets_calls_in_flight_finish_then_deregisters(
    own_farm: Farm, docker_env: Any, record_property: Any
) -> None:
    local = own_farm.local_farm
    first = own_farm.session()
    worker = first.worker
    busy = [first] + [session_on(own_farm, worker) for _ in range(2)]
    idle = session_on(own_farm, worker)
    other = next(w["id"] for w in own_farm.workers() if w["id"] != worker)
    elsewhere = session_on(own_farm, other)
    elsewhere.run("kept = 'yes'")
    results: dict[int, str] = {}
    started = [threading.Event() for _ in busy]

    def call(i: int) -> None:
        try:
            stream = busy[i].stream(f"import time\ntime.sleep(2)\n'finished-{i}'", timeout_s=30)
            for event in stream:
                if isinstance(event, ExecStart):
                    started[i].set()  # the worker runs it: the state under test
            result = stream.result
            assert result is not None
            results[i] = result.value.text if result.value else repr(result.error)
        except FarmError as exc:
            results[i] = type(exc).__name__

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(busy))]
    for thread in threads:
        thread.start()
    assert all(event.wait(60) for event in started), "the calls never started"
    local.kill_worker(worker, signal.SIGTERM)
    t0 = time.monotonic()
    try:
        late = idle.run("'sent after SIGTERM'", timeout_s=10)
        late_outcome = f"ran: {late.value.text if late.value else late.error}"
    except SessionLost:
        late_outcome = "SessionLost"
    late_s = time.monotonic() - t0
    for thread in threads:
        thread.join(60)
    exit_code = local.workers[worker].wait(60)
    deregistered = worker not in {w["id"] for w in own_farm.workers()}
    containers = docker_env.containers.list(
        ignore_removed=True, all=True, filters={"label": f"farm.owner={worker}"}
    )
    elsewhere_value = elsewhere.run("kept").value
    fresh = own_farm.session()
    fresh_worker = fresh.worker
    fresh.close()
    expected_results = {i: f"'finished-{i}'" for i in range(len(busy))}
    observed = (
        f"in-flight results {dict(sorted(results.items()))}; a call sent after SIGTERM: "
        f"{late_outcome} after {late_s:.1f}s; worker exit code {exit_code}; deregistered: "
        f"{deregistered}; its containers left: {len(containers)}; other worker's session "
        f"{elsewhere_value.text if elsewhere_value else None}; new session on {fresh_worker}"
    )
    record(
        record_property,
        "every call in flight finishes with its value; later calls SessionLost within seconds; "
        "the worker exits 0, deregisters and removes its sandbox; the other worker serves",
        observed,
    )
    assert results == expected_results, observed
    assert late_outcome in ("SessionLost", "ran: 'sent after SIGTERM'") and late_s < 15, observed
    assert exit_code == 0 and deregistered and not containers, observed
    assert elsewhere_value is not None and elsewhere_value.text == "'yes'", observed
    assert fresh_worker == other, observed
