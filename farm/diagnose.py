"""``farm doctor``: check what farm needs, in order, and say in plain words what to fix.

A check that passes but leaves the farm exposed is a warning (``warn``): a broker that anyone
who reaches it may use works, and lets them run code in every sandbox and read every result.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from farm.errors import FarmError
from farm.sandbox.factory import docker_image
from farm.settings import FarmSettings


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
    if not docker_ok:
        return
    image_ok = False
    try:
        image = client.images.get(docker_image(settings))
        image_ok = True
        yield Check("sandbox image", True, f"{docker_image(settings)} {str(image.id)[:19]}")
    except Exception:
        yield Check(
            "sandbox image",
            False,
            f"{docker_image(settings)} is missing",
            "run `farm image build` (or `make setup`)",
        )
    if image_ok:
        yield _kernel_check(settings)


# What a client without credentials lacks: user, password, and a TLS client certificate (it
# keeps the CA, to reach a TLS broker at all).
ANONYMOUS_WITHOUT = ("username", "password", "credential_provider", "ssl_certfile", "ssl_keyfile")


def broker_checks(settings: FarmSettings) -> Iterator[Check]:
    """The broker answers this client; then, whether it also answers a client without
    credentials (a warning: whoever reaches it can submit code)."""
    import redis
    from kombu.utils.url import maybe_sanitize_url

    from farm.client.broker import broker_error
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
        try:
            open_to_all, why = bool(anonymous.ping()), ""
        except Exception as exc:  # NOAUTH, or a TLS handshake without a client certificate
            open_to_all, why = False, f" ({type(exc).__name__})"
        yield Check(
            "broker authentication",
            True,
            f"{url} answers clients without credentials: anyone who reaches it can run code "
            "in every sandbox and read every result"
            if open_to_all
            else f"{url} refuses clients without credentials{why}",
            "give Redis a password (requirepass, or an ACL user and `user default off`) and "
            "the farm's clients FARM_BROKER_PASSWORD: README, Security model, Control plane",
            warn=open_to_all,
        )
    finally:
        anonymous.close()
        registry.close()


def _kernel_check(settings: FarmSettings) -> Check:
    import tempfile

    from farm.sandbox.docker import DockerSandbox

    try:
        with (
            DockerSandbox(
                docker_image(settings),
                owner="doctor",
                limits=settings.limits,
                socket_dir=Path(tempfile.mkdtemp(prefix="farm-doctor-")),
            ) as box,
            box.kernel() as kernel,
        ):
            session = kernel.open_session()
            result = kernel.execute(session["session_id"], "6 * 7", epoch=1, timeout_s=10)
        value = (result.get("value") or {}).get("text")
        ok = value == "42"
        return Check(
            "kernel round trip",
            ok,
            f"6 * 7 -> {value} in a hardened sandbox",
            "see the worker/container logs; rebuild with `farm image build --force`",
        )
    except Exception as exc:
        return Check(
            "kernel round trip",
            False,
            str(exc)[:300],
            "rebuild the image with `farm image build --force`",
        )
