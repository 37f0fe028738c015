"""The Judge0-compatible API of ``farm serve`` (``/judge0``), driven by the official ``judge0``
Python package from PyPI against a real ``farm serve`` over a real local farm of the judge
image: a round trip with test cases, then Judge0's own fields, statuses and refusals, its
compiler options, arguments, additional files and callbacks, and submissions that outlive a
server and are shared by the servers of one farm (several ``farm serve`` over one Redis)."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import queue
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import judge0
import pytest
import redis

from farm.client import Farm
from farm.serve.judge0_store import KEYS
from farm.settings import FarmSettings
from tests.judge_problems import SUM
from tests.serving import Server, farm_serve
from tests.waiting import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def local_farm(docker_env: Any) -> Iterator[Farm]:
    from farm.sandbox.catalog import build_image

    build_image("judge", client=docker_env)
    with Farm.local(images={"judge": 1}) as farm:
        yield farm


@pytest.fixture(scope="module")
def server(local_farm: Farm, tmp_path_factory: Any) -> Iterator[Server]:
    with farm_serve(local_farm.settings.redis_url, tmp_path_factory.mktemp("serve")) as served:
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


ARGV_C = r"""#include <stdio.h>
int main(int argc, char **argv) {
    printf("%d", VALUE);
    for (int i = 1; i < argc; i++) printf(" [%s]", argv[i]);
    printf("\n");
    return 0;
}
"""


def test_compiler_options_and_arguments_reach_the_compiler_and_the_program(
    client: judge0.Client,
) -> None:
    """Judge0's ``compiler_options`` go to the compiler and ``command_line_arguments`` to the
    program, split as a shell splits words but never read by one; a build is cached by its
    options (the same source with other options is compiled again)."""
    arguments = "'a b' ';' '$(id)' `x`"
    first = judge0.run(
        client=client,
        source_code=ARGV_C,
        language=50,
        compiler_options="-DVALUE=42 -Wall",
        command_line_arguments=arguments,
    )
    assert first.status == judge0.Status.ACCEPTED, first
    assert first.stdout == "42 [a b] [;] [$(id)] [`x`]\n"
    again = judge0.run(client=client, source_code=ARGV_C, language=50, compiler_options="-DVALUE=7")
    assert again.stdout == "7\n"
    bare = judge0.run(client=client, source_code=ARGV_C, language=50)
    assert bare.status == judge0.Status.COMPILATION_ERROR
    python = judge0.run(
        client=client,
        source_code="import sys\nprint(sys.argv[1:])\n",
        language=71,
        command_line_arguments='-x "two words"',
    )
    assert python.stdout == "['-x', 'two words']\n"


def test_bad_options_are_refused_and_nothing_is_kept(server: Server, token: str) -> None:
    python = {"source_code": "print(1)\n", "language_id": 71}
    with http(server, token) as api:
        for body, words in [
            ({**python, "compiler_options": "-O2"}, "only allowed for compiled languages"),
            ({**python, "command_line_arguments": "'open"}, "No closing quotation"),
            ({**python, "command_line_arguments": "x" * 513}, "over 512 characters"),
            ({**python, "callback_url": "file:///etc/passwd"}, "http:// or https://"),
        ]:
            refused = api.post("/submissions", json=body)
            assert refused.status_code == 422 and words in refused.text, refused.text
        done = api.post("/submissions", params={"wait": "true"}, json=python)
        assert done.status_code == 201 and done.json()["stdout"] == "1\n"
        config = api.get("/config_info").json()
        assert config["enable_compiler_options"] and config["enable_command_line_arguments"]
        allowed = config["allowed_languages_for_compile_options"]
        assert "C (GCC)" in allowed and "Python (3)" not in allowed


def zipped(files: dict[str, bytes], link: str | None = None) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        if link is not None:
            info = zipfile.ZipInfo(link)
            info.external_attr = 0o120777 << 16  # a symbolic link
            archive.writestr(info, "/etc/passwd")
    return base64.b64encode(buffer.getvalue()).decode()


READ_DATA = (
    "import os\n"
    "more = open('sub/more.txt').read() if os.path.isdir('sub') else '-'\n"
    "print(open('data.txt').read().strip(), more)\n"
)


def test_additional_files_are_in_the_programs_directory(client: judge0.Client) -> None:
    """``additional_files`` (a zip) unpacks where the program runs, directories too; the
    same source with other files gets its own files (the compile cache keeps them apart)."""
    for word, more in [("first", {}), ("second", {}), ("third", {"sub/more.txt": "deep"})]:
        files = [judge0.File(name="data.txt", content=word)]
        files += [judge0.File(name=name, content=text) for name, text in more.items()]
        done = judge0.run(
            client=client,
            source_code=READ_DATA,
            language=71,
            additional_files=judge0.Filesystem(content=files),
        )
        assert done.status == judge0.Status.ACCEPTED, (done.message, done.stderr)
        assert done.stdout == f"{word} {more.get('sub/more.txt', '-')}\n"


def test_bad_additional_files_are_refused(server: Server, token: str) -> None:
    body = {"source_code": READ_DATA, "language_id": 71}
    bomb = zipped({"zeros.txt": b"0" * (11 << 20)})  # 11 MB of text, ~11 kB zipped
    assert len(bomb) < 100_000
    with http(server, token) as api:
        for files, words in [
            (zipped({"../escape.txt": b"x"}), "not a path inside the directory"),
            (zipped({"/etc/x.txt": b"x"}), "not a path inside the directory"),
            (zipped({"ok.txt": b"x"}, link="data.txt"), "is a symbolic link"),
            (zipped({"data.bin": b"\xff\xfe\x00"}), "is not UTF-8 text"),
            (zipped({f"f{n}.txt": b"x" for n in range(257)}), "over 256"),
            (bomb, "unpacks to over 10485760 bytes"),
            ("bm90IGEgemlw", "not a zip archive"),
            ("%%%", "not base64"),
        ]:
            refused = api.post("/submissions", json={**body, "additional_files": files})
            assert refused.status_code == 422 and words in refused.text, refused.text
        good = zipped({"data.txt": b"kept", "sub/more.txt": b"too"})
        done = api.post(
            "/submissions", params={"wait": "true"}, json={**body, "additional_files": good}
        )
        assert done.json()["stdout"] == "kept too\n", done.text


@contextlib.contextmanager
def receiver(answers: list[int]) -> Iterator[tuple[str, queue.Queue[dict[str, Any]]]]:
    """A real HTTP server on a free local port that answers each request with the next of
    ``answers`` (then 200) and hands over what it got."""
    got: queue.Queue[dict[str, Any]] = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = answers.pop(0) if answers else 200
            got.put(
                {
                    "method": self.command,
                    "type": self.headers["Content-Type"],
                    "body": json.loads(body),
                    "answered": status,
                }
            )
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http_server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http_server.server_port}/judged", got
    finally:
        http_server.shutdown()
        http_server.server_close()
        thread.join(timeout=10)


def test_a_callback_gets_the_result_and_is_tried_again(server: Server, token: str) -> None:
    """Judge0's callback: a PUT of the finished submission (base64, the default fields) to
    ``callback_url``; a receiver that fails first (a 500) gets it again."""
    with receiver([500]) as (url, got), http(server, token) as api:
        body = {**dict(source_code=SUM["python3"]["AC"], language_id=71), "stdin": "1 2"}
        made = api.post("/submissions", json={**body, "callback_url": url})
        assert made.status_code == 201, made.text
        first, second = got.get(timeout=120), got.get(timeout=60)
        assert [first["answered"], second["answered"]] == [500, 200]
        assert first["body"] == second["body"]
        assert second["method"] == "PUT" and second["type"] == "application/json"
        said = second["body"]
        assert said["token"] == made.json()["token"]
        assert said["status"] == {"id": 3, "description": "Accepted"}
        assert base64.b64decode(said["stdout"]) == b"3\n"
        assert set(said) == {
            "token",
            "time",
            "memory",
            "stdout",
            "stderr",
            "compile_output",
            "message",
            "status",
        }
        assert got.empty()
        assert api.get("/config_info").json()["enable_callbacks"] is True


def test_submissions_outlive_their_server_and_are_shared(
    server: Server, token: str, local_farm: Farm, tmp_path: Path
) -> None:
    """Two ``farm serve`` over one farm see each other's submissions; one made on a server
    that then stops is still there, judged, on the next."""
    body = {"source_code": SUM["python3"]["AC"], "language_id": 71, "stdin": "2 2"}
    (tmp_path / "a").mkdir()
    with (
        farm_serve(local_farm.settings.redis_url, tmp_path / "a") as other,
        http(other, token) as api,
    ):
        judged = api.post("/submissions", params={"wait": "true"}, json=body).json()
        queued = api.post("/submissions/batch", json={"submissions": [body] * 3}).json()
    assert other.proc.poll() is not None  # it stopped
    with redis.Redis.from_url(local_farm.settings.redis_url) as broker:
        kept_s = broker.ttl(f"{KEYS}sub:{judged['token']}")
        assert 0 < kept_s <= FarmSettings().judge0_ttl_s  # kept, for a while only
    with http(server, token) as api:
        again = api.get(f"/submissions/{judged['token']}").json()
        assert again == judged and judged["stdout"] == "4\n"
        keys = ",".join(entry["token"] for entry in queued)

        def ended() -> list[dict[str, Any]] | None:
            found = api.get("/submissions/batch", params={"tokens": keys}).json()
            done = [s for s in found["submissions"] if s["status"]["id"] > 2]
            return done if len(done) == 3 else None

        finished = wait_for(ended, 120, 0.2)
        assert finished and all(s["stdout"] == "4\n" for s in finished)


def test_a_submission_whose_server_dies_is_judged_by_another(
    server: Server, token: str, local_farm: Farm, tmp_path: Path
) -> None:
    """A server killed while it judges a submission (``wait=true``: its own to judge):
    another server queues it again once its heartbeat stops, and judges it; it never stays
    Processing."""
    spin = {"source_code": SUM["python3"]["TLE"], "language_id": 71, "cpu_time_limit": 3}
    broker = redis.Redis.from_url(local_farm.settings.redis_url, decode_responses=True)
    (tmp_path / "b").mkdir()
    with broker, farm_serve(local_farm.settings.redis_url, tmp_path / "b") as doomed:
        threading.Thread(target=_wait_on, args=(doomed, token, spin), daemon=True).start()

        def held() -> str | None:  # the token of what the doomed server judges
            for key in broker.scan_iter(f"{KEYS}claimed:*"):
                for element in broker.lrange(key, 0, -1):
                    return str(element)
            return None

        made = wait_for(held, 60, 0.05)
        assert made, "the doomed server claimed nothing"
        with http(server, token) as api:

            def processing() -> bool:
                return bool(api.get(f"/submissions/{made}").json()["status"]["id"] == 2)

            assert wait_for(processing, 60, 0.05)
        doomed.proc.kill()
        doomed.proc.wait(timeout=30)
    with http(server, token) as api:
        assert api.get(f"/submissions/{made}").json()["status"]["id"] == 2  # cut off

        def ended() -> dict[str, Any] | None:
            found: dict[str, Any] = api.get(f"/submissions/{made}").json()
            return found if found["status"]["id"] > 2 else None

        finished = wait_for(ended, 120, 0.2)
        assert finished and finished["status"]["id"] == 5, finished


def _wait_on(served: Server, token: str, body: dict[str, Any]) -> None:
    """A ``wait=true`` submission to ``served``, which may die before it answers."""
    with contextlib.suppress(httpx.HTTPError), http(served, token) as api:
        api.post("/submissions", params={"wait": "true"}, json=body)


def test_a_judge_items_words_are_checked() -> None:
    """``compile_options`` and ``args`` are a judge item's argv words: a NUL, too many, or
    on an item that is not judged are refused when the item is read."""
    from pydantic import ValidationError

    from farm.models.batch import BatchItem

    item = {"id": 1, "language": "c", "source": "int main(){}", "tests": [{"expected": ""}]}
    assert BatchItem.model_validate({**item, "args": ["a b", ";"]}).args == ["a b", ";"]
    for bad, words in [
        ({**item, "args": ["a\0b"]}, "NUL"),
        ({**item, "compile_options": ["-O0"] * 65}, "at most 64 words"),
        ({"id": 2, "code": "print(1)", "args": ["x"]}, "are a judge item's"),
    ]:
        with pytest.raises(ValidationError, match=words):
            BatchItem.model_validate(bad)
