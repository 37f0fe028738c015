"""The Helm chart's control plane: no rendering leaves the bundled Redis without its password,
the password lives only in its Secret (the chart's, kept across upgrades, or yours) and reaches
Redis, workers and KEDA by reference, TLS switches all of them to ``rediss://``, and the
NetworkPolicy stays. An upgrade's ``lookup`` of the live Secret is answered by a minimal
Kubernetes API server of the test's own (``FakeApiServer``): Helm's engine asks it exactly as it
would ask a cluster. The rendered Redis command and probes are also run, with this host's
``sh`` and ``redis-server`` (plain and TLS-only with client certificates): no Docker, cluster or
network.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from farm.local.redis_server import free_port
from tests.certs import make_pki
from tests.raw_sockets import raw_ping
from tests.test_helm import (
    CHART,
    FULLNAME,
    NAMESPACE,
    POOL_NAMES,
    RELEASE,
    VALUE_SETS,
    admits_pod,
    container,
    env,
    find,
    helm,
    kinds,
    notes,
    render,
    worker_pod,
)
from tests.waiting import wait_for

# --- Redis never runs without a password -------------------------------------

AUTH_SECRET = f"{FULLNAME}-redis-auth"


def redis_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    statefulset = find(objects, "StatefulSet", f"{FULLNAME}-redis")
    return container(statefulset["spec"]["template"]["spec"], "redis")


def password_ref(values: dict[str, Any]) -> dict[str, Any]:
    auth = values.get("redis", {}).get("auth", {})
    name = auth.get("existingSecret") or AUTH_SECRET
    return {"secretKeyRef": {"name": name, "key": auth.get("secretKey", "password")}}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_no_rendering_leaves_redis_without_auth(values: dict[str, Any]) -> None:
    objects = render(values)
    ref = password_ref(values)
    # the workers of every pool, the API (and KEDA) take the password from the Secret, never
    # a literal
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    main = {
        d["metadata"]["name"]: container(
            d["spec"]["template"]["spec"],
            "api" if d["metadata"]["name"].endswith("-api") else "worker",
        )
        for d in deployments
    }
    assert f"{FULLNAME}-api" in main and len(main) >= 2
    assert all(env(c)["FARM_BROKER_PASSWORD"] == ref for c in main.values())
    for obj in objects:
        if obj["kind"] == "TriggerAuthentication":
            (password,) = [
                r for r in obj["spec"]["secretTargetRef"] if r["parameter"] == "password"
            ]
            assert {"name": password["name"], "key": password["key"]} == ref["secretKeyRef"]
        if obj["kind"] == "ScaledObject":  # every pool KEDA scales reads its lists with it
            for trigger in obj["spec"]["triggers"]:
                if trigger["type"] == "redis":
                    find(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    if not values.get("redis", {}).get("enabled", True):
        assert "StatefulSet" not in kinds(objects)
        return
    redis_ = redis_container(objects)
    assert env(redis_)["FARM_BROKER_PASSWORD"] == ref
    script, *args = redis_["args"]
    assert redis_["command"] == ["sh", "-c"]
    assert 'exec redis-server - "$@" <<CONFIG\nrequirepass "$FARM_BROKER_PASSWORD"' in script
    assert not {"--requirepass", "--protected-mode", "--user", "--aclfile"} & set(args)
    for probe in (redis_["livenessProbe"], redis_["readinessProbe"]):
        assert 'REDISCLI_AUTH="$FARM_BROKER_PASSWORD" redis-cli' in probe["exec"]["command"][-1]
    if not values.get("redis", {}).get("auth", {}).get("existingSecret"):
        find(objects, "Secret", AUTH_SECRET)


def test_the_generated_password_is_long_random_and_only_in_its_secret() -> None:
    first, second = render(), render()

    def password(objects: list[dict[str, Any]]) -> str:
        data = find(objects, "Secret", AUTH_SECRET)["data"]
        return base64.b64decode(data["password"]).decode()

    made = password(first)
    assert len(made) == 48 and made.isalnum()
    assert password(second) != made, "offline renders (no live Secret to keep) draw anew"
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({}, name=RELEASE, namespace=NAMESPACE)
    secret_text = next(t for p, t in manifests.items() if p.endswith("redis-auth.yaml"))
    encoded = yaml.safe_load(secret_text)["data"]["password"]
    elsewhere = "".join(t for p, t in manifests.items() if not p.endswith("redis-auth.yaml"))
    plain = base64.b64decode(encoded).decode()
    assert plain not in elsewhere and encoded not in elsewhere


class FakeApiServer:
    """A Kubernetes API server that knows one namespace's Secrets, nothing else: enough for
    Helm's ``lookup`` (API discovery of ``v1``, then a GET of the Secret; anything else is a
    404, which ``lookup`` turns into an empty result). ``asked`` lists the paths requested."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets
        self.asked: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                fake.asked.append(path)
                status, body = fake.answer(path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        if path == "/api/v1":
            resource = {"name": "secrets", "singularName": "secret", "namespaced": True,
                        "kind": "Secret", "verbs": ["get", "list"]}  # fmt: skip
            return 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [resource]}
        prefix = f"/api/v1/namespaces/{NAMESPACE}/secrets/"
        name = path.removeprefix(prefix)
        if path.startswith(prefix) and name in self.secrets:
            data = {k: base64.b64encode(v.encode()).decode() for k, v in self.secrets[name].items()}
            metadata = {"name": name, "namespace": NAMESPACE}
            return 200, {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": data}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                     "reason": "NotFound"}  # fmt: skip

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def kubeconfig(self) -> str:
        port = self.server.server_address[1]
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        })  # fmt: skip


