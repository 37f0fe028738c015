"""The control plane: whoever can write to the broker can run code in every sandbox, so no broker
farm starts accepts anonymous clients, its secret shows in no command line, log or message, a
client the broker refuses gets ``BrokerAuthFailed`` at once (not an outage's wait), and a farm
works end to end over TLS (``rediss://``, a CA made here with openssl, Debian's redis-server in
TLS-only mode). Real redis-server and Celery worker processes (``farm up``, ``LocalFarm``)
over the ``process`` backend: no Docker needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from farm.celeryconf import TASK_RUN
from farm.cli.diagnose import broker_checks
from farm.client import Farm
from farm.client.broker import release
from farm.errors import BrokerAuthFailed, BrokerUnavailable, InvalidRequest
from farm.local.embedded import LocalFarm
from farm.local.redis_server import RedisServer, ServerTLS, free_port
from farm.models import RunRequest
from farm.registry import Registry
from farm.settings import FarmSettings
from farm.worker.startup import EXIT_REFUSED
from tests.certs import Pki, make_pki
from tests.raw_sockets import raw_ping
from tests.waiting import stays, wait_for

ROOT = Path(__file__).resolve().parents[1]
FAST_S = 5.0  # a refusal is immediate; an outage would be waited out for broker_wait_s (30 s)


def refused_within(farm: Farm, seconds: float) -> BrokerAuthFailed:
    started = time.monotonic()
    with pytest.raises(BrokerAuthFailed) as caught:
        farm.run("6 * 7")
    assert time.monotonic() - started < seconds, "a refusal must not be waited out"
    return caught.value


# --- passwords ----------------------------------------------------------------------------------


def test_a_client_without_the_password_gets_a_typed_refusal_at_once(
    redis_server: RedisServer,
) -> None:
    assert raw_ping(redis_server.port).startswith(b"-NOAUTH")
    with Farm.connect(f"redis://127.0.0.1:{redis_server.port}/0") as farm:
        refused = refused_within(farm, FAST_S)
    assert "requires a password and this client gave none" in str(refused)
    assert "FARM_BROKER_PASSWORD" in str(refused)


def test_a_wrong_password_gets_a_typed_refusal_that_shows_no_password(
    redis_server: RedisServer,
) -> None:
    wrong = "not-the-password-4711"
    with Farm.connect(f"redis://:{wrong}@127.0.0.1:{redis_server.port}/0") as farm:
        refused = refused_within(farm, FAST_S)
    assert "refused this client's password" in str(refused)
    assert wrong not in str(refused) and redis_server.password not in str(refused)
    assert isinstance(refused.__cause__, redis.AuthenticationError)


def test_the_password_may_live_apart_from_the_url_whatever_characters_it_holds(
    tmp_path: Path,
) -> None:
    password = "p@ss/w:rd?#%20 ok"
    server = RedisServer(tmp_path, password=password).start()
    try:
        settings = FarmSettings(
            broker_url=f"redis://127.0.0.1:{server.port}/0", broker_password=password
        )
        assert password not in repr(settings)
        registry = Registry.connect(settings)
        assert registry.redis.ping()
        registry.close()
        from farm.celeryconf import make_app

        app = make_app(settings)
        try:
            with app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1)
            assert app.backend.client.ping()
        finally:
            app.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain_farm() -> Iterator[LocalFarm]:
    """A local farm of one worker process over the ``process`` backend."""
    with LocalFarm(1, backend="process") as local:
        yield local


def test_the_farms_own_clients_work_with_the_password_in_the_url_or_apart(
    plain_farm: LocalFarm,
) -> None:
    redis_ = plain_farm.redis
    apart = FarmSettings(
        broker_url=f"redis://127.0.0.1:{redis_.port}/0", broker_password=redis_.password
    )
    for settings in (plain_farm.settings(), apart):
        with Farm(settings) as farm, farm.session() as session:
            session.run("x = 6 * 7")
            assert session.run("x").value is not None and session.run("x").value.text == "42"


def test_ready_among_names_only_the_workers_registered_ready(redis_server: RedisServer) -> None:
    """What ``LocalFarm.wait_ready`` polls: of the workers asked, those whose registration
    says ready; one starting (not ready) and one never registered are not."""
    tag = os.urandom(4).hex()
    ready, starting, absent = (f"{kind}-{tag}" for kind in ("ready", "starting", "absent"))
    registry = Registry.connect(FarmSettings(broker_url=redis_server.url))
    try:
        registry.heartbeat(ready, {"ready": True, "generation": 1})
        registry.heartbeat(starting, {"ready": False, "generation": 1})
        assert registry.ready_among([ready, starting, absent]) == {ready}
        assert registry.ready_among([starting]) == set()
    finally:
        for worker_id in (ready, starting):
            registry.deregister(worker_id, 1)
        registry.close()


def map_squares(farm: Farm, n: int = 6) -> None:
    """``Farm.map`` over a few items: the workers push each item's result to the map's Redis
    list and the client reads it from there, both through their authenticated clients."""
    records = list(farm.map([f"{i} * {i}" for i in range(n)]))
    assert [r.id for r in records] == list(range(n))
    assert all(r.ok for r in records), [r.message for r in records if not r.ok]
    assert [r.cells[-1].value.text for r in records] == [str(i * i) for i in range(n)]  # type: ignore[union-attr]


def test_a_map_runs_through_a_broker_that_requires_a_password(plain_farm: LocalFarm) -> None:
    redis_ = plain_farm.redis
    apart = FarmSettings(
        broker_url=f"redis://127.0.0.1:{redis_.port}/0", broker_password=redis_.password
    )
    with Farm(apart) as farm:
        map_squares(farm)
    anonymous = Farm.connect(f"redis://127.0.0.1:{redis_.port}/0")
    with anonymous, pytest.raises(BrokerAuthFailed):
        list(anonymous.map(["1 + 1"]))


def test_the_cli_says_that_the_broker_refused_it(redis_server: RedisServer) -> None:
    wrong = "not-the-password-4713"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")}
    env["FARM_BROKER_URL"] = f"redis://:{wrong}@127.0.0.1:{redis_server.port}/0"
    status = farm_cli("status", env=env)
    assert status.returncode == 1
    said = " ".join(status.stderr.split())  # rich wraps lines to the terminal's width
    assert "refused this client's password" in said, status.stderr
    assert "Traceback" not in status.stderr and wrong not in status.stderr + status.stdout


PYTHON_M = ["-m", "farm.worker"]
CELERY_A = ["-m", "celery", "-A", "farm.worker", "worker", "--pool", "threads"]


@contextmanager
def worker_process(
    url: str, tmp_path: Path, command: list[str] = PYTHON_M
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``python -m farm.worker`` (or ``command``; process backend) against ``url``, its output
    in a file; killed with its process group at the end if it is still running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_BROKER_URL=url, FARM_BACKEND="process", FARM_SOCKET_DIR=str(tmp_path))
    output = tmp_path / "worker.log"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, *command],
            env=env,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(30)


@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [
        ("", "not-the-password-4714", "refused this client's password"),
        ("", None, "requires a password"),
        ("keyless", "pw", "does not allow this client's user what farm needs"),
    ],
    ids=["wrong-password", "no-password", "acl-user-without-farms-keys"],
)
@pytest.mark.parametrize("command", [PYTHON_M, CELERY_A], ids=["python-m", "celery-A"])
def test_a_worker_the_broker_refuses_says_so_and_exits_at_start(
    redis_server: RedisServer,
    tmp_path: Path,
    user: str,
    password: str | None,
    reason: str,
    command: list[str],
) -> None:
    """A worker with a wrong password (one rotated away), none, or an ACL user without farm's
    keys would sit in Celery's "Cannot connect ... Trying again" loop for hours (or run serving
    nothing); it logs one error naming the broker's host and exits with EX_CONFIG."""
    admin = redis_server.client()
    if user:
        admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "resetkeys", "+@all")
    auth = f"{user}:{password}@" if password else ""
    url = f"redis://{auth}127.0.0.1:{redis_server.port}/0"
    try:
        with worker_process(url, tmp_path, command) as (proc, output):
            status = proc.wait(30)  # a refusal is not retried
            said = output.read_text()
    finally:
        if user:
            admin.execute_command("ACL", "DELUSER", user)
        admin.close()
    assert status == EXIT_REFUSED, said[-3000:]
    (error,) = [line for line in said.splitlines() if " ERROR " in line]
    assert "cannot start: BrokerAuthFailed: the broker at redis://" in error, error
    assert f"127.0.0.1:{redis_server.port}" in error and reason in error, error
    assert "Cannot connect" not in said and "Traceback" not in said
    assert redis_server.password not in said
    if password:
        assert f":{password}@" not in said


