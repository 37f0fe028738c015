"""Choose and build the sandbox backend from settings: the one place that knows the kinds.

``auto`` takes Docker when it answers and falls back to the unisolated ``process`` backend
only then, loudly; production settings say ``docker`` and never fall back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from farm.errors import InvalidRequest
from farm.image_name import ImageName, ServedImage
from farm.sandbox.backend import Sandbox
from farm.settings import FarmSettings

log = logging.getLogger(__name__)
BACKENDS = ("docker", "process", "auto")


def docker_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception:
        return False
    return True


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise InvalidRequest(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")
    if backend != "auto":
        return backend
    if docker_available():
        return "docker"
    log.warning("Docker does not answer: backend 'auto' falls back to UNISOLATED processes")
    return "process"


def sandboxes(settings: FarmSettings, owner: str) -> Callable[[], Sandbox]:
    """A worker's sandbox factory (its keeper's). The first sandbox runs the image a local farm
    prepared for the worker (``FARM_SERVED_IMAGE``), when one did; every other resolves the
    worker's image when it starts: a replacement runs what the name names then."""
    handed = [settings.served_image] if settings.served_image else []
    return lambda: make_sandbox(settings, owner, handed.pop() if handed else None)


def make_sandbox(settings: FarmSettings, owner: str, image: ServedImage | None = None) -> Sandbox:
    backend = resolve_backend(settings.backend)
    if backend == "process":
        from farm.sandbox.process import ProcessSandbox

        ca = settings.egress.ca_bundle
        return ProcessSandbox(
            grace_s=settings.limits.grace_s,
            box=settings.box,
            extra_args=["--egress-ca", str(ca)] if ca else None,
        )
    from farm.sandbox.docker import DockerSandbox
    from farm.sandbox.served import serve

    return DockerSandbox(
        image or serve(ImageName(settings.image), settings.sandbox_image),
        owner=owner,
        limits=settings.limits,
        box=settings.box,
        socket_dir=settings.socket_dir,
        start_timeout_s=settings.sandbox_start_timeout_s,
        ca_bundle=settings.egress.ca_bundle,
    )