def upgrade_password(
    live: dict[str, dict[str, str]], values: dict[str, Any]
) -> tuple[str, list[str]]:
    """The password an upgrade renders into the chart's Secret while ``live`` Secrets exist in
    the cluster (Helm's engine with ``lookup`` against ``FakeApiServer``), and what it asked."""
    with (
        FakeApiServer(live) as api,
        helm.Config(kubeconfig_content=api.kubeconfig(), namespace=NAMESPACE) as config,
        helm.Chart.load(CHART) as chart,
    ):
        manifests = config.render(
            chart, values, name=RELEASE, namespace=NAMESPACE, is_upgrade=True, revision=2
        )
    text = next(t for p, t in manifests.items() if p.endswith("redis-auth.yaml"))
    key = values.get("redis", {}).get("auth", {}).get("secretKey", "password")
    return base64.b64decode(yaml.safe_load(text)["data"][key]).decode(), api.asked


@pytest.mark.parametrize("key", ["password", "redis-password"])
def test_an_upgrade_keeps_the_password_of_the_live_secret(key: str) -> None:
    """``helm upgrade`` renders the chart's Secret again: it must hold the password the install
    made (read from the cluster with ``lookup``), or Redis and every client would part ways."""
    values = {"redis": {"auth": {"secretKey": key}}}
    kept = "made-by-the-install-0123456789abcdefghijklmnopqrstuv"
    password, asked = upgrade_password({AUTH_SECRET: {key: kept}}, values)
    assert password == kept
    assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{AUTH_SECRET}" in asked


def test_a_live_secret_without_the_password_gets_a_new_one() -> None:
    """No live Secret (the first install), or one without the key: a fresh password, not an
    empty one."""
    for live in ({}, {AUTH_SECRET: {"other-key": "not-the-password"}}):
        password, asked = upgrade_password(live, {})
        assert len(password) == 48 and password.isalnum(), live
        assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{AUTH_SECRET}" in asked


def test_an_existing_secret_replaces_the_generated_one() -> None:
    objects = render({"redis": {"auth": {"existingSecret": "mine", "secretKey": "pw"}}})
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    assert secrets == {f"{FULLNAME}-api-token"}  # the API's own token; no broker password
    wanted = {"secretKeyRef": {"name": "mine", "key": "pw"}}
    assert env(redis_container(objects))["FARM_BROKER_PASSWORD"] == wanted
    assert env(container(worker_pod(objects)["spec"], "worker"))["FARM_BROKER_PASSWORD"] == wanted


def test_an_external_redis_needs_a_secret_and_a_url_without_the_password() -> None:
    with pytest.raises(helm.HelmError, match="existingSecret is required"):
        render({"redis": {"enabled": False, "externalUrl": "redis://redis.example:6379/0"}})
    with pytest.raises(helm.HelmError, match="must not hold the password"):
        render(
            {
                "redis": {
                    "enabled": False,
                    "externalUrl": "redis://:hunter2@redis.example:6379/0",
                    "auth": {"existingSecret": "broker-auth"},
                }
            }
        )
    with pytest.raises(helm.HelmError, match="redis.tls.enabled must match"):
        render({**VALUE_SETS["external-redis-tls"], "redis": {
            **VALUE_SETS["external-redis-tls"]["redis"], "tls": {"enabled": False}}})  # fmt: skip
    worker = container(worker_pod(render(VALUE_SETS["external-redis-tls"]))["spec"], "worker")
    assert env(worker)["FARM_BROKER_URL"] == "rediss://farm@redis.example:6380/0"
    assert "FARM_BROKER_TLS_CA_FILE" not in env(worker), "no certSecret: the system's CAs"


