"""The Helm chart (helm/farm): it lints, renders with default and other values, every object
is a valid Kubernetes object, and the parts that keep user code contained are really there.

Rendering uses Helm's own Go engine through helm-python-sdk (libhelm_c, no helm binary, no
cluster); objects are checked with kubernetes-validate's bundled OpenAPI schemas (strict: an
unknown or misspelt field fails). Neither needs Docker or a network. The bundled Redis'
password and TLS are checked in ``test_helm_redis_auth.py``.
"""

from __future__ import annotations

import json
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

# Values a production install might set: every optional part switched on or changed.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "gvisor-hpa": {
        "runtimeClassName": "gvisor",
        "autoscaling": {"enabled": True, "engine": "hpa", "maxReplicas": 20},
        "sandbox": {
            "image": "registry.example/farm-sandbox:0.1.0",
            "pullSecret": "regcred",
            "memoryMb": 768,
        },
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
# Worker pools: the default image, an environment (`farm image build ds ...`) that needs more
# memory and scales from zero, and a pool of another image from another registry.
POOLS: dict[str, Any] = {
    "sandbox": {"image": "registry.example:5000/farm-sandbox:0.1.0"},
    "worker": {"env": {"FARM_HEARTBEAT_TTL_S": "5"}},
    "pools": [
        {"name": "default", "replicas": 3},
        {
            "name": "ds",
            "maxSessions": 8,
            "env": {"FARM_OPEN_WAIT_S": "60"},
            "sandbox": {"memoryMb": 2048, "pids": 256},
            "engineResources": {
                "requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"cpu": "2", "memory": "3Gi"},
            },
            "autoscaling": {
                "enabled": True,
                "minReplicas": 0,
                "maxReplicas": 6,
                "chunksPerWorker": 1,
                "opensPerWorker": 2,
            },
        },
        {
            "name": "node",
            "farmImage": "js-tools",
            "sandboxImage": "other.example/js:1",
            "replicas": 0,
        },
    ],
}
VALUE_SETS["pools"] = POOLS
VALUE_SETS["egress-ca"] = {
    "egress": {"allow": ["pypi.org"], "caBundle": {"secret": "corp-ca", "key": "ca.pem"}}
}
VALUE_SETS["pools-hpa"] = {
    **POOLS,
    "sandbox": {**POOLS["sandbox"], "memoryMb": 768},
    "autoscaling": {"engine": "hpa"},
}
POOL_NAMES = ["default", "ds", "node"]
# Every pool scaled by KEDA, which also asks a Prometheus for the work waiting inside workers;
# ds has a target of its own.
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
VALUE_SETS["pools-keda-prometheus"] = {
    **POOLS,
    "pools": [
        {**pool, "autoscaling": {**pool["autoscaling"], "waitingPerWorker": 8}}
        if pool["name"] == "ds"
        else pool
        for pool in POOLS["pools"]
    ],
    "autoscaling": {"enabled": True, "keda": {"prometheus": {"serverAddress": PROMETHEUS}}},
}

