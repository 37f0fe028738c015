# docker ships no type hints (see images.py).
# mypy: disable-error-code="import-untyped"
"""Farm images by name: what ``default``, ``docs``, ``browser`` and a built environment's name
mean, for ``farm image build``, ``farm image ls`` and a local farm's on-demand workers.

A name without ``/`` or ``:`` is a farm image, ``farm-sandbox:NAME``: ``default`` (the kernel
alone, ``farm.sandbox.images``), a variant (``farm.sandbox.variants``) or an environment a user
built (``farm.sandbox.environments``). The names of the first two are farm's: a user's spec may
not take them. An environment's image records its spec, so asking for it by name is enough to
rebuild it after a kernel change; an image tagged ``farm-sandbox:NAME`` by hand, without a
spec, is served as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
from pydantic import BaseModel, ValidationError

from farm.errors import ImageBuildError, InvalidRequest, SandboxUnavailable
from farm.image_name import SANDBOX_REPOSITORY, ImageName, ServedImage
from farm.sandbox.environments import (
    ENV_DOCKERFILE,
    LABEL_ENV_HASH,
    LABEL_ENV_SPEC,
    ensure_env_image,
)
from farm.sandbox.envspec import EnvSpec, spec_from_json
from farm.sandbox.images import (
    DEFAULT_TAG,
    DOCKERFILE,
    LABEL_BASE,
    LABEL_KERNEL_HASH,
    SandboxImage,
    default_repo_root,
    docker_client,
    ensure_sandbox_image,
    kernel_source_hash,
    tagged_image,
)
from farm.sandbox.served import image_digest, resolve_or_pull
from farm.sandbox.variants import VARIANTS, ensure_variant_image, judge_rebuilt

RESERVED = frozenset({"default", *VARIANTS, *(f"{name}-egress" for name in VARIANTS)})
PIN = "-k"  # pinned tags: farm-sandbox:NAME-k<digest> (images.pinned_tag)


class ImageSummary(BaseModel):
    """One farm image as ``farm image ls`` shows it. ``digest`` is what a sandbox reports as
    its ``image_digest`` (the registry digest once pushed, else the image id)."""

    name: str
    tag: str
    image_id: str
    digest: str
    size_bytes: int
    created: str
    kind: str  # default, variant, environment, or "image" (tagged by hand: no spec)
    spec: EnvSpec | None = None
    env_hash: str | None = None
    base: str | None = None
    kernel_hash: str | None = None
    kernel_current: bool | None = None  # built from this checkout's kernel
    pins: int = 0  # pinned tags (older kernels still running somewhere)


def build_image(
    name: str | ImageName = "default",
    spec: EnvSpec | None = None,
    *,
    client: docker.DockerClient | None = None,
    force: bool = False,
    base_dir: Path | None = None,
    repo_root: Path | None = None,
    languages: Sequence[str] = (),
) -> SandboxImage:
    """Build the farm image ``name`` when missing or stale.

    With a ``spec`` (whose requirements paths are relative to ``base_dir``): that environment;
    its name may not be one of farm's. Without one: ``default``, a variant, or an environment
    built before, from the spec its image recorded (after a kernel change, say); the judge
    variant keeps the ``languages`` it was built with unless given others (with the rows the
    table has now). A reference names
    another image, not a farm one: ``InvalidRequest``.
    """
    if spec is not None:
        if spec.name in RESERVED:
            raise InvalidRequest(
                f"{spec.name!r} is one of farm's images ({', '.join(sorted(RESERVED))}); "
                "give the environment another name"
            )
        resolved = spec.resolve(base_dir or Path.cwd())
        return ensure_env_image(resolved, client, force=force, repo_root=repo_root)
    image = ImageName.parse(name)
    if image.kind == "reference":
        raise InvalidRequest(
            f"{image.asked!r} is an image reference, not a farm image: farm builds "
            f"{SANDBOX_REPOSITORY}:NAME (`--from {image.asked}` starts one from it)"
        )
    if image.kind == "default":
        return ensure_sandbox_image(client, tag=DEFAULT_TAG, force=force, repo_root=repo_root)
    if image.asked == "judge" and not languages:  # keep the languages it was built with
        with docker_client(client) as client:
            recorded = _recorded_spec(client, image)
            if recorded is not None:
                rebuilt = judge_rebuilt(recorded)
                return ensure_env_image(rebuilt, client, force=force, repo_root=repo_root)
    if image.kind == "variant":
        return ensure_variant_image(
            image.asked, client, force=force, repo_root=repo_root, languages=languages
        )
    with docker_client(client) as client:
        recorded = _recorded_spec(client, image)
        if recorded is None:
            raise InvalidRequest(
                f"nothing to build for {image.asked!r}: give packages (--pip, -r, --apt), a base "
                f"(--from) or a spec file (-f {image}.toml); farm's own images are "
                f"{', '.join(['default', *sorted(VARIANTS)])}"
            )
        return ensure_env_image(recorded, client, force=force, repo_root=repo_root)


def prepare(image: str | ImageName, client: docker.DockerClient | None = None) -> ServedImage:
    """Make the image ``image`` names ready for a worker to serve, the one place a local farm
    does so, and resolve it once (``served.resolve``: the tag, build and spec the worker gets):
    ``default`` and the variants are built when missing or stale, a built environment is
    rebuilt from its recorded spec when the kernel changed, a reference is pulled when Docker
    lacks it (any image with python3, served as it is).

    ``SandboxUnavailable`` when there is no such image: farm cannot guess its contents.
    """
    name = ImageName.parse(image)
    with docker_client(client) as client:
        if name.kind in ("default", "variant"):
            build_image(name, client=client)
        elif name.kind == "environment" and (spec := _recorded_spec(client, name)):
            ensure_env_image(spec, client)
        served = resolve_or_pull(name, client=client)
    if served is None:
        raise SandboxUnavailable(_missing(name))
    return served


def _missing(name: ImageName) -> str:
    if name.kind == "reference":
        how = "Docker has no such image and could not pull it; pull or build it"
        return f"no worker serves image {name.asked!r} and {how}"
    return (
        f"no worker serves image {name.asked!r} and there is no image {name.tag}; "
        f"build it first: `farm image build {name} --pip PKG --apt PKG` "
        f"or `farm image build {name} -f farm-env.toml`"
    )


def list_images(
    client: docker.DockerClient | None = None, repo_root: Path | None = None
) -> list[ImageSummary]:
    """Every ``farm-sandbox:NAME`` image on this Docker host, by name (pinned tags counted
    with the image they pin, not listed)."""
    with docker_client(client) as client:
        root = (repo_root or default_repo_root()).resolve()
        current = {}
        for kind, dockerfile in (("default", DOCKERFILE), ("env", ENV_DOCKERFILE)):
            try:
                current[kind] = kernel_source_hash(root, dockerfile)
            except (ImageBuildError, OSError):  # an installed farm has no sources: none "current"
                current[kind] = ""
        found = []
        for image in client.images.list(name=SANDBOX_REPOSITORY):
            ours = [t for t in image.tags if t.startswith(f"{SANDBOX_REPOSITORY}:")]
            names = [t.partition(":")[2] for t in ours]
            plain = [n for n in names if not _is_pin(n)]
            for name in plain:
                pins = sum(1 for n in names if _is_pin(n) and n.startswith(f"{name}{PIN}"))
                found.append(_summary(image, ImageName(name), pins, current))
        return sorted(found, key=lambda s: s.name)


def _summary(image: Any, name: ImageName, pins: int, current: dict[str, str]) -> ImageSummary:
    labels: dict[str, str] = dict(image.labels or {})
    spec = _spec_of(labels)
    kind: str = name.kind  # or "image": tagged by hand, without a spec
    if kind == "environment" and name.asked in RESERVED:
        kind = "variant"  # an egress variant of an older farm
    elif kind == "environment" and spec is None:
        kind = "image"
    kernel = labels.get(LABEL_KERNEL_HASH)
    want = current["env" if LABEL_ENV_HASH in labels else "default"]
    return ImageSummary(
        name=name.asked,
        tag=name.tag,
        image_id=str(image.id),
        digest=image_digest(image.attrs, str(image.id)),
        size_bytes=int(image.attrs.get("Size") or 0),
        created=str(image.attrs.get("Created", "")),
        kind=kind,
        spec=spec,
        env_hash=labels.get(LABEL_ENV_HASH),
        base=labels.get(LABEL_BASE),
        kernel_hash=kernel,
        kernel_current=(kernel == want) if kernel and want else None,
        pins=pins,
    )


def _is_pin(name: str) -> bool:
    head, sep, digest = name.rpartition(PIN)
    return bool(head and sep) and len(digest) == 12 and all(c in "0123456789abcdef" for c in digest)


def _spec_of(labels: dict[str, str]) -> EnvSpec | None:
    text = labels.get(LABEL_ENV_SPEC)
    if not text:
        return None
    try:
        return spec_from_json(text)
    except ValidationError:
        return None  # recorded by another farm version: listed, not rebuilt from


def _recorded_spec(client: docker.DockerClient, name: ImageName) -> EnvSpec | None:
    found = tagged_image(client, name.tag)
    return _spec_of(found[1]) if found is not None else None