def test_a_worker_waits_for_a_broker_that_is_down_rather_than_exiting(tmp_path: Path) -> None:
    """The other half: nothing listening is an outage, which Celery rides out (its "Cannot
    connect ... Trying again"); only a refusal ends the worker at start."""
    with worker_process(f"redis://:pw@127.0.0.1:{free_port()}/0", tmp_path) as (proc, output):
        assert wait_for(lambda: "Trying again" in output.read_text(), 60), output.read_text()
        assert proc.poll() is None
        assert "BrokerAuthFailed" not in output.read_text()


# --- ACL users: a Redis shared with other applications ------------------------------------------


def readme_acl(password: str, user: str) -> list[str]:
    """The documented ACL SETUSER line for farm's own user (docs/security.md, Control plane)."""
    text = (ROOT / "docs" / "security.md").read_text()
    (line,) = re.findall(r"^ACL SETUSER farm .*$", text, flags=re.MULTILINE)
    words = line.split()[2:]
    return [user, *[">" + password if w == ">PASSWORD" else w for w in words[1:]]]


@pytest.fixture
def acl_farm() -> Iterator[str]:
    """The URL (user farm) of a local farm whose worker connects as an ACL user made with the
    documented recipe, on a redis-server of the test's own."""
    with LocalFarm(0, backend="process") as local:
        admin = local.redis.client()
        admin.execute_command("ACL", "SETUSER", *readme_acl("acl-password-1", "farm"))
        admin.close()
        url = f"redis://farm:acl-password-1@127.0.0.1:{local.redis.port}/0"
        local.wait_ready([local.add_worker(FARM_BROKER_URL=url)])
        yield url


