"""``farm doctor``: check what farm needs, in order, and say in plain words what to fix.

A check that passes but leaves the farm exposed is a warning (``warn``): a broker that anyone
who reaches it may use works, and lets them run code in every sandbox and read every result.
"May use" means what matters, reading or writing farm's keys, not a PING: an ACL may let the
``default`` user PING and nothing else.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import FarmError
from farm.image_name import ImageName, ServedImage
from farm.settings import FarmSettings

if TYPE_CHECKING:
    import redis


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # works, but should be fixed (``ok`` stays True: doctor does not fail)


def run_checks(settings: FarmSettings) -> Iterator[Check]:
    docker_ok = False
    try:
        import docker

        client = docker.from_env(timeout=5)
        version = client.version().get("Version", "?")
        docker_ok = True
        yield Check("docker", True, f"engine {version} answers")
    except Exception as exc:
        yield Check(
            "docker",
            False,
            str(exc)[:200],
            "run `make setup` (scripts/bootstrap installs and starts Docker), or "
            "start your Docker daemon and make sure you may use it",
        )
    server = shutil.which("redis-server")
    yield Check(
        "redis-server",
        server is not None,
        server or "not installed",
        "apt-get install redis-server (or run `make setup`)",
    )
    yield from broker_checks(settings)
    yield egress_check(settings)
    if not docker_ok:
        return
    from farm.sandbox.served import resolve, sandbox_ref

    name = ImageName(settings.image)
    ref = sandbox_ref(name, settings.sandbox_image)
    served = None
    with contextlib.suppress(Exception):
        served = resolve(name, ref, client)
    if served is None:
        yield Check(
            "sandbox image", False, f"{ref} is missing", "run `farm image build` (or `make setup`)"
        )
        return
    yield Check("sandbox image", True, f"{served.tag} {served.image_id[:19]}")
    yield from _kernel_checks(settings, served)


def egress_check(settings: FarmSettings) -> Check:
    """What boxes may reach (the ceiling): nothing is fine; anything with any port, a private
    range as wide as the internet or a CA bundle that is not there are said."""
    from farm.egress.policy import PolicyError, box_policy

    egress = settings.egress
    if not egress.allow:
        return Check("egress", True, "none: no box reaches anything (FARM_EGRESS_ALLOW is empty)")
    try:
        ceiling = box_policy(egress.allow, egress.allow, egress.allow_private)
    except PolicyError as exc:
        return Check("egress", False, str(exc), "fix FARM_EGRESS_ALLOW / _ALLOW_PRIVATE")
    if egress.ca_bundle is not None and not egress.ca_bundle.is_file():
        return Check(
            "egress", False, f"FARM_EGRESS_CA_BUNDLE {egress.ca_bundle} is not a file", "fix it"
        )
    detail = f"boxes may be allowed {ceiling.describe()}"
    if ceiling.private:
        detail += f"; private ranges opened: {', '.join(map(str, ceiling.private))}"
    wide = [net for net in ceiling.private if net.prefixlen < 8]
    if "*:*" in map(str, ceiling.rules) or wide:
        return Check(
            "egress",
            True,
            detail,
            "a box may ask for any host and port"
            + (f" and reach {', '.join(map(str, wide))}" if wide else "")
            + ": name hosts in FARM_EGRESS_ALLOW",
            warn=True,
        )
    return Check("egress", True, detail)


# What a client without credentials lacks: user, password, and a TLS client certificate (it
# keeps the CA, to reach a TLS broker at all).
ANONYMOUS_WITHOUT = ("username", "password", "credential_provider", "ssl_certfile", "ssl_keyfile")


def broker_checks(settings: FarmSettings) -> Iterator[Check]:
    """The broker answers this client; then, whether it also answers a client without
    credentials (a warning: whoever reaches it can submit code)."""
    import redis
    from kombu.utils.url import maybe_sanitize_url

    from farm.broker_errors import broker_error
    from farm.registry import Registry

    url = maybe_sanitize_url(settings.broker_url)  # never print a password
    try:
        registry = Registry.connect(settings)
    except FarmError as exc:  # a setting that cannot work (TLS files with redis://)
        yield Check("broker", False, f"{url}: {exc}", "fix the FARM_BROKER_* settings")
        return
    pool = registry.redis.connection_pool
    anonymous = redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class,
            **{k: v for k, v in pool.connection_kwargs.items() if k not in ANONYMOUS_WITHOUT},
        )
    )
    try:
        registry.redis.ping()
    except Exception as exc:
        yield Check(
            "broker",
            False,
            str(broker_error(exc, url, sent=False)),
            "start one with `farm up`, or set FARM_BROKER_URL (and FARM_BROKER_PASSWORD) to "
            "your Redis (not needed for `farm sweep --local N`)",
        )
        return
    else:
        yield Check("broker", True, f"{url} answers")
        rights, why = anonymous_rights(anonymous, settings)
        yield Check(
            "broker authentication",
            True,
            f"{url} lets clients without credentials {' and '.join(rights)} farm's keys: "
            f"{exposure(rights)}"
            if rights
            else f"{url} refuses clients without credentials: they may neither read nor write "
            f"farm's keys ({why})",
            "give Redis a password (requirepass, or an ACL user and `user default off`) and "
            "the farm's clients FARM_BROKER_PASSWORD: docs/security.md, Control plane",
            warn=bool(rights),
        )
    finally:
        anonymous.close()
        registry.close()


def anonymous_rights(anonymous: redis.Redis, settings: FarmSettings) -> tuple[list[str], str]:
    """What ``anonymous`` (a client without credentials) may do to farm's keys, asked without
    changing any: ``read`` the registry's set of workers, ``write`` a key in the shared queue's
    namespace (DEL of a key that does not exist: a no-op that needs write access). Returns
    those rights and, for the ones it lacks, what the broker answered (NOAUTH, NOPERM, a TLS
    handshake it refused)."""
    import redis

    from farm.image_name import ImageName
    from farm.registry import PREFIX

    probe_key = f"{ImageName(settings.image).queue}.doctor-{uuid.uuid4().hex}"
    probes: dict[str, Callable[[], object]] = {
        "read": lambda: anonymous.smembers(f"{PREFIX}workers"),
        "write": lambda: anonymous.delete(probe_key),
    }
    rights: list[str] = []
    refusals: set[str] = set()
    for right, probe in probes.items():
        try:
            probe()
        except redis.RedisError as exc:
            refusals.add(type(exc).__name__)
        else:
            rights.append(right)
    return rights, ", ".join(sorted(refusals))


def exposure(rights: list[str]) -> str:
    """What whoever reaches the broker can do with ``rights`` over farm's keys."""
    what = []
    if "write" in rights:
        what.append("run code in every sandbox")
    if "read" in rights:
        what.append("read every result")
    return f"anyone who reaches it can {' and '.join(what)}"


