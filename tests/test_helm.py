"""The Helm chart (helm/farm): it lints, renders with default and other values, every object
is a valid Kubernetes object, and the parts that keep user code contained are really there.

Rendering uses Helm's own Go engine through helm-python-sdk (libhelm_c, no helm binary, no
cluster); objects are checked with kubernetes-validate's bundled OpenAPI schemas (strict: an
unknown or misspelt field fails). Neither needs Docker or a network. The bundled Redis'
password and TLS are checked in ``test_helm_redis_auth.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extras")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = Path(__file__).resolve().parents[1] / "helm" / "farm"
RELEASE = "t"
NAMESPACE = "farm-test"
FULLNAME = f"{RELEASE}-farm"
# The chart's kubeVersion floor (native sidecars) and the newest schemas shipped.
KUBE_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]

POD_MODE = {
    "sandbox": {"mode": "pod", "image": "registry.example/farm-sandbox:0.1.0"},
    "runtimeClassName": "gvisor",
}
# Values a production install might set: every optional part switched on or changed.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "pod-mode-hpa": {
        **POD_MODE,
        "autoscaling": {"enabled": True, "engine": "hpa", "maxReplicas": 20},
        "sandbox": {**POD_MODE["sandbox"], "pullSecret": "regcred", "memoryMb": 1024},
    },
    "dind-keda-kata": {
        "runtimeClassName": "kata",
        "autoscaling": {"enabled": True, "engine": "keda"},
        "redis": {"persistence": {"enabled": True, "size": "2Gi"}},
        "sandbox": {"pullSecret": "regcred", "dind": {"runtime": "runsc"}},
        "networkPolicy": {
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},
            ]
        },
        "worker": {"env": {"FARM_HEARTBEAT_TTL_S": "5"}, "nodeSelector": {"farm": "yes"}},
    },
    "external-redis": {
        "redis": {
            "enabled": False,
            "externalUrl": "redis://redis.example:6379/3",
            "auth": {"existingSecret": "broker-auth"},
        },
        "podDisruptionBudget": {"enabled": False},
        "metrics": {"prometheusAnnotations": False},
        "networkPolicy": {"externalRedisTo": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]},
    },
    "tls-client-certs-keda": {
        "redis": {
            "tls": {
                "enabled": True,
                "certSecret": "farm-redis-tls",
                "clientCertSecret": "farm-client-tls",
            },
            "auth": {"existingSecret": "broker-auth", "secretKey": "redis-password"},
        },
        "autoscaling": {"enabled": True, "engine": "keda"},
    },
    "external-redis-tls": {
        "redis": {
            "enabled": False,
            "externalUrl": "rediss://farm@redis.example:6380/0",
            "auth": {"existingSecret": "broker-auth"},
            "tls": {"enabled": True},
        },
    },
}

# KEDA's ScaledObject is a custom resource that kubernetes-validate has no schema for: it is
# checked against the part of KEDA's CRD (keda.sh/v1alpha1) that the chart uses. Trigger
# metadata values must be strings there, a classic mistake with listLength.
INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "minReplicaCount": INT32,
                "maxReplicaCount": INT32,
                "pollingInterval": INT32,
                "cooldownPeriod": INT32,
                "idleReplicaCount": INT32,
                "advanced": {"type": "object"},
                "fallback": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "authenticationRef": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}

# The part of KEDA's TriggerAuthentication CRD the chart uses: Secret references.
TRIGGER_AUTHENTICATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["parameter", "name", "key"],
                        "properties": {
                            "parameter": {"type": "string"},
                            "name": {"type": "string"},
                            "key": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}
KEDA_SCHEMAS = {
    "ScaledObject": SCALED_OBJECT_SCHEMA,
    "TriggerAuthentication": TRIGGER_AUTHENTICATION_SCHEMA,
}


# --- rendering --------------------------------------------------------------------------------


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the chart renders with ``values`` (NOTES.txt is text, not an object)."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner name, pod spec) of every workload and pod template."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]
        elif obj["kind"] == "PodTemplate":
            yield obj["metadata"]["name"], obj["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(spec) if c["name"] == name)


def worker_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = find(objects, "Deployment", f"{FULLNAME}-worker")
    return deployment["spec"]["template"]


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a matchLabels-only label selector selects a pod with ``labels``."""
    assert set(selector) <= {"matchLabels"}, "the chart uses matchLabels only"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def admits_pod(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether any ingress rule of ``policy`` admits a pod of this namespace with ``labels``."""
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        if peers is None:
            return True
        for peer in peers:
            if "ipBlock" in peer:
                return True  # an address range may contain any pod
            if "namespaceSelector" in peer:
                continue  # other namespaces (a podSelector alongside narrows it further)
            if selects(peer["podSelector"], labels):
                return True
    return False


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def pod_mode() -> list[dict[str, Any]]:
    return render(VALUE_SETS["pod-mode-hpa"])


# --- lint, render, validate -------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_lints_without_warnings(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid_kubernetes(values: dict[str, Any]) -> None:
    objects = render(values)
    assert {"Deployment", "Service", "NetworkPolicy", "ServiceAccount"} <= kinds(objects)
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(obj, KEDA_SCHEMAS[obj["kind"]])
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{where} is invalid for Kubernetes {version}: {path}: {exc.message}")


def test_default_values_render_the_whole_farm(default: list[dict[str, Any]]) -> None:
    assert kinds(default) == {
        "Deployment",
        "Service",
        "StatefulSet",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ServiceAccount",
        "Secret",
    }
    find(default, "StatefulSet", f"{FULLNAME}-redis")
    assert find(default, "Deployment", f"{FULLNAME}-worker")["spec"]["replicas"] == 2


def test_values_that_make_no_sense_are_refused() -> None:
    # values.schema.json, checked by render and lint alike
    with pytest.raises(helm.HelmError, match="/sandbox/mode"):
        render({"sandbox": {"mode": "sidecar"}})
    report = helm.lint(CHART, {"autoscaling": {"engine": "cpu"}}, strict=True)
    assert any("/autoscaling/engine" in e for e in report["errors"]), report
    # cross-field rules in the templates
    with pytest.raises(helm.HelmError, match="redis.externalUrl is required"):
        render({"redis": {"enabled": False, "auth": {"existingSecret": "broker-auth"}}})
    with pytest.raises(helm.HelmError, match="redisAddress"):
        render({**VALUE_SETS["external-redis"], "autoscaling": {"enabled": True}})


# --- isolation of user code -------------------------------------------------------------------


def test_pod_mode_sandboxes_have_no_egress_and_only_workers_may_reach_them(
    pod_mode: list[dict[str, Any]],
) -> None:
    template = find(pod_mode, "PodTemplate", f"{FULLNAME}-sandbox")
    sandbox_labels = template["template"]["metadata"]["labels"]
    policy = find(pod_mode, "NetworkPolicy", f"{FULLNAME}-sandbox")
    assert selects(policy["spec"]["podSelector"], sandbox_labels)
    assert "Egress" in policy["spec"]["policyTypes"]
    assert policy["spec"].get("egress", []) == [], "sandbox pods must have no egress at all"
    worker_labels = worker_pod(pod_mode)["metadata"]["labels"]
    redis_labels = {**sandbox_labels, "app.kubernetes.io/component": "redis"}
    assert admits_pod(policy, worker_labels)
    assert not admits_pod(policy, redis_labels)
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 7000, "protocol": "TCP"}]
    # No other policy opens egress for them: the only policy selecting sandboxes is this one.
    for other in pod_mode:
        if other["kind"] == "NetworkPolicy" and other is not policy:
            assert not selects(other["spec"]["podSelector"], sandbox_labels)


def test_user_code_cannot_reach_redis_in_either_mode(
    default: list[dict[str, Any]], pod_mode: list[dict[str, Any]]
) -> None:
    # pod mode: Redis admits workers and labelled clients, never sandbox pods.
    redis_policy = find(pod_mode, "NetworkPolicy", f"{FULLNAME}-redis")
    sandbox = find(pod_mode, "PodTemplate", f"{FULLNAME}-sandbox")["template"]
    assert not admits_pod(redis_policy, sandbox["metadata"]["labels"])
    assert admits_pod(redis_policy, worker_pod(pod_mode)["metadata"]["labels"])
    assert admits_pod(redis_policy, {"farm-client": "true"})
    assert not admits_pod(redis_policy, {"app": "anything-else"})
    assert redis_policy["spec"]["egress"] == []
    # dind mode: the sandbox is a container of the pod's own engine, which has no bridge and
    # no iptables, and the worker asks for --network none: no interface but loopback.
    spec = worker_pod(default)["spec"]
    engine = container(spec, "engine")
    assert {"--bridge=none", "--iptables=false", "--ip-forward=false"} <= set(engine["args"])
    hosts = [a for a in engine["args"] if a.startswith("--host")]
    assert hosts and all(h.startswith("--host=unix://") for h in hosts), "no TCP API"
    worker_env = env(container(spec, "worker"))
    assert worker_env["FARM_SANDBOX_NETWORK"] == "none"
    assert worker_env["FARM_BACKEND"] == "docker"
    assert worker_env["DOCKER_HOST"] == "unix:///run/farm-docker/docker.sock"


def test_dind_engine_socket_and_kernel_sockets_are_shared_only_inside_the_pod(
    default: list[dict[str, Any]],
) -> None:
    spec = worker_pod(default)["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name in ("engine-socket", "farm-sockets"):
        assert "emptyDir" in volumes[name], f"{name} must be pod-local"
    mounts = {
        c["name"]: {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        for c in containers(spec)
    }
    # The engine resolves bind paths in its own filesystem: same path in both containers.
    assert mounts["worker"]["farm-sockets"] == mounts["engine"]["farm-sockets"]
    assert env(container(spec, "worker"))["FARM_SOCKET_DIR"] == mounts["worker"]["farm-sockets"]
    # A native sidecar: up (startup probe) before the worker starts, stopped after it.
    engine = container(spec, "engine")
    assert engine["restartPolicy"] == "Always" and "startupProbe" in engine
    assert not any(v.get("hostPath") for v in spec["volumes"]), "nothing of the node is mounted"


def test_farm_containers_run_non_root_on_a_read_only_root(
    default: list[dict[str, Any]], pod_mode: list[dict[str, Any]]
) -> None:
    checked = 0
    for objects in (default, pod_mode):
        for owner, spec in pod_specs(objects):
            for c in containers(spec):
                if c["name"] == "engine":
                    continue  # the dind engine, checked below
                ctx = c["securityContext"]
                where = f"{owner}/{c['name']}"
                assert ctx["runAsNonRoot"] is True, where
                assert ctx.get("runAsUser", spec.get("securityContext", {}).get("runAsUser"))
                assert ctx["readOnlyRootFilesystem"] is True, where
                assert ctx["allowPrivilegeEscalation"] is False, where
                assert ctx["capabilities"]["drop"] == ["ALL"], where
                assert not ctx.get("privileged"), where
                checked += 1
    assert checked >= 4  # worker and redis in both modes, the sandbox kernel in pod mode


def test_only_the_dind_engine_is_privileged_and_pod_mode_has_nothing_privileged(
    default: list[dict[str, Any]], pod_mode: list[dict[str, Any]]
) -> None:
    privileged = [
        (owner, c["name"])
        for owner, spec in pod_specs(default)
        for c in containers(spec)
        if c.get("securityContext", {}).get("privileged")
    ]
    assert privileged == [(f"{FULLNAME}-worker", "engine")]
    for _, spec in pod_specs(pod_mode):
        for c in containers(spec):
            assert not c.get("securityContext", {}).get("privileged"), c["name"]
            assert c["securityContext"]["runAsNonRoot"] is True


def test_no_service_account_token_where_no_api_access_is_needed(
    default: list[dict[str, Any]], pod_mode: list[dict[str, Any]]
) -> None:
    for _, spec in pod_specs(default):
        assert spec["automountServiceAccountToken"] is False
    sandbox = find(pod_mode, "PodTemplate", f"{FULLNAME}-sandbox")["template"]["spec"]
    assert sandbox["automountServiceAccountToken"] is False
    # pod mode's workers need the API: a namespaced Role, no cluster-wide rights.
    assert worker_pod(pod_mode)["spec"]["automountServiceAccountToken"] is True
    assert "ClusterRole" not in kinds(pod_mode)
    role = find(pod_mode, "Role", f"{FULLNAME}-worker")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and "escalate" not in verbs and "bind" not in verbs


def test_runtime_class_reaches_the_pods_that_hold_user_code() -> None:
    kata = render({"runtimeClassName": "kata"})
    assert worker_pod(kata)["spec"]["runtimeClassName"] == "kata"
    pods = render(POD_MODE)
    sandbox = find(pods, "PodTemplate", f"{FULLNAME}-sandbox")["template"]["spec"]
    assert sandbox["runtimeClassName"] == "gvisor"
    assert "runtimeClassName" not in worker_pod(render())["spec"]


def test_sandbox_limits_follow_the_values(pod_mode: list[dict[str, Any]]) -> None:
    sandbox = find(pod_mode, "PodTemplate", f"{FULLNAME}-sandbox")["template"]["spec"]
    kernel = container(sandbox, "kernel")
    assert kernel["resources"]["limits"] == {"cpu": "1", "memory": "1024Mi"}
    assert sandbox["imagePullSecrets"] == [{"name": "regcred"}]
    assert kernel["args"][:2] == ["--listen", "0.0.0.0:7000"]
    assert env(container(worker_pod(pod_mode)["spec"], "worker"))["FARM_BACKEND"] == "kubernetes"


# --- operations -------------------------------------------------------------------------------


def test_worker_probes_use_its_health_endpoints(default: list[dict[str, Any]]) -> None:
    worker = container(worker_pod(default)["spec"], "worker")
    (port,) = worker["ports"]
    assert port == {"name": "metrics", "containerPort": 9100, "protocol": "TCP"}
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert worker["startupProbe"]["httpGet"]["path"] == "/healthz"
    worker_env = env(worker)
    assert worker_env["FARM_METRICS_HOST"] == "0.0.0.0"
    assert worker_env["FARM_METRICS_PORT"] == "9100"
    assert worker_env["FARM_WORKER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert worker_env["FARM_BROKER_URL"] == f"redis://{FULLNAME}-redis:6379/0"


def test_every_container_has_requests_and_limits(
    default: list[dict[str, Any]], pod_mode: list[dict[str, Any]]
) -> None:
    for objects in (default, pod_mode):
        for owner, spec in pod_specs(objects):
            for c in containers(spec):
                res = c["resources"]
                assert {"cpu", "memory"} <= set(res["requests"]), f"{owner}/{c['name']}"
                assert {"cpu", "memory"} <= set(res["limits"]), f"{owner}/{c['name']}"


def test_engine_memory_covers_its_sandbox(default: list[dict[str, Any]]) -> None:
    engine = container(worker_pod(default)["spec"], "engine")
    limit = engine["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and int(limit[:-2]) * 1024 > 512


def test_metrics_service_and_annotations_for_prometheus(default: list[dict[str, Any]]) -> None:
    service = find(default, "Service", f"{FULLNAME}-worker")
    pod = worker_pod(default)
    assert selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    assert service["spec"]["ports"][0]["name"] == "metrics"
    for marks in (service["metadata"]["annotations"], pod["metadata"]["annotations"]):
        assert marks["prometheus.io/scrape"] == "true"
        assert marks["prometheus.io/port"] == "9100"
        assert marks["prometheus.io/path"] == "/metrics"
    metrics_rule = find(default, "NetworkPolicy", f"{FULLNAME}-worker")["spec"]["ingress"]
    assert metrics_rule == [{"ports": [{"port": 9100, "protocol": "TCP"}]}]


def test_disruption_budget_covers_the_workers(default: list[dict[str, Any]]) -> None:
    pdb = find(default, "PodDisruptionBudget", f"{FULLNAME}-worker")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"], worker_pod(default)["metadata"]["labels"])


def test_keda_scales_workers_on_the_shared_queue_length() -> None:
    objects = render(VALUE_SETS["dind-keda-kata"])
    deployment = find(objects, "Deployment", f"{FULLNAME}-worker")
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    scaled = find(objects, "ScaledObject", f"{FULLNAME}-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"] == "farm.default"
    assert trigger["metadata"]["address"] == f"{FULLNAME}-redis.{NAMESPACE}.svc:6379"
    redis_policy = find(objects, "NetworkPolicy", f"{FULLNAME}-redis")
    peers = [p for rule in redis_policy["spec"]["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in peers


def test_hpa_scales_workers_on_an_external_queue_metric(pod_mode: list[dict[str, Any]]) -> None:
    hpa = find(pod_mode, "HorizontalPodAutoscaler", f"{FULLNAME}-worker")
    assert hpa["spec"]["scaleTargetRef"]["name"] == f"{FULLNAME}-worker"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"queue": "farm.default"}
    assert hpa["spec"]["maxReplicas"] == 20


def test_external_redis_replaces_the_bundled_one() -> None:
    objects = render(VALUE_SETS["external-redis"])
    assert "StatefulSet" not in kinds(objects) and "PodDisruptionBudget" not in kinds(objects)
    worker = container(worker_pod(objects)["spec"], "worker")
    assert env(worker)["FARM_BROKER_URL"] == "redis://redis.example:6379/3"
    egress = find(objects, "NetworkPolicy", f"{FULLNAME}-worker")["spec"]["egress"]
    to_redis = {
        "ports": [{"port": 6379, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
    }
    assert to_redis in egress


def test_notes_warn_that_pod_mode_needs_a_backend_farm_lacks() -> None:
    assert "privileged" in notes()
    assert "kubernetes` sandbox backend" in notes(POD_MODE)