def test_a_farm_runs_as_an_acl_user_confined_to_its_own_keys(acl_farm: str) -> None:
    with Farm.connect(acl_farm) as farm:
        with farm.session() as session:
            assert session.run("6 * 7").value is not None
            assert [type(e).__name__ for e in session.stream("print(1)")][-1] == "ExecEnd"
        assert farm.run("sum(range(10))").value is not None
        map_squares(farm, 3)  # a map's result lists are farm's keys too
        with pytest.raises(redis.exceptions.NoPermissionError):
            farm.registry.redis.get("another-app:secret")
        with pytest.raises(redis.exceptions.NoPermissionError):
            farm.registry.redis.flushall()


def test_an_acl_user_without_the_rights_farm_needs_gets_a_typed_refusal(
    redis_server: RedisServer,
) -> None:
    admin = redis_server.client()
    user = f"nobody-{os.getpid()}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "resetkeys", "+@all")
    try:
        with Farm.connect(f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0") as farm:
            refused = refused_within(farm, FAST_S)
        assert "does not allow this client's user" in str(refused)
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


# --- farm doctor --------------------------------------------------------------------------------


def test_doctor_warns_about_a_broker_that_anyone_may_use(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    admin = server.client()
    try:
        settings = FarmSettings(broker_url=server.url)
        answers, auth = broker_checks(settings)
        assert answers.ok and auth.ok and not auth.warn
        assert "refuses clients without credentials" in auth.detail
        admin.config_set("requirepass", "")  # now open to anyone who reaches it
        answers, auth = broker_checks(settings)
        assert answers.ok and auth.warn and "anyone who reaches it can run code" in auth.detail
        for check in (answers, auth):
            assert server.password not in check.detail + check.fix
    finally:
        admin.close()
        server.stop()


@pytest.mark.parametrize(
    ("default_rules", "rights"),
    [
        (["-@all", "+ping"], []),  # answers PING, nothing of farm's
        (["~farm:*", "-@all", "+ping", "+@read"], ["read"]),
        (["~*", "&*", "+@all"], ["read", "write"]),
    ],
    ids=["ping-only", "read-only", "everything"],
)
def test_doctor_judges_an_anonymous_client_by_what_it_may_do_to_farms_keys(
    tmp_path: Path, default_rules: list[str], rights: list[str]
) -> None:
    """A PING proves nothing: an ACL may let the ``default`` user (every client without
    credentials) PING and no more. Doctor warns when such a client may read farm's keys (every
    result) or write them (submit code), and says which."""
    server = RedisServer(tmp_path).start()
    admin = server.client()
    try:
        admin.execute_command("ACL", "SETUSER", "farm", "on", ">farm-pw", "~*", "&*", "+@all")
        admin.execute_command(
            "ACL", "SETUSER", "default", "reset", "on", "nopass", *default_rules
        )  # the admin connection is the default user: from here on, only what it may do
        assert raw_ping(server.port).startswith(b"+PONG")  # what the old check took as open
        settings = FarmSettings(broker_url=f"redis://farm:farm-pw@127.0.0.1:{server.port}/0")
        answers, auth = broker_checks(settings)
        assert answers.ok and auth.ok
        assert auth.warn == bool(rights), auth.detail
        if rights:
            assert f"without credentials {' and '.join(rights)} farm's keys" in auth.detail
            said = "run code in every sandbox" if "write" in rights else "read every result"
            assert said in auth.detail, auth.detail
        else:
            assert "refuses clients without credentials" in auth.detail
            assert "NoPermissionError" in auth.detail, auth.detail
        assert "farm-pw" not in auth.detail + auth.fix
    finally:
        admin.close()
        server.stop()


def test_doctor_names_a_refusal_as_such(redis_server: RedisServer) -> None:
    wrong = "not-the-password-4712"
    settings = FarmSettings(broker_url=f"redis://:{wrong}@127.0.0.1:{redis_server.port}/0")
    (answers,) = broker_checks(settings)
    assert not answers.ok and "refused this client's password" in answers.detail
    assert wrong not in answers.detail + answers.fix


# --- TLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_farm(pki: Pki) -> Iterator[LocalFarm]:
    """One worker process over a TLS-only redis-server that demands a client certificate."""
    server, client = pki.server, pki.client
    tls = ServerTLS(
        server / "tls.crt",
        server / "tls.key",
        server / "ca.crt",
        client_cert_file=client / "tls.crt",
        client_key_file=client / "tls.key",
    )
    with LocalFarm(1, backend="process", tls=tls) as local:
        yield local


def test_a_farm_runs_code_through_a_tls_only_broker(tls_farm: LocalFarm) -> None:
    settings = tls_farm.settings()
    assert settings.redis_url.startswith("rediss://")
    with Farm(settings) as farm:
        with farm.session() as session:
            session.run("x = 6 * 7")
            assert session.run("x").value is not None and session.run("x").value.text == "42"
            events = [type(e).__name__ for e in session.stream("print('over TLS')")]
            assert events[0] == "ExecStart" and events[-1] == "ExecEnd"
        one_shot = farm.run("sum(range(10))")
        assert one_shot.ok and one_shot.value is not None and one_shot.value.text == "45"
        (worker,) = farm.workers()
        assert worker["ready"] and worker["id"] in tls_farm.workers
        map_squares(farm)


@pytest.mark.slow
def test_a_plain_tcp_client_gets_nothing_from_a_tls_only_broker(tls_farm: LocalFarm) -> None:
    port = tls_farm.redis.port
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, password=tls_farm.redis.password, socket_timeout=5).ping()
    plain = FarmSettings(broker_url=f"redis://:{tls_farm.redis.password}@127.0.0.1:{port}/0")
    with (
        Farm(plain.model_copy(update={"broker_wait_s": 0.5})) as farm,
        pytest.raises(BrokerUnavailable) as caught,
    ):
        farm.run("1")
    assert not caught.value.sent and tls_farm.redis.password not in str(caught.value)


def test_a_tls_client_without_the_ca_gets_a_typed_refusal(tls_farm: LocalFarm) -> None:
    untrusting = tls_farm.settings().model_copy(update={"broker_tls_ca_file": None})
    with Farm(untrusting) as farm:
        refused = refused_within(farm, FAST_S)
    assert "does not trust" in str(refused) and "FARM_BROKER_TLS_CA_FILE" in str(refused)


def test_a_tls_client_without_a_client_certificate_is_refused(tls_farm: LocalFarm) -> None:
    settings = tls_farm.settings().model_copy(
        update={"broker_tls_cert_file": None, "broker_tls_key_file": None}
    )
    registry = Registry.connect(settings)
    try:
        with pytest.raises(redis.ConnectionError):
            registry.redis.ping()
    finally:
        registry.close()


def test_doctor_finds_a_tls_broker_closed_to_clients_without_credentials(
    tls_farm: LocalFarm,
) -> None:
    answers, auth = broker_checks(tls_farm.settings())
    assert answers.ok and "rediss://:**@127.0.0.1" in answers.detail
    assert auth.ok and not auth.warn and "refuses clients without credentials" in auth.detail


def test_tls_files_with_a_plain_url_are_refused_rather_than_ignored(pki: Pki) -> None:
    settings = FarmSettings(broker_url="redis://127.0.0.1:6379/0", broker_tls_ca_file=pki.ca)
    with pytest.raises(InvalidRequest, match="not rediss://"):
        Farm(settings)


# --- farm up: the secret stays out of command lines, logs and output ----------------------------


def farm_cli(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI of this checkout (``python -m farm.cli.main`` from the repository root)."""
    return subprocess.run(
        [sys.executable, "-m", "farm.cli.main", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


def cmdlines_holding(secret: str) -> list[str]:
    """Command lines of every process on the host (what `ps` shows) that hold ``secret``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmdline.read_bytes()
        except OSError:
            continue  # gone meanwhile
        if secret.encode() in raw:
            found.append(f"{cmdline.parent.name}: {raw!r}")
    return found


@pytest.mark.slow
def test_farm_up_keeps_its_password_out_of_command_lines_logs_and_output(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_BROKER_")}
    env["FARM_STATE_FILE"] = str(state_file)
    up = farm_cli("up", "--workers", "1", "--backend", "process", env=env)
    assert up.returncode == 0, up.stderr
    state: dict[str, Any] = json.loads(state_file.read_text())
    try:
        password = redis.connection.parse_url(state["broker_url"])["password"]
        port = int(redis.connection.parse_url(state["broker_url"])["port"])
        assert len(password) >= 32
        assert state_file.stat().st_mode & 0o777 == 0o600
        assert (Path(state["dir"]) / "redis.conf").stat().st_mode & 0o777 == 0o600
        assert raw_ping(port).startswith(b"-NOAUTH")
        ran = farm_cli("run", "-", "--json", env=env, stdin="6 * 7")
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["value"]["text"] == "42"
        status = farm_cli("status", env=env)
        assert status.returncode == 0, status.stderr
        assert cmdlines_holding(password) == []
        outputs = [up.stdout, up.stderr, ran.stdout, ran.stderr, status.stdout, status.stderr]
        assert not [o for o in outputs if password in o]
        assert "redis://:**@127.0.0.1" in up.stdout
        logs = [state_file.with_suffix(".log"), *Path(state["dir"]).glob("*.log")]
        worker_logs = "".join(p.read_text(errors="replace") for p in logs)
        assert "redis://:**@127.0.0.1" in worker_logs, "Celery's banner names the broker"
        assert password not in worker_logs
    finally:
        down = farm_cli("down", env=env)
    assert down.returncode == 0, down.stderr


def test_a_worker_takes_no_call_for_another_image(tmp_path: Path) -> None:
    """A worker consumes its image's queue and its own, nothing else: Celery's default queue
    is ``farm.default``, and a worker of another image that consumed it ran the default
    image's one-shot runs (and opened its sessions) in its own sandbox."""
    with LocalFarm({"elsewhere": 1}, backend="process") as local, Farm(local.settings()) as farm:
        (worker,) = farm.workers()
        call = RunRequest(exec_id="elsewhere", code="6 * 7", timeout_s=10.0)
        elsewhere, _ = farm.broker.send(
            TASK_RUN, "farm.elsewhere", args=[call.model_dump(mode="json")]
        )
        assert elsewhere.get(timeout=30)["worker"] == worker["id"]  # its own: answered
        default, _ = farm.broker.send(
            TASK_RUN,
            "farm.default",
            args=[RunRequest(exec_id="default", code="1", timeout_s=10.0).model_dump(mode="json")],
        )
        try:
            assert stays(lambda: not default.ready(), 5.0), default.get(timeout=1)
        finally:
            release(default)
            release(elsewhere, unsubscribe=False)
        assert farm.registry.queue_length("farm.default") == 1  # left for a default worker
