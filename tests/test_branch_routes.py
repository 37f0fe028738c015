"""The HTTP routes of checkpoints and forks (``farm serve`` over a real farm, with httpx):
a rollback over HTTP, a fork whose sessions are the caller's and no one else's, refusals as
problem documents."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from farm.client import Farm
from tests.serving import Server, farm_serve
from tests.test_serve import problem

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(farm: Farm, tmp_path_factory: Any) -> Iterator[Server]:
    with farm_serve(farm.settings.redis_url, tmp_path_factory.mktemp("serve")) as s:
        yield s


def run(client: httpx.Client, session_id: str, code: str) -> Any:
    response = client.post(f"/v1/sessions/{session_id}/run", json={"code": code})
    assert response.status_code == 200, response.text
    return response.json()["value"]["text"] if response.json()["value"] else None


def test_checkpoint_rollback_and_fork_over_http(server: Server) -> None:
    with (
        server.client(server.token("carol", "run")) as carol,
        server.client(server.token("dave", "run")) as dave,
    ):
        opened = carol.post("/v1/sessions", json={})
        assert opened.status_code == 201, opened.text
        sid = opened.json()["id"]
        run(carol, sid, "x = 1")
        cp = carol.post(f"/v1/sessions/{sid}/checkpoint")
        assert cp.status_code == 201, cp.text
        run(carol, sid, "x = 2")
        back = carol.post(f"/v1/sessions/{sid}/rollback", json={"checkpoint_id": cp.json()["id"]})
        assert back.status_code == 200, back.text
        assert run(carol, sid, "x") == "1"
        cp_id = cp.json()["id"]
        for _ in range(2):  # a run from the checkpoint: rolled back first, each time
            again = {"code": "x += 10\nx", "rollback_to": cp_id}
            ran = carol.post(f"/v1/sessions/{sid}/run", json=again)
            assert ran.status_code == 200 and ran.json()["value"]["text"] == "11", ran.text
        assert run(carol, sid, "x") == "11"
        missing = carol.post(f"/v1/sessions/{sid}/rollback", json={"checkpoint_id": "nope"})
        problem(missing, 404, "unknown_checkpoint")
        forked = carol.post(f"/v1/sessions/{sid}/fork", json={"n": 2})
        assert forked.status_code == 201, forked.text
        forks = [s["id"] for s in forked.json()["sessions"]]
        assert len(forks) == 2 and [run(carol, f, "x") for f in forks] == ["11", "11"]
        problem(dave.post(f"/v1/sessions/{forks[0]}/run", json={"code": "x"}), 404, "not_found")
        gone = carol.delete(f"/v1/sessions/{sid}/checkpoints/{cp.json()['id']}")
        assert gone.status_code == 204
        for f in [sid, *forks]:
            assert carol.delete(f"/v1/sessions/{f}").status_code == 204
