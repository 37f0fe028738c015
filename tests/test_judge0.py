"""The Judge0-compatible API of ``farm serve`` (``/judge0``), driven by the official ``judge0``
Python package from PyPI against a real ``farm serve`` over a real local farm of the judge
image: a round trip with test cases, then Judge0's own fields, statuses and refusals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import judge0
import pytest

from farm.client import Farm
from tests.judge_problems import SUM
from tests.serving import Server, farm_serve
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(docker_env: Any, tmp_path_factory: Any) -> Iterator[Server]:
    from farm.sandbox.catalog import build_image

    build_image("judge", client=docker_env)
    with (
        Farm.local(images={"judge": 1}) as farm,
        farm_serve(farm.settings.redis_url, tmp_path_factory.mktemp("serve")) as served,
    ):
        yield served


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    return server.token("judge0-user", "run")


@pytest.fixture(scope="module")
def client(server: Server, token: str) -> judge0.Client:
    return judge0.Client(f"{server.url}/judge0", headers={"X-Auth-Token": token})


def test_the_judge0_client_runs_test_cases(client: judge0.Client) -> None:
    source = SUM["python3"]["AC"]
    cases = [("1 2", "3"), ("2 2", "5")]
    done = judge0.run(client=client, source_code=source, language=judge0.PYTHON, test_cases=cases)
    assert [s.status for s in done] == [judge0.Status.ACCEPTED, judge0.Status.WRONG_ANSWER]
    assert [s.stdout for s in done] == ["3\n", "4\n"]
    assert all(s.time is not None and s.time > 0 and s.memory for s in done)


def test_the_judge0_client_sees_compile_errors(client: judge0.Client) -> None:
    done = judge0.run(client=client, source_code=SUM["cpp17"]["CE"], language=judge0.CPP)
    assert done.status == judge0.Status.COMPILATION_ERROR
    assert "not declared" in (done.compile_output or "")


def http(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{server.url}/judge0", headers={"X-Auth-Token": token}, timeout=120
    )


def test_a_waited_submission_answers_with_judge0s_fields(server: Server, token: str) -> None:
    body = {"source_code": SUM["c"]["RE"], "language_id": 50, "stdin": "1 2"}
    with http(server, token) as api:
        answer = api.post("/submissions", params={"wait": "true", "fields": "*"}, json=body)
        assert answer.status_code == 201, answer.text
        result = answer.json()
        assert result["status"] == {"id": 11, "description": "Runtime Error (NZEC)"}
        assert result["exit_code"] == 3 and result["language"]["id"] == 50
        again = api.get(f"/submissions/{result['token']}", params={"fields": "status,exit_code"})
        assert again.json() == {"status": result["status"], "exit_code": 3}
        statuses = api.get("/statuses").json()
        assert {"id": 5, "description": "Time Limit Exceeded"} in statuses
        assert api.get("/about").json()["version"] == "1.13.1"


def test_submissions_belong_to_their_token(server: Server, token: str) -> None:
    body = {"source_code": SUM["python3"]["AC"], "language_id": 71, "stdin": "1 2"}
    with http(server, token) as api:
        created = api.post("/submissions", json=body).json()["token"]
    with http(server, server.token("judge0-other", "run")) as other:
        assert other.get(f"/submissions/{created}").status_code == 404
    with httpx.Client(base_url=f"{server.url}/judge0") as anonymous:
        assert anonymous.get("/languages").status_code == 401
    with http(server, token) as api:
        refused = api.post("/submissions", json={**body, "language_id": 999})
        assert refused.status_code == 422


def test_a_finished_submission_can_be_deleted_by_its_token_only(server: Server, token: str) -> None:
    """Judge0's DELETE: a finished submission comes back once and is gone; one still queued
    or running is refused and kept, and another token's is not found."""
    spin = {"source_code": SUM["python3"]["TLE"], "language_id": 71, "cpu_time_limit": 2}
    with http(server, token) as api:
        running = api.post("/submissions", json=spin).json()["token"]
        refused = api.delete(f"/submissions/{running}")  # at least 2 s of CPU before its end
        assert refused.status_code == 400 and "still queued or running" in refused.text
        body = {"source_code": SUM["python3"]["AC"], "language_id": 71, "stdin": "1 2"}
        done = api.post("/submissions", params={"wait": "true"}, json=body).json()["token"]
        with http(server, server.token("judge0-deleter", "run")) as other:
            assert other.delete(f"/submissions/{done}").status_code == 404
        deleted = api.delete(f"/submissions/{done}", params={"fields": "token,status"})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"token": done, "status": {"id": 3, "description": "Accepted"}}
        assert api.get(f"/submissions/{done}").status_code == 404
        assert api.delete(f"/submissions/{done}").status_code == 404
        # the refused one was kept, and is deleted once its verdict is in
        ended = wait_for(lambda: api.get(f"/submissions/{running}").json()["status"]["id"] > 2, 120)
        assert ended and api.delete(f"/submissions/{running}").status_code == 200
        assert api.get("/config_info").json()["enable_submission_delete"] is True
