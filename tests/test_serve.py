"""``farm serve``'s HTTP API: the real command over a real farm (Redis, Celery workers, Docker
sandboxes), called with httpx as any HTTP client would: each resource, the event stream, a map
and its cancel by disconnect, idempotent retries, tokens and owners, refused bodies."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.client import Farm
from farm.registry import PREFIX, Registry
from farm.serve.app import openapi_document
from farm.serve.tokens import TokenStore
from tests.certs import make_pki
from tests.serving import FARM, Server, farm_serve
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
DOCS = Path(__file__).parent.parent / "docs" / "openapi.json"


@pytest.fixture(scope="module")
def server(farm: Farm, tmp_path_factory: Any) -> Iterator[Server]:
    with farm_serve(farm.settings.redis_url, tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[httpx.Client]:
    with server.client(server.token("alice", "run")) as c:
        yield c


@pytest.fixture(scope="module")
def bob(server: Server) -> Iterator[httpx.Client]:
    with server.client(server.token("bob", "run")) as c:
        yield c


@pytest.fixture
def session(alice: httpx.Client) -> Iterator[str]:
    response = alice.post("/v1/sessions", json={"limits": {"memory_mb": 128}})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    yield session_id
    alice.delete(f"/v1/sessions/{session_id}")


def problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["kind"] == kind and body["title"]
    assert body["type"] == ("about:blank" if kind == "not_found" else f"/problems/{kind}")
    return body


def exec_records(farm: Farm) -> int:
    return sum(1 for _ in farm.registry.redis.scan_iter(f"{PREFIX}exec:*", count=1000))


def test_the_committed_openapi_document_is_the_apps() -> None:
    assert DOCS.read_text() == openapi_document(), (
        "regenerate: python -m farm.serve.app > docs/openapi.json"
    )


def test_no_token_or_a_wrong_one_gets_no_service(server: Server) -> None:
    with server.client(None) as anonymous:
        problem(anonymous.post("/v1/run", json={"code": "1"}), 401, "auth")
        problem(anonymous.get("/v1/sessions"), 401, "auth")
        problem(anonymous.post("/mcp", json={}), 401, "auth")
        problem(anonymous.get("/api/workers"), 401, "auth")  # the live page too
    with server.client("farm_0123456789ab_wrong") as wrong:
        problem(wrong.post("/v1/run", json={"code": "1"}), 401, "auth")


def test_a_run_token_cannot_do_admin_things(server: Server, alice: httpx.Client) -> None:
    problem(alice.get("/v1/workers"), 403, "forbidden")
    with server.client(server.admin) as admin:
        workers = admin.get("/v1/workers").json()
    assert len(workers) == 2 and all(w["image"] == "default" for w in workers)
    assert alice.get("/v1/images").json() == [
        {"name": "default", "workers": 2, "capacity": sum(w["capacity"] for w in workers)}
    ]


def test_a_session_keeps_its_variables_and_a_user_error_is_a_result(
    alice: httpx.Client, session: str
) -> None:
    first = alice.post(f"/v1/sessions/{session}/run", json={"code": "x = 20\nprint('hi')"})
    assert first.status_code == 200 and first.json()["stdout"] == "hi\n"
    second = alice.post(f"/v1/sessions/{session}/run", json={"code": "x + 22"}).json()
    assert second["status"] == "ok" and second["value"]["text"] == "42"
    failed = alice.post(f"/v1/sessions/{session}/run", json={"code": "1/0"})
    assert failed.status_code == 200
    assert failed.json()["error"]["ename"] == "ZeroDivisionError"
    assert failed.json()["error"]["kind"] == "user"
    listed = [s["id"] for s in alice.get("/v1/sessions").json()]
    assert session in listed
    assert alice.get(f"/v1/sessions/{session}").json()["image"] == "default"


def test_a_run_streams_its_events_then_its_result(alice: httpx.Client, session: str) -> None:
    code = "print('one')\ndisplay('shown')\n6 * 7"
    with alice.stream(
        "POST",
        f"/v1/sessions/{session}/run",
        json={"code": code},
        headers={"Accept": "text/event-stream"},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse(response.iter_lines()))
    kinds = [name for name, _ in events]
    assert kinds[0] == "exec_start" and kinds[-2:] == ["exec_end", "done"]
    assert {"stream", "display", "result"} <= set(kinds)
    start = events[0][1]
    assert start["code"] == code and start["session_id"] == session
    assert events[-1][1]["value"]["text"] == "42"  # the ExecResult, as the JSON route gives it


def sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    name, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("data:"):
            data += line.partition(":")[2].strip()
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def test_commands_and_files_of_any_size(alice: httpx.Client, session: str) -> None:
    base = f"/v1/sessions/{session}"
    done = alice.post(f"{base}/exec", json={"cmd": ["wc", "-c"], "input": "abc"}).json()
    assert done["returncode"] == 0 and done["stdout"].strip() == "3"
    shell = alice.post(f"{base}/exec", json={"cmd": "echo out; exit 3"}).json()
    assert (shell["returncode"], shell["stdout"]) == (3, "out\n")

    payload = os.urandom(9 * 1024 * 1024 + 123)  # three chunks and a bit, sent in pieces

    def pieces() -> Iterator[bytes]:
        for offset in range(0, len(payload), 1 << 20):
            yield payload[offset : offset + (1 << 20)]

    put = alice.put(f"{base}/files/data/blob.bin", content=pieces())
    assert put.status_code == 201 and put.json()["size"] == len(payload)
    with alice.stream("GET", f"{base}/files/data/blob.bin") as got:
        assert got.status_code == 200
        assert b"".join(got.iter_bytes()) == payload
    entries = alice.get(f"{base}/files", params={"path": "data"}).json()
    assert entries == [
        {"path": "data/blob.bin", "type": "file", "size": len(payload), "mode": entries[0]["mode"]}
    ]
    size = alice.post(f"{base}/run", json={"code": "import os; os.path.getsize('data/blob.bin')"})
    assert size.json()["value"]["text"] == str(len(payload))  # the code sees the same file
    assert alice.delete(f"{base}/files/data/blob.bin").status_code == 204
    problem(alice.get(f"{base}/files/data/blob.bin"), 404, "file")
    problem(alice.put(f"{base}/files/..%2F..%2Fetc%2Fx", content=b"no"), 400, "file")


def test_a_one_shot_run(alice: httpx.Client) -> None:
    result = alice.post("/v1/run", json={"code": "import os; os.getcwd()"}).json()
    assert result["status"] == "ok" and "/workspace" in result["value"]["text"]


def test_another_tokens_session_does_not_exist_for_it(
    alice: httpx.Client, bob: httpx.Client, session: str
) -> None:
    base = f"/v1/sessions/{session}"
    problem(bob.get(base), 404, "not_found")
    problem(bob.post(f"{base}/run", json={"code": "1"}), 404, "not_found")
    problem(bob.post(f"{base}/exec", json={"cmd": "id"}), 404, "not_found")
    problem(bob.get(f"{base}/files"), 404, "not_found")
    problem(bob.delete(base), 404, "not_found")
    assert session not in [s["id"] for s in bob.get("/v1/sessions").json()]
    assert alice.post(f"{base}/run", json={"code": "1"}).json()["status"] == "ok"  # still there


def test_a_retry_with_the_same_idempotency_key_runs_the_cell_once(
    alice: httpx.Client, session: str
) -> None:
    base = f"/v1/sessions/{session}"
    alice.post(f"{base}/run", json={"code": "n = 0"})
    key = {"Idempotency-Key": "cell-7"}
    first = alice.post(f"{base}/run", json={"code": "n += 1\nn"}, headers=key).json()
    again = alice.post(f"{base}/run", json={"code": "n += 1\nn"}, headers=key).json()
    assert first["value"]["text"] == again["value"]["text"] == "1"
    assert first["exec_id"] == again["exec_id"]
    assert alice.post(f"{base}/run", json={"code": "n"}).json()["value"]["text"] == "1"
    other = alice.post(f"{base}/run", json={"code": "n += 1\nn"}, headers={"Idempotency-Key": "8"})
    assert other.json()["value"]["text"] == "2"
    once = [alice.post("/v1/run", json={"code": "1"}, headers=key).json() for _ in range(2)]
    assert once[0]["exec_id"] == once[1]["exec_id"]


def test_bad_bodies_are_refused_before_any_worker_sees_them(
    farm: Farm, alice: httpx.Client, session: str
) -> None:
    before = exec_records(farm)
    huge = {"code": "x" * (17 * 1024 * 1024)}
    problem(alice.post("/v1/run", json=huge), 413, "input")
    problem(alice.post(f"/v1/sessions/{session}/run", json=huge), 413, "input")
    chunked = alice.post(
        "/v1/run", content=iter([b'{"code": "', b"1" * (17 * 1024 * 1024), b'"}'])
    )  # no Content-Length: counted as it comes
    problem(chunked, 413, "input")
    malformed = alice.post(
        "/v1/run", content=b'{"code": ', headers={"content-type": "application/json"}
    )
    problem(malformed, 400, "input")
    unknown = problem(
        alice.post("/v1/run", json={"code": "1", "network": ["pypi.org"]}), 422, "input"
    )
    assert unknown["errors"][0]["loc"] == ["body", "network"]
    problem(alice.post("/v1/sessions", json={"image": "default", "egress": "none"}), 422, "input")
    problem(alice.post(f"/v1/sessions/{session}/run", json={"cod": "1"}), 422, "input")
    assert exec_records(farm) == before  # nothing reached a worker


def test_a_map_streams_ndjson_records_as_items_finish(alice: httpx.Client) -> None:
    lines = [
        json.dumps("import time; time.sleep(3); 'slow'"),
        json.dumps({"id": "fast", "code": "'fast'"}),
        "not json",
        *[json.dumps(f"{i} * 2") for i in range(20)],
    ]
    with alice.stream(
        "POST",
        "/v1/map",
        params={"ordered": "false"},
        content="\n".join(lines).encode(),
        headers={"content-type": "application/x-ndjson"},
    ) as response:
        assert response.status_code == 200
        records = [json.loads(line) for line in response.iter_lines() if line]
    assert len(records) == len(lines)
    assert records[-1]["id"] == 0  # the slow one came last: records come as items finish
    by_id = {r["id"]: r for r in records}
    assert by_id["fast"]["cells"][0]["value"]["text"] == "'fast'"
    assert by_id[2]["kind"] == "input"  # the line that is not JSON
    assert by_id[13]["cells"][0]["value"]["text"] == str(10 * 2)


def test_leaving_a_map_cancels_it(farm: Farm, alice: httpx.Client) -> None:
    redis = farm.registry.redis
    items = ["1", *["import time; time.sleep(60)"] * 3]
    body = "\n".join(json.dumps(i) for i in items).encode()
    before = set(redis.scan_iter(f"{PREFIX}map:*:cancel"))
    with alice.stream("POST", "/v1/map", params={"ordered": "false"}, content=body) as response:
        first = json.loads(next(response.iter_lines()))
        assert first["id"] == 0
    # the client went away: the server closes the map, whose workers stop the running items
    cancels = wait_for(lambda: list(set(redis.scan_iter(f"{PREFIX}map:*:cancel")) - before), 15)
    assert cancels, "the map was not cancelled"
    map_id = cancels[0].split(":")[-2]
    local = farm.local_farm

    def stopped() -> int:  # what the workers' logs say they stopped of this map
        lines = [line for w in local.workers for line in local.log_tail(w, 400).splitlines()]
        found = [re.search(rf"map {map_id} cancelled on worker \S+: (\d+) items", x) for x in lines]
        return sum(int(m.group(1)) for m in found if m)

    # the three slow items were stopped, long before their 60 s
    assert wait_for(lambda: stopped() == len(items) - 1, 20), stopped()


def test_many_maps_streaming_at_once_stall_no_other_call(server: Server) -> None:
    """Each streaming map holds one of the server's threads into the farm for as long as it
    runs (so does an open waiting for room): a few more maps than asyncio's default threads
    (cores + 4) must not stall a session's open and run behind them."""
    maps = (os.cpu_count() or 1) + 4 + 4
    token = server.token("mapper", "run", concurrency=maps + 4)
    started = threading.Barrier(maps + 1)
    answers: list[int] = []

    def hold() -> None:  # a map whose one item runs for 20 s
        with (
            server.client(token) as client,
            client.stream(
                "POST",
                "/v1/map",
                params={"concurrency": 1},  # one slot of the token's each (a map holds its window)
                content=json.dumps("import time; time.sleep(20)").encode(),
            ) as response,
        ):
            answers.append(response.status_code)
            started.wait(30)
            for _ in response.iter_lines():
                pass

    holders = [threading.Thread(target=hold) for _ in range(maps)]
    for thread in holders:
        thread.start()
    try:
        started.wait(30)  # every map's response began: its thread in the server is held
        with server.client(token) as client:  # answered in seconds, not after the maps
            opened = client.post("/v1/sessions", json={}, timeout=15)
            assert opened.status_code == 201, opened.text
            run = client.post(
                f"/v1/sessions/{opened.json()['id']}/run", json={"code": "6 * 7"}, timeout=15
            )
            assert run.json()["value"]["text"] == "42", run.text
            client.delete(f"/v1/sessions/{opened.json()['id']}")
    finally:
        for thread in holders:
            thread.join(60)
    assert answers == [200] * maps


