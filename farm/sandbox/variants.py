"""Sandbox image variants: the environments farm itself defines, for one kind of work each.

- ``docs`` (``farm-sandbox:docs``): ``markitdown`` with its PDF, DOCX, PPTX and XLSX
  converters, for ``read_document`` (``farm/kernel/documents.py``). Untrusted files are parsed
  inside the sandbox, never on a worker.
- ``browser`` (``farm-sandbox:browser``): Debian's ``chromium`` and Playwright (whose node
  driver comes in its wheel; its browser download is never used), for the ``browser`` global
  (``farm/kernel/browser.py``).
- ``judge`` (``farm-sandbox:judge``): compilers and runtimes of the judge's languages
  (``farm.judge.languages``: C, C++, Java, Go, Rust, node, bash; Python is the base's).

They are specs like the ones users build (``farm.sandbox.envspec``), built by the same engine
(``farm.sandbox.environments``); their limits are the ones the settings give their workers
(``IMAGE_LIMITS``). ``farm image build docs`` builds one when missing or stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import ImageBuildError
from farm.judge.languages import LANGUAGES
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
    "judge": EnvSpec(
        name="judge",
        languages=dict(LANGUAGES),
        limits=EnvLimits(**IMAGE_LIMITS["judge"]),
    ),
}


def judge_variant(languages: Sequence[str]) -> EnvSpec:
    """The judge image with only ``languages`` (names of ``farm.judge.languages``)."""
    unknown = sorted(set(languages) - set(LANGUAGES))
    if unknown:
        raise ImageBuildError(f"unknown languages {unknown}; known: {sorted(LANGUAGES)}")
    chosen = {name: LANGUAGES[name] for name in sorted(set(languages))}
    return VARIANTS["judge"].model_copy(update={"languages": chosen})


def ensure_variant_image(
    name: str,
    client: docker.DockerClient | None = None,
    *,
    force: bool = False,
    repo_root: Path | None = None,
    allow_hosts: Sequence[str] = (),
    languages: Sequence[str] = (),
) -> SandboxImage:
    """Make ``farm-sandbox:NAME`` current for the variant ``name``, building only if needed.

    ``allow_hosts`` (browser only) builds the egress extension point instead:
    ``farm-sandbox:browser-egress``, whose browser may request those hosts too. It never
    replaces ``farm-sandbox:browser``, which stays loopback-only; workers opt in with
    ``FARM_IMAGE=browser FARM_SANDBOX_IMAGE=farm-sandbox:browser-egress`` and a
    ``FARM_SANDBOX_NETWORK`` whose only way out enforces the same list (README, "Browser").
    ``languages`` (judge only) builds ``farm-sandbox:judge`` with those languages alone.
    """
    if name not in VARIANTS:
        raise ImageBuildError(f"unknown sandbox variant {name!r}; known: {sorted(VARIANTS)}")
    variant = VARIANTS[name]
    if languages:
        if name != "judge":
            raise ImageBuildError("only the judge variant takes languages")
        variant = judge_variant(languages)
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
