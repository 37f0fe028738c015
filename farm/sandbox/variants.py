"""Sandbox image variants: the environments farm itself defines, for one kind of work each.

``docs`` (markitdown and its converters, for ``read_document``: untrusted files are parsed in
the sandbox, never on a worker) and ``browser`` (Debian's chromium and Playwright). They are
specs like users' (``farm.sandbox.envspec``), built by the same engine, with the limits the
settings give their workers (``IMAGE_LIMITS``). More: docs/design/images.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import ImageBuildError
from farm.sandbox.environments import ensure_env_image
from farm.sandbox.envspec import EnvLimits, EnvSpec
from farm.sandbox.images import SandboxImage
from farm.settings import IMAGE_LIMITS

if TYPE_CHECKING:
    import docker

LABEL_ALLOW_HOSTS = "farm.browser_allow_hosts"

VARIANTS: dict[str, EnvSpec] = {
    "docs": EnvSpec(
        name="docs",
        pip=("markitdown[pdf,docx,pptx,xlsx]>=0.1,<0.2",),
        limits=EnvLimits(**IMAGE_LIMITS["docs"]),
    ),
    "browser": EnvSpec(
        name="browser",
        pip=("playwright>=1.49,<2", "markdownify>=0.13"),
        apt=("chromium", "fonts-dejavu-core", "libatomic1"),  # libatomic1: Playwright's node
        limits=EnvLimits(**IMAGE_LIMITS["browser"]),
    ),
}


def ensure_variant_image(
    name: str,
    client: docker.DockerClient | None = None,
    *,
    force: bool = False,
    repo_root: Path | None = None,
    allow_hosts: Sequence[str] = (),
) -> SandboxImage:
    """Make ``farm-sandbox:NAME`` current for the variant ``name``, building only if needed.

    ``allow_hosts`` (browser only) builds the egress extension point instead:
    ``farm-sandbox:browser-egress``, whose browser may request those hosts too. It never
    replaces ``farm-sandbox:browser``, which stays loopback-only; workers opt in with
    ``FARM_IMAGE=browser FARM_SANDBOX_IMAGE=farm-sandbox:browser-egress`` and a
    ``FARM_SANDBOX_NETWORK`` whose only way out enforces the same list (README, "Browser").
    """
    if name not in VARIANTS:
        raise ImageBuildError(f"unknown sandbox variant {name!r}; known: {sorted(VARIANTS)}")
    variant = VARIANTS[name]
    if allow_hosts and name != "browser":
        raise ImageBuildError("only the browser variant has an egress allowlist")
    hosts = " ".join(sorted({h.strip().lower() for h in allow_hosts if h.strip()}))
    return ensure_env_image(
        variant,
        client,
        force=force,
        repo_root=repo_root,
        tag=f"{variant.tag}-egress" if hosts else variant.tag,
        buildargs={"BROWSER_ALLOW_HOSTS": hosts},
        labels={LABEL_ALLOW_HOSTS: hosts},
    )
