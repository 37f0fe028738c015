# docker ships no type hints (see images.py).
# mypy: disable-error-code="import-untyped"
"""Which build a sandbox runs: an image name resolved once into a ``ServedImage`` (its tag, the
build the tag names now, its digest, kernel and spec), by a local farm preparing the image for
a worker (``catalog.prepare``) or by the worker's sandbox itself when nobody did. Invariant: a
sandbox runs the build it was resolved to, so what it reports is what runs. Why:
docs/design/images.md.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import docker
import docker.errors

from farm.errors import SandboxStartError
from farm.image_name import SANDBOX_REPOSITORY, ImageName, ServedImage
from farm.sandbox.environments import LABEL_ENV_SPEC
from farm.sandbox.images import LABEL_KERNEL_HASH, docker_client, own_sandbox_tag, try_pull

logger = logging.getLogger(__name__)

SANDBOX_PULL_TIMEOUT_S = 900.0  # a sandbox image of a few GB from a registry


def sandbox_ref(name: ImageName, chosen: str | None = None) -> str:
    """The Docker reference sandboxes of ``name`` run: ``chosen`` (``FARM_SANDBOX_IMAGE``), else
    ``name.tag``; for the default image, the build of this checkout's own kernel when Docker
    has it (``images.own_sandbox_tag``)."""
    if chosen:
        return chosen
    return own_sandbox_tag() if name.kind == "default" else name.tag


def resolve(
    name: ImageName, ref: str | None = None, client: docker.DockerClient | None = None
) -> ServedImage | None:
    """``name`` served from what ``ref`` (default: ``sandbox_ref(name)``) names in Docker now,
    or None when Docker has no such image (nothing is pulled)."""
    tag = ref or sandbox_ref(name)
    with docker_client(client) as client:
        try:
            image = client.images.get(tag)
        except docker.errors.ImageNotFound:
            return None
    labels: dict[str, str] = dict(image.labels or {})
    try:
        spec = json.loads(labels[LABEL_ENV_SPEC]) if labels.get(LABEL_ENV_SPEC) else None
    except ValueError:
        spec = None  # recorded by another farm version: served without it
    return ServedImage(
        name=name,
        tag=tag,
        image_id=str(image.id),
        digest=image_digest(image.attrs, str(image.id)),
        kernel_built_in=LABEL_KERNEL_HASH in labels,
        spec=spec if isinstance(spec, dict) else None,
    )


def resolve_or_pull(
    name: ImageName, ref: str | None = None, client: docker.DockerClient | None = None
) -> ServedImage | None:
    """``resolve``, pulling first an image that is not farm's when Docker has none (a
    registry's ``FARM_SANDBOX_IMAGE``, a bring-your-own reference), as ``docker run`` would."""
    ref = ref or sandbox_ref(name)
    with docker_client(client) as client:
        served = resolve(name, ref, client)
        if served is None and not _farms(ref):
            logger.info("sandbox image %s is not here: pulling it", ref)
            if try_pull(client, ref, SANDBOX_PULL_TIMEOUT_S):
                served = resolve(name, ref, client)
    return served


def serve(
    name: ImageName, ref: str | None = None, client: docker.DockerClient | None = None
) -> ServedImage:
    """``resolve_or_pull``, or ``SandboxStartError`` saying how to get the image."""
    ref = ref or sandbox_ref(name)
    served = resolve_or_pull(name, ref, client)
    if served is None:
        raise missing(ref, pulled=not _farms(ref))
    return served


def image_digest(attrs: dict[str, Any], image_id: str) -> str:
    """The digest a sandbox of this image reports: its registry digest, else its id."""
    return str((attrs.get("RepoDigests") or [None])[0] or image_id)


def missing(ref: str, pulled: bool = False) -> SandboxStartError:
    """What a sandbox says when Docker has no image ``ref`` (``pulled``: not after a pull)."""
    how = "run `farm image build`" if _farms(ref) else "pull or build it"
    tried = " and its pull failed" if pulled else ""
    return SandboxStartError(f"sandbox image {ref!r} is missing{tried}: {how}")


def _farms(ref: str) -> bool:
    """Whether ``ref`` names a farm image (``farm-sandbox:NAME``): built here, never pulled."""
    return ref.startswith(f"{SANDBOX_REPOSITORY}:")