def test_maps_whose_bodies_come_slowly_never_deadlock_a_small_server(
    farm: Farm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map's thread waits for the items its body's reader hands over; a reader that took a
    thread to wait for room would deadlock a server whose threads the maps all hold. With 8
    threads, 10 maps whose lines come half a second apart all end, every record there."""
    monkeypatch.setenv("FARM_API_THREADS", "8")

    def slow_body() -> Iterator[bytes]:
        for n in range(3):
            time.sleep(0.5)  # the client's own pace: a body that arrives slowly
            yield (json.dumps({"id": n, "code": f"{n} * 2"}) + "\n").encode()

    with farm_serve(farm.settings.redis_url, tmp_path) as small:
        token = small.token("slow", "run", concurrency=64)
        records: list[list[dict[str, Any]]] = []

        def one_map() -> None:
            with (
                small.client(token) as client,
                client.stream(
                    "POST", "/v1/map", params={"concurrency": 1}, content=slow_body()
                ) as response,
            ):
                records.append([json.loads(line) for line in response.iter_lines() if line])

        maps = [threading.Thread(target=one_map) for _ in range(10)]
        for thread in maps:
            thread.start()
        for thread in maps:
            thread.join(90)
        assert not any(thread.is_alive() for thread in maps), "the server deadlocked"
    assert sorted(len(r) for r in records) == [3] * 10, records


def test_a_token_past_its_concurrency_cap_gets_429(server: Server) -> None:
    with server.client(server.token("carol", "run", concurrency=1)) as carol:
        session = carol.post("/v1/sessions", json={}).json()["id"]
        running = threading.Event()

        def slow() -> None:  # holds carol's one slot while its events stream
            with carol.stream(
                "POST",
                f"/v1/sessions/{session}/run",
                json={"code": "print('go', flush=True)\nimport time; time.sleep(4)"},
                headers={"Accept": "text/event-stream"},
            ) as response:
                for name, _ in sse(response.iter_lines()):
                    if name == "stream":
                        running.set()

        thread = threading.Thread(target=slow)
        thread.start()
        try:
            assert running.wait(30), "the first call did not start"
            busy = problem(carol.post("/v1/run", json={"code": "1"}), 429, "busy")
            assert "cap is 1" in busy["detail"] and busy["status"] == 429
        finally:
            thread.join(60)
        assert carol.post("/v1/run", json={"code": "1"}).status_code == 200  # room again
        carol.delete(f"/v1/sessions/{session}")


def test_a_revoked_token_is_refused(server: Server) -> None:
    presented = server.token("dave", "run")
    with server.client(presented) as dave:
        assert dave.get("/v1/sessions").status_code == 200
        listed = subprocess.run(
            [FARM, "token", "list"], env=server.env, capture_output=True, text=True, timeout=60
        )
        # the secret is URL-safe base64 and may itself hold "_": split at the first two only
        _, token_id, secret = presented.split("_", 2)
        assert "dave" in listed.stdout and secret not in listed.stdout
        revoked = subprocess.run(
            [FARM, "token", "revoke", token_id], env=server.env, capture_output=True, timeout=60
        )
        assert revoked.returncode == 0
        assert wait_for(lambda: dave.get("/v1/sessions").status_code == 401, 5)


def test_the_first_start_makes_a_token_prints_it_once_and_keeps_it(
    farm: Farm, tmp_path: Path
) -> None:
    # a database of the farm's Redis with no token in it: a farm of its own, as far as
    # tokens go (no worker is needed to be let in)
    fresh = farm.settings.redis_url.rsplit("/", 1)[0] + "/7"
    with farm_serve(fresh, tmp_path, admin=None) as first:
        state = json.loads((tmp_path / "serve.json").read_text())
        token = state["token"]
        assert (tmp_path / "serve.json").stat().st_mode & 0o777 == 0o600
        with first.client(token) as admin:
            assert admin.get("/v1/sessions").status_code == 200
            assert admin.get("/v1/workers").status_code == 200  # an admin token
    assert (tmp_path / "serve.log").read_text().count(token) == 1  # printed once
    redis = Registry(fresh).redis
    try:
        redis.flushdb()  # a fresh broker (--local makes one at every start)
        with farm_serve(fresh, tmp_path, admin=None) as again, again.client(token) as admin:
            assert admin.get("/v1/sessions").status_code == 200  # the kept token
        assert (tmp_path / "serve.log").read_text().count(token) == 1  # not printed again
    finally:
        redis.flushdb()
        redis.close()


def test_the_live_page_takes_an_admin_token_once_and_keeps_it_in_a_cookie(
    server: Server,
) -> None:
    with server.client(None) as browser:
        problem(browser.get("/api/workers"), 401, "auth")
        with server.client(server.token("viewer", "run")) as runner:
            problem(runner.get("/api/workers"), 403, "forbidden")  # the page is admin's
        entered = browser.get("/", params={"token": server.admin})
        assert entered.status_code == 303 and entered.headers["location"] == "/"
        assert "httponly" in entered.headers["set-cookie"].lower()
        page = browser.get("/")  # the cookie, not the URL, carries the token now
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert len(browser.get("/api/workers").json()) == 2
        problem(browser.get("/v1/no-such-route"), 404, "not_found")


def test_a_session_closed_elsewhere_is_gone_and_can_still_be_deleted(
    farm: Farm, alice: httpx.Client
) -> None:
    session = alice.post("/v1/sessions", json={}).json()["id"]
    farm.attach(session).close()  # closed by another client of the farm (or expired)
    problem(alice.post(f"/v1/sessions/{session}/run", json={"code": "1"}), 410, "sandbox_lost")
    problem(alice.get(f"/v1/sessions/{session}"), 410, "sandbox_lost")
    assert alice.delete(f"/v1/sessions/{session}").status_code == 204
    problem(alice.get(f"/v1/sessions/{session}"), 404, "not_found")  # forgotten


def test_tls_with_uvicorns_own_options(farm: Farm, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = [
        "--ssl-certfile",
        str(pki.server / "tls.crt"),
        "--ssl-keyfile",
        str(pki.server / "tls.key"),
    ]
    ca = ssl.create_default_context(cafile=str(pki.ca))
    with farm_serve(farm.settings.redis_url, tmp_path, *tls, verify=ca) as secure:
        assert secure.url.startswith("https://")
        with secure.client(secure.admin, verify=ca) as client:
            result = client.post("/v1/run", json={"code": "6 * 7"}).json()
        assert result["value"]["text"] == "42"
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA
            httpx.get(f"{secure.url}/healthz", timeout=5)
        state = json.loads((tmp_path / "serve.json").read_text())
        assert state["url"] == secure.url


def test_farm_token_finds_the_broker_of_a_local_farm_serve(farm: Farm, tmp_path: Path) -> None:
    # `farm serve --local N` records its broker in its state file; `farm token` uses it when
    # neither FARM_BROKER_URL nor `farm up` names a farm
    state = tmp_path / "serve.json"
    state.write_text(
        json.dumps({"url": "http://127.0.0.1:1", "broker_url": farm.settings.redis_url})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env |= {"FARM_SERVE_STATE_FILE": str(state), "FARM_STATE_FILE": str(tmp_path / "none.json")}
    made = subprocess.run(
        [FARM, "token", "create", "local-user"], env=env, capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    assert TokenStore(farm.registry.redis).verify(made.stdout.strip()) is not None
