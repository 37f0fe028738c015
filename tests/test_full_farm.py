"""A farm whose boxes are few (one worker, four boxes: Docker, Redis, Celery): a map and
sessions past its room wait and none fails; held full past callers' patience, it says busy
on every front (``FarmBusy``, HTTP 503, an MCP tool error). Design: docs/design/admission.md."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.errors import FarmBusy
from farm.local.embedded import LocalFarm
from tests.serving import FARM, farm_serve

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def four_boxes() -> Iterator[Farm]:
    """One worker whose sandbox holds four boxes (512 MB of disks, 128 MB each)."""
    local = LocalFarm(1, env={"FARM_SANDBOX_DISK_MB": "512"}).start()
    with Farm(local.settings(), owned=local) as farm:
        yield farm


def test_a_map_and_sessions_past_the_farms_room_wait_and_none_fails(four_boxes: Farm) -> None:
    farm = four_boxes
    (worker,) = farm.workers()
    assert worker["capacity"] == 4 and worker["kernel"]["binding"] == "disk_mb", worker
    peak = [0]
    stop = threading.Event()

    def watch() -> None:  # what the kernel admitted, as the worker reports it each second
        while not stop.wait(0.2):
            entry = farm.registry.worker(str(worker["id"])) or {}
            peak[0] = max(peak[0], int((entry.get("kernel") or {}).get("admitted", 0)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    sessions: list[Any] = []
    errors: list[BaseException] = []

    def agent(n: int) -> None:
        try:
            with farm.session(open_wait_s=120) as session:
                session.run(f"x = {n}")
                result = session.run("x * 2")
                sessions.append((n, result.value.text if result.value else None, session.queue_s))
        except BaseException as exc:
            errors.append(exc)

    agents = [threading.Thread(target=agent, args=(n,)) for n in range(6)]
    for thread in agents:
        thread.start()
    code = "import time; time.sleep(0.05); {n} * 2"
    records = list(farm.map([code.format(n=n) for n in range(60)], concurrency=64))
    for thread in agents:
        thread.join(120)
    stop.set()
    watcher.join()
    assert [r.kind for r in records if not r.ok] == [], [r.message for r in records if not r.ok]
    assert [r.cells[-1].value.text for r in records] == [str(2 * n) for n in range(60)]  # type: ignore[union-attr]
    assert all(r.attempts == 1 for r in records)
    assert errors == [] and sorted((n, v) for n, v, _ in sessions) == [
        (n, str(2 * n)) for n in range(6)
    ]
    assert max(r.queue_s for r in records) > 0  # 60 items and 6 sessions in 4 boxes: some wait
    kernel = farm.registry.worker(str(worker["id"]))["kernel"]  # type: ignore[index]
    assert kernel["refused"] == 0 and peak[0] <= 4, (kernel, peak)


def test_a_farm_full_past_the_wait_says_busy_on_every_front(
    four_boxes: Farm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every box held by a session for longer than callers wait (``open_wait_s``): a session
    open raises ``FarmBusy``, a one-shot run too (nothing ran), ``farm serve`` answers 503
    ``busy`` with ``Retry-After``, and ``farm mcp`` returns a tool error that says so. A box
    freed then opens at once."""
    monkeypatch.setenv("FARM_OPEN_WAIT_S", "2")  # for the processes started below too
    held = [four_boxes.session() for _ in range(4)]
    try:
        with Farm(four_boxes.settings.model_copy(update={"open_wait_s": 2})) as impatient:
            started = time.monotonic()
            with pytest.raises(FarmBusy, match="full") as busy:
                impatient.session()
            assert 2 <= time.monotonic() - started < 20, busy.value
            assert "4 of 4 boxes in use" in str(busy.value), busy.value
            with pytest.raises(FarmBusy, match="nothing ran"):
                impatient.run("1 + 1")
        with farm_serve(four_boxes.settings.redis_url, tmp_path) as server:
            with server.client(server.token("agent", "run")) as http:
                answer = http.post("/v1/sessions", json={})
            assert answer.status_code == 503, answer.text
            assert answer.json()["kind"] == "busy" and answer.headers["Retry-After"], answer.text
        tool = asyncio.run(
            mcp_run_python({**os.environ, "FARM_BROKER_URL": server.env["FARM_BROKER_URL"]})
        )
        assert tool.isError and "full" in str(tool.content), tool
    finally:
        for session in held[1:]:
            session.close()
    with four_boxes.session() as again:  # room came back: no wait for it
        assert again.run("6 * 7").value.text == "42"  # type: ignore[union-attr]
        assert again.queue_s < 2, again.queue_s
    held[0].close()


async def mcp_run_python(env: dict[str, str]) -> Any:
    """``run_python`` through ``farm mcp`` (stdio, the ``mcp`` SDK's client): its result."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=FARM, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await session.call_tool("run_python", {"code": "1 + 1"})