def test_tls_puts_redis_workers_and_keda_on_tls_with_client_certificates() -> None:
    objects = render(VALUE_SETS["tls-client-certs-keda"])
    redis_ = redis_container(objects)
    args = redis_["args"][1:]
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags["--port"] == "0" and flags["--tls-port"] == "6379", "TLS only"
    assert flags["--tls-auth-clients"] == "yes"
    assert flags["--tls-ca-cert-file"] == "/etc/redis/tls/ca.crt"
    assert "--tls --cacert /etc/redis/tls/ca.crt --cert" in redis_["readinessProbe"]["exec"][
        "command"][-1]  # fmt: skip
    statefulset = find(objects, "StatefulSet", f"{FULLNAME}-redis")
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "farm-redis-tls"

    spec = worker_pod(objects)["spec"]
    worker_env = env(container(spec, "worker"))
    assert worker_env["FARM_BROKER_URL"] == f"rediss://{FULLNAME}-redis:6379/0"
    assert worker_env["FARM_BROKER_TLS_CA_FILE"] == "/etc/farm/broker-tls/ca.crt"
    assert worker_env["FARM_BROKER_TLS_CERT_FILE"] == "/etc/farm/broker-client/tls.crt"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["broker-tls"]["secret"] == {
        "secretName": "farm-redis-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }, "the worker gets the CA, never the server's key"
    assert volumes["broker-client"]["secret"]["secretName"] == "farm-client-tls"

    scaled = find(objects, "ScaledObject", f"{FULLNAME}-worker-default")
    queue, opens, chunks = scaled["spec"]["triggers"]
    assert {t["metadata"]["enableTLS"] for t in (queue, opens, chunks)} == {"true"}
    assert queue["authenticationRef"] == opens["authenticationRef"] == chunks["authenticationRef"]
    auth = find(objects, "TriggerAuthentication", queue["authenticationRef"]["name"])
    params = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert params == {
        "password": ("broker-auth", "redis-password"),
        "ca": ("farm-redis-tls", "ca.crt"),
        "cert": ("farm-client-tls", "tls.crt"),
        "key": ("farm-client-tls", "tls.key"),
    }
    # the NetworkPolicy stays: TLS and passwords come on top of it
    policy = find(objects, "NetworkPolicy", f"{FULLNAME}-redis")
    assert admits_pod(policy, worker_pod(objects)["metadata"]["labels"])
    assert not admits_pod(policy, {"app": "anything-else"})


def test_every_pool_reaches_redis_over_tls_and_every_scaled_object_authenticates() -> None:
    values = {
        **VALUE_SETS["pools"],
        "redis": VALUE_SETS["tls-client-certs-keda"]["redis"],
        "autoscaling": {"enabled": True, "engine": "keda"},
    }
    objects = render(values)
    (auth,) = [o for o in objects if o["kind"] == "TriggerAuthentication"]
    for name in POOL_NAMES:
        deployment = find(objects, "Deployment", f"{FULLNAME}-worker-{name}")
        spec = deployment["spec"]["template"]["spec"]
        worker_env = env(container(spec, "worker"))
        assert worker_env["FARM_BROKER_URL"] == f"rediss://{FULLNAME}-redis:6379/0"
        assert worker_env["FARM_BROKER_PASSWORD"] == password_ref(values)
        assert worker_env["FARM_BROKER_TLS_KEY_FILE"] == "/etc/farm/broker-client/tls.key"
        mounts = {m["name"] for m in container(spec, "worker")["volumeMounts"]}
        assert {"broker-tls", "broker-client"} <= mounts
        assert {v["name"] for v in spec["volumes"]} >= {"broker-tls", "broker-client"}
        scaled = find(objects, "ScaledObject", f"{FULLNAME}-worker-{name}")
        redis_triggers = [t for t in scaled["spec"]["triggers"] if t["type"] == "redis"]
        assert len(redis_triggers) == 3  # the shared queue, the session opens, the map chunks
        for trigger in redis_triggers:
            assert trigger["metadata"]["enableTLS"] == "true"
            assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]


