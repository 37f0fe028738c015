"""The worker's log line for each task that succeeded holds a repr of its result (Celery's);
farm's show the result's ids, never a cell's output. Real Redis and a real Celery worker in
this process over the ``process`` backend, its own: the line's level is read when the worker
builds its tracers. (A task message's headers: ``test_client.py``.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

SECRET = "sk-not-for-logs"


def test_the_workers_success_line_shows_a_results_ids_not_its_output(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.conftest import inproc_worker

    caplog.set_level(logging.INFO, logger="celery.app.trace")  # before the worker's tracers
    with inproc_worker(redis_server.url) as (farm, _), farm.session() as s:
        stream = s.stream(f"print('{SECRET}')")  # a task (a plain run takes the run lane)
        for _ in stream:
            pass
        command = s.exec(["echo", SECRET])
    result = stream.result
    assert result is not None and result.stdout == SECRET + "\n"
    assert command.stdout == SECRET + "\n"
    lines = [r.getMessage() for r in caplog.records if r.name == "celery.app.trace"]
    assert any("succeeded" in line and result.exec_id in line for line in lines), lines
    assert not any(SECRET in line for line in lines), lines