def _kernel_checks(settings: FarmSettings, image: ServedImage | None = None) -> Iterator[Check]:
    """A kernel round trip in a sandbox of these settings, then what such a sandbox holds."""
    import tempfile

    from farm.sandbox.docker import DockerSandbox
    from farm.sandbox.served import serve

    try:
        with (
            tempfile.TemporaryDirectory(prefix="farm-doctor-", ignore_cleanup_errors=True) as tmp,
            DockerSandbox(
                image or serve(ImageName(settings.image), settings.sandbox_image),
                owner="doctor",
                limits=settings.limits,
                socket_dir=Path(tmp),
            ) as box,
            box.kernel() as kernel,
        ):
            session = kernel.open_session()
            result = kernel.execute(session["session_id"], "6 * 7", epoch=1, timeout_s=10)
            fallback = box.info().isolation_fallback
            pong = kernel.ping()
    except Exception as exc:
        yield Check(
            "kernel round trip",
            False,
            str(exc)[:300],
            "rebuild the image with `farm image build --force`",
        )
        return
    value = result["value"]["text"] if result["value"] is not None else None
    ok = value == "42"
    if ok and fallback:  # works, but boxes share the loopback network, disk and processes
        yield Check(
            "kernel round trip",
            True,
            f"6 * 7 -> {value}, but BOXES HAVE NO NAMESPACES: {fallback}",
            "load farm's AppArmor profile (deploy/apparmor/farm-sandbox, README Security "
            "model) or run rootful Docker with its default seccomp profile",
            warn=True,
        )
    else:
        yield Check(
            "kernel round trip",
            ok,
            f"6 * 7 -> {value} in a hardened sandbox, boxes with namespaces",
            "see the worker/container logs; rebuild with `farm image build --force`",
        )
    yield capacity_check(settings, pong["capacity"]["boxes"], pong["capacity"]["binding"])


def capacity_check(settings: FarmSettings, boxes: int, binding: str) -> Check:
    """What one worker of ``settings`` holds: boxes of the default limits (the kernel's count,
    from the sandbox's budgets) and sessions; a warning when sessions could not all fit."""
    limits = settings.limits
    why = {
        "disk_mb": f"FARM_SANDBOX_DISK_MB={limits.disk_mb} over the boxes' disks",
        "pids": f"FARM_SANDBOX_PIDS={limits.pids} over the boxes' processes",
    }.get(binding, binding)
    detail = (
        f"a worker holds {boxes} boxes at once (set by {why}), of which up to "
        f"FARM_MAX_SESSIONS={settings.max_sessions} sessions; more work waits for room"
    )
    if boxes < settings.max_sessions:
        return Check(
            "box capacity",
            True,
            detail + f": only {boxes} of those sessions fit at once, the rest wait",
            f"raise {why.split('=')[0]} or lower FARM_MAX_SESSIONS to {boxes}",
            warn=True,
        )
    return Check("box capacity", True, detail)
