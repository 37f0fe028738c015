"""``farm doctor``: check what farm needs, in order, and say in plain words what to fix."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from farm.sandbox.factory import docker_image
from farm.settings import FarmSettings


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


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
    yield _broker_check(settings)
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


def _broker_check(settings: FarmSettings) -> Check:
    import redis

    try:
        redis.Redis.from_url(settings.broker_url, socket_timeout=3).ping()
        return Check("broker", True, f"{settings.broker_url} answers")
    except Exception as exc:
        return Check(
            "broker",
            False,
            f"{settings.broker_url}: {exc}",
            "start one with `farm up`, or set FARM_BROKER_URL to your Redis "
            "(not needed for `farm sweep --local N`)",
        )


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
