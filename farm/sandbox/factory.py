"""Choose and build the sandbox backend from settings: the one place that knows the kinds.

``auto`` takes Docker when it answers and falls back to the unisolated ``process`` backend
only then, loudly; production settings say ``docker`` and never fall back.
"""

from __future__ import annotations

import logging

from farm.errors import InvalidRequest
from farm.image_name import ImageName
from farm.sandbox.base import Sandbox
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


def make_sandbox(settings: FarmSettings, owner: str) -> Sandbox:
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
        serve(ImageName(settings.image), settings.sandbox_image),
        owner=owner,
        limits=settings.limits,
        box=settings.box,
        socket_dir=settings.socket_dir,
        start_timeout_s=settings.sandbox_start_timeout_s,
        ca_bundle=settings.egress.ca_bundle,
    )
