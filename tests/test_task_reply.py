"""A cell's Celery result, stored and published by the worker's end-of-call script
(``farm.worker.task_reply``), on a real Redis and a real in-process Celery worker: the caller
gets it as from Celery, Celery stores it no second time, and what never reaches the script
(a malformed request) is still stored by Celery."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from celery.app.task import Context

from farm.celeryconf import TASK_EXEC
from farm.client import Farm
from farm.client.broker import release


def setex_calls(farm: Farm) -> int:
    """How many SETEXs Redis ran so far (Celery's own store of a result is one)."""
    stats: Any = farm.registry.redis.info("commandstats")
    return int(stats.get("cmdstat_setex", {}).get("calls", 0))


def test_a_cells_result_comes_from_the_finish_script_not_from_celery(inproc_farm: Farm) -> None:
    with inproc_farm.session() as session:
        session.run("x = 41")
        before = setex_calls(inproc_farm)
        results = [session.run("x + 1") for _ in range(5)]
        assert [r.value.text if r.value else None for r in results] == ["42"] * 5
        assert setex_calls(inproc_farm) == before  # Celery stored none of them again
        # the stored result reads back through Celery's own backend, as Celery wrote it
        wire = session.exec_request("x + 2").model_dump(mode="json")
        pending = inproc_farm.app.send_task(TASK_EXEC, args=[wire], queue=session.queue)
        reply = pending.get(timeout=60)
        meta = inproc_farm.app.backend.get_task_meta(pending.id, cache=False)
        assert meta["status"] == "SUCCESS" and meta["task_id"] == pending.id
        assert meta["result"] == reply and reply["value"]["text"] == "43"
        # the very fields Celery's own store would write (the date apart)
        backend = inproc_farm.app.backend
        raw = json.loads(inproc_farm.registry.redis.get(backend.get_key_for_task(pending.id)))
        celerys = backend._get_result_meta(reply, "SUCCESS", None, Context({"id": pending.id}))
        assert datetime.fromisoformat(raw.pop("date_done")).tzinfo is not None
        del celerys["date_done"]
        assert raw == {**celerys, "task_id": pending.id}
        assert inproc_farm.registry.exec_record(wire["exec_id"]) == {
            "state": "done",
            "result": reply,
        }
        pending.forget()
        release(pending)


def test_a_request_the_script_never_sees_is_stored_by_celery(inproc_farm: Farm) -> None:
    with inproc_farm.session() as session:
        before = setex_calls(inproc_farm)
        bad = {"session_id": session.id, "code": 1}  # malformed: refused before any claim
        pending = inproc_farm.app.send_task(TASK_EXEC, args=[bad], queue=session.queue)
        reply = pending.get(timeout=60)
        pending.forget()
        release(pending)
        assert reply["error"]["kind"] == "input"
        assert setex_calls(inproc_farm) == before + 1


def test_a_branch_ops_answer_epoch_and_event_come_from_one_script(inproc_farm: Farm) -> None:
    with inproc_farm.session() as session:
        session.run("x = 1")
        before = setex_calls(inproc_farm)
        cp = session.checkpoint()
        session.run("x = 2")
        session.rollback(cp)
        assert setex_calls(inproc_farm) == before  # Celery stored neither answer
        assert session.run("x").value.text == "1"  # type: ignore[union-attr]
        entry = inproc_farm.registry.session(session.id)
        assert entry is not None and int(entry["epoch"]) == cp.epoch + 1
        ops = [e.op for e in inproc_farm.journal.events(session.id) if e.type == "branch"]
        assert ops == ["checkpoint", "rollback"]