# KEDA's ScaledObject is a custom resource that kubernetes-validate has no schema for: it is
# checked against the part of KEDA's CRD (keda.sh/v1alpha1) that the chart uses. Trigger
# metadata values must be strings there, a classic mistake with listLength.
INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
# The CRD types a trigger's metadata only as strings: each scaler reads its own keys and
# ignores others, so a misspelt key (listlength) would pass the CRD and leave the scaler
# without its target. The chart's trigger types are checked against the keys KEDA's scaler
# documentation lists (keda.sh/docs/2.x/scalers/redis-lists, .../prometheus).
UNSIGNED = {"type": "string", "pattern": "^[0-9]+$"}
BOOLEAN = {"enum": ["true", "false"]}
TRIGGER_METADATA: dict[str, dict[str, Any]] = {
    "redis": {
        "type": "object",
        "additionalProperties": False,
        "required": ["address", "listName", "listLength"],
        "properties": {
            "address": {"type": "string", "pattern": "^.+:[0-9]+$"},
            "listName": {"type": "string", "minLength": 1},
            "listLength": UNSIGNED,
            "activationListLength": UNSIGNED,
            "databaseIndex": UNSIGNED,
            "enableTLS": BOOLEAN,
            "unsafeSsl": BOOLEAN,
        },
    },
    "prometheus": {
        "type": "object",
        "additionalProperties": False,
        "required": ["serverAddress", "query", "threshold"],
        "properties": {
            "serverAddress": {"type": "string", "pattern": "^https?://"},
            "query": {"type": "string", "minLength": 1},
            "threshold": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$"},
            "activationThreshold": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$"},
            "ignoreNullValues": BOOLEAN,
            "unsafeSsl": BOOLEAN,
        },
    },
}
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
                        "allOf": [
                            {
                                "if": {"properties": {"type": {"const": kind}}},
                                "then": {"properties": {"metadata": metadata}},
                            }
                            for kind, metadata in TRIGGER_METADATA.items()
                        ],
                        "properties": {
                            "type": {"enum": list(TRIGGER_METADATA)},
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


def triggers(scaled: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A ScaledObject's triggers by name (names are unique: KEDA refers to triggers by them)."""
    named = {t["name"]: t for t in scaled["spec"]["triggers"]}
    assert len(named) == len(scaled["spec"]["triggers"]), "trigger names repeat"
    return named


def external_metrics(hpa: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An HPA's External metrics by the list they measure (label ``queue``), in order."""
    metrics = [m["external"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]
    named = {m["metric"]["selector"]["matchLabels"]["queue"]: m for m in metrics}
    assert len(named) == len(metrics), "a list is measured twice"
    return named


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner name, pod spec) of every workload."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(spec) if c["name"] == name)


def worker_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = find(objects, "Deployment", f"{FULLNAME}-worker-default")
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
def hpa() -> list[dict[str, Any]]:
    return render(VALUE_SETS["gvisor-hpa"])


@pytest.fixture(scope="module")
def pools() -> list[dict[str, Any]]:
    return render(VALUE_SETS["pools"])


@pytest.fixture(scope="module")
def pools_hpa() -> list[dict[str, Any]]:
    return render(VALUE_SETS["pools-hpa"])


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
    assert find(default, "Deployment", f"{FULLNAME}-worker-default")["spec"]["replicas"] == 2


def test_values_that_make_no_sense_are_refused() -> None:
    # values.schema.json, checked by render and lint alike
    with pytest.raises(helm.HelmError, match="/sandbox/mode"):
        render({"sandbox": {"mode": "sidecar"}})
    # no mode the chart cannot run: sandboxes as pods need a backend farm does not have
    with pytest.raises(helm.HelmError, match="/sandbox/mode"):
        render({"sandbox": {"mode": "pod"}})
    report = helm.lint(CHART, {"autoscaling": {"engine": "cpu"}}, strict=True)
    assert any("/autoscaling/engine" in e for e in report["errors"]), report
    # a misspelt scaling key would silently leave the default target in place
    with pytest.raises(helm.HelmError, match="/autoscaling"):
        render({"autoscaling": {"queueLenghtPerWorker": 2}})
    with pytest.raises(helm.HelmError, match="/autoscaling/keda"):
        render({"autoscaling": {"keda": {"redisAdress": "redis.example:6379"}}})
    with pytest.raises(helm.HelmError, match="/autoscaling/keda/redisAddress"):
        render({"autoscaling": {"keda": {"redisAddress": "redis://redis.example:6379/0"}}})
    with pytest.raises(helm.HelmError, match="/autoscaling/keda/prometheus/serverAddress"):
        render({"autoscaling": {"keda": {"prometheus": {"serverAddress": "prometheus:9090"}}}})
    with pytest.raises(helm.HelmError, match="/autoscaling/waitingPerWorker"):
        render({"autoscaling": {"waitingPerWorker": 0}})
    # cross-field rules in the templates
    with pytest.raises(helm.HelmError, match="redis.externalUrl is required"):
        render({"redis": {"enabled": False, "auth": {"existingSecret": "broker-auth"}}})
    with pytest.raises(helm.HelmError, match="redisAddress"):
        render({**VALUE_SETS["external-redis"], "autoscaling": {"enabled": True}})


def test_pool_values_that_make_no_sense_are_refused() -> None:
    with pytest.raises(helm.HelmError, match="/pools/0"):
        render({"pools": [{"name": "ds", "image": "typo-for-farmImage"}]})
    with pytest.raises(helm.HelmError, match="/pools/0/name"):
        render({"pools": [{"name": "Has_Capitals"}]})
    with pytest.raises(helm.HelmError, match="/pools"):
        render({"pools": []})
    with pytest.raises(helm.HelmError, match="/pools/0/autoscaling/chunksPerWorker"):
        render({"pools": [{"name": "ds", "autoscaling": {"chunksPerWorker": 0}}]})
    with pytest.raises(helm.HelmError, match="/pools/0/autoscaling/opensPerWorker"):
        render({"pools": [{"name": "ds", "autoscaling": {"opensPerWorker": 0}}]})
    with pytest.raises(helm.HelmError, match='"ds" is given twice'):
        render({"pools": [{"name": "ds"}, {"name": "ds"}]})
    with pytest.raises(helm.HelmError, match="worker.farmImage is gone"):
        render({"worker": {"farmImage": "ds"}})
    # dind: a sandbox bigger than its engine's memory would take the engine down with it
    with pytest.raises(helm.HelmError, match=r'pool "ds": its engine.s memory limit \(1024Mi\)'):
        render({"pools": [{"name": "ds", "sandbox": {"memoryMb": 2048}}]})


# --- isolation of user code -------------------------------------------------------------------


def test_user_code_cannot_reach_redis(default: list[dict[str, Any]]) -> None:
    # Redis admits workers and labelled clients only.
    redis_policy = find(default, "NetworkPolicy", f"{FULLNAME}-redis")
    assert admits_pod(redis_policy, worker_pod(default)["metadata"]["labels"])
    assert admits_pod(redis_policy, {"farm-client": "true"})
    assert not admits_pod(redis_policy, {"app": "anything-else"})
    assert redis_policy["spec"]["egress"] == []
    # The sandbox is a container of the pod's own engine, which has no bridge and no
    # iptables, and the worker asks for --network none: no interface but loopback.
    spec = worker_pod(default)["spec"]
    engine = container(spec, "engine")
    assert {"--bridge=none", "--iptables=false", "--ip-forward=false"} <= set(engine["args"])
    hosts = [a for a in engine["args"] if a.startswith("--host")]
    assert hosts and all(h.startswith("--host=unix://") for h in hosts), "no TCP API"
    worker_env = env(container(spec, "worker"))
    assert worker_env["FARM_SANDBOX_NETWORK"] == "none"
    assert worker_env["FARM_BACKEND"] == "docker"
    assert worker_env["DOCKER_HOST"] == "unix:///run/farm-docker/docker.sock"


def test_the_workers_network_policy_follows_the_egress_ceiling(
    default: list[dict[str, Any]],
) -> None:
    """No ceiling: no egress variable and nothing opened beyond DNS, Redis and the registry;
    a ceiling: the worker gets it and its policy opens the proxy's ports (and the private
    ranges named), never the cloud metadata range."""
    worker_policy = find(default, "NetworkPolicy", f"{FULLNAME}-worker")
    assert len(worker_policy["spec"]["egress"]) == 3
    assert "FARM_EGRESS_ALLOW" not in env(container(worker_pod(default)["spec"], "worker"))
    objects = render({"egress": {"allow": ["pypi.org", "*.example.org:443"],
                                 "allowPrivate": ["10.9.0.0/16"]}})  # fmt: skip
    worker_env = env(container(worker_pod(objects)["spec"], "worker"))
    assert worker_env["FARM_EGRESS_ALLOW"] == "pypi.org,*.example.org:443"
    assert worker_env["FARM_EGRESS_ALLOW_PRIVATE"] == "10.9.0.0/16"
    rules = find(objects, "NetworkPolicy", f"{FULLNAME}-worker")["spec"]["egress"]
    (proxy,) = rules[3:]
    assert [p["port"] for p in proxy["ports"]] == [80, 443]
    public, private = proxy["to"]
    assert public["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert "169.254.0.0/16" in public["ipBlock"]["except"]
    assert private == {"ipBlock": {"cidr": "10.9.0.0/16"}}


def test_the_egress_ca_bundle_reaches_the_worker_and_its_engine_at_one_path() -> None:
    """``egress.caBundle``: with a ceiling, the bundle is mounted read-only at the same path in
    the worker (which names it in ``FARM_EGRESS_CA_BUNDLE``) and in the engine, which
    bind-mounts that path into sandboxes; without a ceiling, nothing of it is rendered."""
    bundle = {"configMap": "corp-ca", "key": "gateway.pem"}
    objects = render({"egress": {"allow": ["pypi.org"], "caBundle": bundle}})
    spec = worker_pod(objects)["spec"]
    path = env(container(spec, "worker"))["FARM_EGRESS_CA_BUNDLE"]
    assert path == "/etc/farm/egress-ca/gateway.pem"
    for name in ("worker", "engine"):
        (mount,) = [m for m in container(spec, name)["volumeMounts"] if m["name"] == "egress-ca"]
        assert mount == {"name": "egress-ca", "mountPath": "/etc/farm/egress-ca", "readOnly": True}
    (volume,) = [v for v in spec["volumes"] if v["name"] == "egress-ca"]
    assert volume["configMap"] == {
        "name": "corp-ca",
        "items": [{"key": "gateway.pem", "path": "gateway.pem"}],
    }
    secret = render({"egress": {"allow": ["pypi.org"], "caBundle": {"secret": "corp-ca"}}})
    (volume,) = [v for v in worker_pod(secret)["spec"]["volumes"] if v["name"] == "egress-ca"]
    assert volume["secret"]["secretName"] == "corp-ca"
    unused = worker_pod(render({"egress": {"caBundle": bundle}}))["spec"]
    assert "FARM_EGRESS_CA_BUNDLE" not in env(container(unused, "worker"))
    assert all(v["name"] != "egress-ca" for v in unused["volumes"])
    with pytest.raises(helm.HelmError, match="configMap or secret, not both"):
        render({"egress": {"caBundle": {"configMap": "a", "secret": "b"}}})


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
    default: list[dict[str, Any]],
    hpa: list[dict[str, Any]],
    pools: list[dict[str, Any]],
    pools_hpa: list[dict[str, Any]],
) -> None:
    checked = 0
    for objects in (default, hpa, pools, pools_hpa):
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
    # worker and redis of the two single-pool renders; each pool's worker and redis of two
    # more; and the API server's container in each of the four
    assert checked == 2 * 2 + 2 * (len(POOL_NAMES) + 1) + 4


def test_only_the_dind_engine_is_privileged(
    default: list[dict[str, Any]], pools: list[dict[str, Any]]
) -> None:
    privileged = [
        (owner, c["name"])
        for owner, spec in pod_specs(default)
        for c in containers(spec)
        if c.get("securityContext", {}).get("privileged")
    ]
    assert privileged == [(f"{FULLNAME}-worker-default", "engine")]
    privileged_in_pools = {
        owner: c["name"]
        for owner, spec in pod_specs(pools)
        for c in containers(spec)
        if c.get("securityContext", {}).get("privileged")
    }
    assert privileged_in_pools == {f"{FULLNAME}-worker-{name}": "engine" for name in POOL_NAMES}


def test_no_service_account_token_and_no_api_rights(
    default: list[dict[str, Any]], pools: list[dict[str, Any]]
) -> None:
    """Nothing of farm talks to the Kubernetes API: no pod gets a token, no role is made."""
    for objects in (default, pools):
        specs = list(pod_specs(objects))
        assert len(specs) >= 2
        for owner, spec in specs:
            assert spec["automountServiceAccountToken"] is False, owner
        assert not kinds(objects) & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def test_runtime_class_reaches_the_pods_that_hold_user_code(hpa: list[dict[str, Any]]) -> None:
    kata = render({"runtimeClassName": "kata"})
    assert worker_pod(kata)["spec"]["runtimeClassName"] == "kata"
    assert worker_pod(hpa)["spec"]["runtimeClassName"] == "gvisor"
    assert "runtimeClassName" not in worker_pod(render())["spec"]


def test_sandbox_limits_follow_the_values(hpa: list[dict[str, Any]]) -> None:
    spec = worker_pod(hpa)["spec"]
    worker = container(spec, "worker")
    worker_env = env(worker)
    assert worker_env["FARM_BACKEND"] == "docker"
    assert worker_env["FARM_SANDBOX_IMAGE"] == "registry.example/farm-sandbox:0.1.0"
    assert (worker_env["FARM_SANDBOX_MEMORY_MB"], worker_env["FARM_SANDBOX_CPUS"]) == ("768", "1")
    # the pull secret reaches the worker's Docker client, mounted as its config
    assert worker_env["DOCKER_CONFIG"] == "/etc/farm/docker"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["pull-secret"]["secret"]["secretName"] == "regcred"
    assert {"name": "pull-secret", "mountPath": "/etc/farm/docker", "readOnly": True} in worker[
        "volumeMounts"
    ]


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
    default: list[dict[str, Any]],
    hpa: list[dict[str, Any]],
    pools: list[dict[str, Any]],
    pools_hpa: list[dict[str, Any]],
) -> None:
    for objects in (default, hpa, pools, pools_hpa):
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
    pdb = find(default, "PodDisruptionBudget", f"{FULLNAME}-worker-default")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"], worker_pod(default)["metadata"]["labels"])


def test_keda_scales_workers_on_the_shared_queue_and_the_opens_and_chunks_backlog() -> None:
    objects = render(VALUE_SETS["dind-keda-kata"])
    deployment = find(objects, "Deployment", f"{FULLNAME}-worker-default")
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    scaled = find(objects, "ScaledObject", f"{FULLNAME}-worker-default")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    by_name = triggers(scaled)
    assert set(by_name) == {"queue", "opens", "chunks"}, "no Prometheus address: no prometheus"
    queue, opens, chunks = by_name["queue"], by_name["opens"], by_name["chunks"]
    assert queue["type"] == opens["type"] == chunks["type"] == "redis"
    assert queue["metadata"]["listName"] == "farm.default"
    assert queue["metadata"]["listLength"] == "4"
    # session opens and map chunks wait in lists of their own, each with a target of its own
    assert opens["metadata"]["listName"] == "farm.default.opens"
    assert opens["metadata"]["listLength"] == "4"
    assert chunks["metadata"]["listName"] == "farm.default.chunks"
    assert chunks["metadata"]["listLength"] == "2"
    for trigger in (queue, opens, chunks):
        assert trigger["metadata"]["address"] == f"{FULLNAME}-redis.{NAMESPACE}.svc:6379"
        assert trigger["metadata"]["enableTLS"] == "false"
    # one TriggerAuthentication, the chart's, for every list
    (auth,) = [o for o in objects if o["kind"] == "TriggerAuthentication"]
    for trigger in (queue, opens, chunks):
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    redis_policy = find(objects, "NetworkPolicy", f"{FULLNAME}-redis")
    peers = [p for rule in redis_policy["spec"]["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in peers


def test_keda_reads_the_queues_in_the_brokers_database() -> None:
    """The queues live in the database the broker URL names: a trigger reading another one
    would see them empty and never scale."""
    external = {
        **VALUE_SETS["external-redis"],
        "autoscaling": {"enabled": True, "keda": {"redisAddress": "redis.example:6379"}},
    }
    for url, database in [
        ("redis://redis.example:6379/3", "3"),
        ("redis://redis.example:6379/12?health_check_interval=10", "12"),
        ("redis://redis.example:6379", "0"),
    ]:
        external["redis"] = {**external["redis"], "externalUrl": url}
        scaled = find(render(external), "ScaledObject", f"{FULLNAME}-worker-default")
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["metadata"]["address"] == "redis.example:6379"
            assert trigger["metadata"]["databaseIndex"] == database, url
    bundled = render(VALUE_SETS["dind-keda-kata"])
    scaled = find(bundled, "ScaledObject", f"{FULLNAME}-worker-default")
    assert {t["metadata"]["databaseIndex"] for t in scaled["spec"]["triggers"]} == {"0"}


def test_hpa_scales_workers_on_external_metrics_of_every_list(hpa: list[dict[str, Any]]) -> None:
    """The same signals as KEDA's: one External metric (the adapter's, labelled with the list)
    per list, each with its target per worker."""
    scaler = find(hpa, "HorizontalPodAutoscaler", f"{FULLNAME}-worker-default")
    assert scaler["spec"]["scaleTargetRef"]["name"] == f"{FULLNAME}-worker-default"
    assert scaler["spec"]["maxReplicas"] == 20
    metrics = external_metrics(scaler)
    assert list(metrics) == ["farm.default", "farm.default.opens", "farm.default.chunks"]
    for metric in metrics.values():
        assert metric["metric"]["name"] == "farm_queue_length"
        assert metric["target"]["type"] == "AverageValue"
    assert metrics["farm.default"]["target"]["averageValue"] == "4"
    assert metrics["farm.default.opens"]["target"]["averageValue"] == "4"
    assert metrics["farm.default.chunks"]["target"]["averageValue"] == "2"
    adapter = {"enabled": True, "engine": "hpa", "hpa": {"metricName": "redis_key_size"}}
    renamed = render({**VALUE_SETS["gvisor-hpa"], "autoscaling": adapter})
    scaler = find(renamed, "HorizontalPodAutoscaler", f"{FULLNAME}-worker-default")
    names = {m["metric"]["name"] for m in external_metrics(scaler).values()}
    assert names == {"redis_key_size"}


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


def test_notes_say_the_engine_sidecar_is_privileged() -> None:
    assert "privileged" in notes()


# --- worker pools -----------------------------------------------------------------------------


def pool_worker(objects: list[dict[str, Any]], pool: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Deployment, its worker container's env) of ``pool``."""
    deployment = find(objects, "Deployment", f"{FULLNAME}-worker-{pool}")
    return deployment, env(container(deployment["spec"]["template"]["spec"], "worker"))


def test_each_pool_is_a_deployment_serving_its_own_image_with_its_limits(
    pools: list[dict[str, Any]],
) -> None:
    deployments = [o["metadata"]["name"] for o in pools if o["kind"] == "Deployment"]
    workers = [name for name in deployments if name != f"{FULLNAME}-api"]
    assert sorted(workers) == [f"{FULLNAME}-worker-{name}" for name in POOL_NAMES]
    default, default_env = pool_worker(pools, "default")
    assert default["spec"]["replicas"] == 3
    assert default_env["FARM_IMAGE"] == "default"
    assert default_env["FARM_SANDBOX_IMAGE"] == "registry.example:5000/farm-sandbox:0.1.0"
    assert default_env["FARM_SANDBOX_MEMORY_MB"] == "512"
    assert default_env["FARM_HEARTBEAT_TTL_S"] == "5"
    ds, ds_env = pool_worker(pools, "ds")
    assert "replicas" not in ds["spec"], "its autoscaler owns the replica count"
    assert ds_env["FARM_IMAGE"] == "ds"
    # an environment's image defaults to the default pool's repository, tagged with its name
    assert ds_env["FARM_SANDBOX_IMAGE"] == "registry.example:5000/farm-sandbox:ds"
    assert (ds_env["FARM_SANDBOX_MEMORY_MB"], ds_env["FARM_SANDBOX_PIDS"]) == ("2048", "256")
    assert ds_env["FARM_SANDBOX_CPUS"] == "1"  # what the pool does not say, sandbox.* says
    assert ds_env["FARM_MAX_SESSIONS"] == "8" and default_env["FARM_MAX_SESSIONS"] == "32"
    assert ds_env["FARM_OPEN_WAIT_S"] == "60" and ds_env["FARM_HEARTBEAT_TTL_S"] == "5"
    engine = container(ds["spec"]["template"]["spec"], "engine")
    assert engine["resources"]["limits"]["memory"] == "3Gi"
    node, node_env = pool_worker(pools, "node")
    assert node["spec"]["replicas"] == 0
    assert node_env["FARM_IMAGE"] == "js-tools"
    assert node_env["FARM_SANDBOX_IMAGE"] == "other.example/js:1"


def test_pools_never_share_pods_and_every_pool_is_covered_by_the_policies(
    pools: list[dict[str, Any]],
) -> None:
    templates = {name: pool_worker(pools, name)[0] for name in POOL_NAMES}
    for name, deployment in templates.items():
        selector = deployment["spec"]["selector"]
        for other, other_deployment in templates.items():
            labels = other_deployment["spec"]["template"]["metadata"]["labels"]
            assert selects(selector, labels) is (name == other), (name, other)
        pdb = find(pools, "PodDisruptionBudget", f"{FULLNAME}-worker-{name}")
        assert pdb["spec"]["selector"] == selector
    worker_policy = find(pools, "NetworkPolicy", f"{FULLNAME}-worker")
    redis_policy = find(pools, "NetworkPolicy", f"{FULLNAME}-redis")
    service = find(pools, "Service", f"{FULLNAME}-worker")
    for deployment in templates.values():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(worker_policy["spec"]["podSelector"], labels)
        assert selects({"matchLabels": service["spec"]["selector"]}, labels)
        assert admits_pod(redis_policy, labels)


def test_every_pool_keeps_the_sandbox_hardening(pools: list[dict[str, Any]]) -> None:
    privileged = [
        (owner, c["name"])
        for owner, spec in pod_specs(pools)
        for c in containers(spec)
        if c.get("securityContext", {}).get("privileged")
    ]
    assert sorted(privileged) == [(f"{FULLNAME}-worker-{name}", "engine") for name in POOL_NAMES]
    for name in POOL_NAMES:
        deployment, worker_env = pool_worker(pools, name)
        spec = deployment["spec"]["template"]["spec"]
        engine = container(spec, "engine")
        assert {"--bridge=none", "--iptables=false", "--ip-forward=false"} <= set(engine["args"])
        assert worker_env["FARM_SANDBOX_NETWORK"] == "none"
        assert spec["automountServiceAccountToken"] is False
        assert not any(v.get("hostPath") for v in spec["volumes"])


def test_an_autoscaled_pool_scales_on_its_own_queue(pools: list[dict[str, Any]]) -> None:
    scaled = [o for o in pools if o["kind"] == "ScaledObject"]
    assert [o["metadata"]["name"] for o in scaled] == [f"{FULLNAME}-worker-ds"]
    (ds,) = scaled
    assert ds["spec"]["scaleTargetRef"]["name"] == f"{FULLNAME}-worker-ds"
    assert (ds["spec"]["minReplicaCount"], ds["spec"]["maxReplicaCount"]) == (0, 6)
    by_name = triggers(ds)
    assert by_name["queue"]["metadata"]["listName"] == "farm.ds"
    assert by_name["queue"]["metadata"]["listLength"] == "4"  # autoscaling.* says
    # the pool's own target for its chunks (a map wakes a pool at zero too)
    assert by_name["chunks"]["metadata"]["listName"] == "farm.ds.chunks"
    assert by_name["chunks"]["metadata"]["listLength"] == "1"
    assert by_name["opens"]["metadata"]["listName"] == "farm.ds.opens"
    assert by_name["opens"]["metadata"]["listLength"] == "2"
    # KEDA reads the queue's length in Redis, though autoscaling.enabled (the default) is false
    redis_policy = find(pools, "NetworkPolicy", f"{FULLNAME}-redis")
    peers = [p for rule in redis_policy["spec"]["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in peers
    assert "keda" not in json.dumps(find(render(), "NetworkPolicy", f"{FULLNAME}-redis"))


def test_an_hpa_scaled_pool_scales_on_its_own_queue(pools_hpa: list[dict[str, Any]]) -> None:
    (scaler,) = [o for o in pools_hpa if o["kind"] == "HorizontalPodAutoscaler"]
    assert scaler["spec"]["scaleTargetRef"]["name"] == f"{FULLNAME}-worker-ds"
    targets = {q: m["target"]["averageValue"] for q, m in external_metrics(scaler).items()}
    assert targets == {"farm.ds": "4", "farm.ds.opens": "2", "farm.ds.chunks": "1"}


def test_keda_asks_prometheus_for_the_work_waiting_inside_the_workers() -> None:
    """With a Prometheus address each ScaledObject gets a third trigger: opens and map items
    waiting inside the pool's workers for a box, summed over the workers, per worker; without
    one, or with the HPA engine, nothing of it is rendered."""
    values = VALUE_SETS["pools-keda-prometheus"]
    objects = render(values)
    waiting = {
        pool: triggers(find(objects, "ScaledObject", f"{FULLNAME}-worker-{pool}"))["waiting"]
        for pool in POOL_NAMES
    }
    assert waiting["default"] == {
        "type": "prometheus",
        "name": "waiting",
        "metadata": {
            "serverAddress": PROMETHEUS,
            "query": 'sum(farm_work_waiting{image="default"})',
            "threshold": "24",
        },
    }, "no authenticationRef: the Redis password is not Prometheus' business"
    assert waiting["ds"]["metadata"]["threshold"] == "8"  # the pool's own target
    assert waiting["node"]["metadata"]["query"] == 'sum(farm_work_waiting{image="js-tools"})'
    # the Redis triggers stay, with their TriggerAuthentication
    ds = triggers(find(objects, "ScaledObject", f"{FULLNAME}-worker-ds"))
    assert [ds[name]["type"] for name in ("queue", "opens", "chunks")] == ["redis"] * 3
    assert "waiting" in notes(values) and PROMETHEUS in notes(values)
    # KEDA's operator reaches Prometheus, not farm: farm's policies are the same without it
    without = render({**values, "autoscaling": {"enabled": True}})
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert policies == [o for o in without if o["kind"] == "NetworkPolicy"]
    for scaled in (o for o in without if o["kind"] == "ScaledObject"):
        assert set(triggers(scaled)) == {"queue", "opens", "chunks"}
    assert "farm_work_waiting" not in notes({**values, "autoscaling": {"enabled": True}})
    # the HPA engine has no Prometheus trigger: the address changes nothing there
    hpa = render({**values, "autoscaling": {**values["autoscaling"], "engine": "hpa"}})
    scaler = find(hpa, "HorizontalPodAutoscaler", f"{FULLNAME}-worker-ds")
    assert [m["type"] for m in scaler["spec"]["metrics"]] == ["External"] * 3


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_autoscaler_watches_every_list_of_its_pool(values: dict[str, Any]) -> None:
    """Whatever the engine and pools, a pool that scales reads every place its work waits in
    Redis: without the opens or chunks list, a backlog of sessions or maps would never add a
    worker."""
    objects = render(values)
    scalers = [o for o in objects if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    for scaler in scalers:
        pool = scaler["metadata"]["labels"]["farm.pool"]
        _, worker_env = pool_worker(objects, pool)
        queue = f"farm.{worker_env['FARM_IMAGE']}"
        if scaler["kind"] == "ScaledObject":
            redis = [t for t in scaler["spec"]["triggers"] if t["type"] == "redis"]
            lists = [t["metadata"]["listName"] for t in redis]
        else:
            lists = list(external_metrics(scaler))
        assert lists == [queue, f"{queue}.opens", f"{queue}.chunks"], scaler["metadata"]["name"]
        if scaler["kind"] == "ScaledObject" and "waiting" in triggers(scaler):
            # the label is the image the pool's workers serve, not the pool's name
            query = triggers(scaler)["waiting"]["metadata"]["query"]
            assert query == f'sum(farm_work_waiting{{image="{worker_env["FARM_IMAGE"]}"}})'
    autoscaled = values.get("autoscaling", {}).get("enabled") or any(
        p.get("autoscaling", {}).get("enabled") for p in values.get("pools", [])
    )
    assert bool(scalers) == bool(autoscaled)


def test_the_api_is_a_deployment_and_service_with_probes_and_its_token_secret(
    default: list[dict[str, Any]],
) -> None:
    deployment = find(default, "Deployment", f"{FULLNAME}-api")
    pod = deployment["spec"]["template"]
    api = container(pod["spec"], "api")
    assert api["command"][:2] == ["farm", "serve"] and "0.0.0.0" in api["command"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert api[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    api_env = env(api)
    secret = find(default, "Secret", f"{FULLNAME}-api-token")
    assert api_env["FARM_API_TOKEN"] == {
        "secretKeyRef": {"name": f"{FULLNAME}-api-token", "key": "token"}
    }
    assert len(secret["data"]["token"]) > 40  # made by the chart, never a literal in the pod
    assert "secretKeyRef" in api_env["FARM_BROKER_PASSWORD"]
    assert pod["metadata"]["labels"]["farm-client"] == "true"  # Redis' policy admits it
    service = find(default, "Service", f"{FULLNAME}-api")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not [o for o in render({"api": {"enabled": False}}) if "api" in o["metadata"]["name"]]