def test_tls_for_the_bundled_redis_needs_its_certificate() -> None:
    with pytest.raises(helm.HelmError, match="certSecret is required"):
        render({"redis": {"tls": {"enabled": True}}})
    with pytest.raises(helm.HelmError, match="clientCertSecret needs redis.tls.enabled"):
        render({"redis": {"tls": {"clientCertSecret": "farm-client-tls"}}})


def test_notes_say_where_the_password_is() -> None:
    text = notes()
    assert AUTH_SECRET in text and "FARM_BROKER_PASSWORD" in text


# --- running the chart's Redis command and probes on this host ---------------------------------


class RenderedRedis:
    """The bundled Redis container's rendered command, run by this host's sh and redis-server
    on a free loopback port, with the container's paths mapped to local ones."""

    def __init__(self, values: dict[str, Any], paths: dict[str, Path], password: str) -> None:
        spec = redis_container(render(values))
        self.port = free_port()
        self.paths = {**paths}
        script, *args = spec["args"]
        port_flag = "--tls-port" if "--tls-port" in args else "--port"
        self.command = ["sh", "-c", script, *map(self.local, args)]
        self.command += ["--bind", "127.0.0.1", port_flag, str(self.port)]
        self.probe = self.local(spec["readinessProbe"]["exec"]["command"][-1]).replace(
            "redis-cli", f"redis-cli -p {self.port}"
        )
        self.password = password
        self.proc: subprocess.Popen[str] | None = None

    def local(self, text: str) -> str:
        for remote, here in self.paths.items():
            text = text.replace(remote, str(here))
        return text

    def env(self, password: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "FARM_BROKER_PASSWORD": password}

    def start(self) -> RenderedRedis:
        self.proc = subprocess.Popen(
            self.command, env=self.env(self.password), stderr=subprocess.PIPE, text=True
        )
        return self

    def probe_ok(self, password: str) -> bool:
        probe = ["sh", "-c", self.probe]
        return subprocess.run(probe, env=self.env(password), timeout=10).returncode == 0

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def test_the_rendered_redis_requires_its_password(tmp_path: Path) -> None:
    redis_ = RenderedRedis({}, {"/data": tmp_path}, "s3cret-from-the-Secret").start()
    try:
        assert wait_for(lambda: redis_.probe_ok("s3cret-from-the-Secret"), 10), "never ready"
        assert raw_ping(redis_.port).startswith(b"-NOAUTH")
        assert not redis_.probe_ok("wrong"), "a probe without the password must fail"
        assert redis_.proc is not None
        cmdline = Path(f"/proc/{redis_.proc.pid}/cmdline").read_bytes()
        assert b"s3cret" not in cmdline
    finally:
        redis_.stop()


def test_the_rendered_redis_refuses_to_start_without_a_password(tmp_path: Path) -> None:
    redis_ = RenderedRedis({}, {"/data": tmp_path}, "").start()
    try:
        assert redis_.proc is not None and redis_.proc.wait(10) == 1
        assert "the password is empty" in (redis_.proc.stderr.read() if redis_.proc.stderr else "")
    finally:
        redis_.stop()


def test_the_rendered_redis_serves_tls_only_and_demands_client_certificates(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path / "pki")
    paths = {"/data": tmp_path, "/etc/redis/tls": pki.server, "/etc/redis/client": pki.client}
    values = {
        "redis": {"tls": {"enabled": True, "certSecret": "s", "clientCertSecret": "c"}},
    }
    redis_ = RenderedRedis(values, paths, "tls-password").start()
    try:
        assert wait_for(lambda: redis_.probe_ok("tls-password"), 10), "never ready"
        assert not redis_.probe_ok("wrong")
        assert raw_ping(redis_.port) == b"", "plain TCP gets nothing from a TLS-only port"
        without_cert = redis_.probe.replace(f"--cert {pki.client}/tls.crt", "").replace(
            f"--key {pki.client}/tls.key", ""
        )
        refused = subprocess.run(
            ["sh", "-c", without_cert], env=redis_.env("tls-password"), timeout=10
        )
        assert refused.returncode != 0, "a client without a certificate must be refused"
    finally:
        redis_.stop()
