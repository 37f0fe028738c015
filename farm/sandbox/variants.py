"""Sandbox image variants: the environments farm itself defines, for one kind of work each.

``docs`` (markitdown and its converters, for ``read_document``: untrusted files are parsed in
the sandbox, never on a worker), ``browser`` (Debian's chromium and Playwright) and ``judge``
(compilers and runtimes of the judge's languages, ``farm.judge.languages``). They are specs
like users' (``farm.sandbox.envspec``), built by the same engine, with the limits the settings
give their workers (``IMAGE_LIMITS``). More: docs/design/images.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from farm.errors import ImageBuildError
from farm.judge.languages import DEFAULT_LANGUAGES, LANGUAGES
from farm.sandbox.environments import ensure_env_image
from farm.sandbox.envspec import EnvLimits, EnvSpec
from farm.sandbox.images import SandboxImage
from farm.settings import IMAGE_LIMITS

if TYPE_CHECKING:
    import docker

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
        languages={name: LANGUAGES[name] for name in DEFAULT_LANGUAGES},  # OPT_IN: by name
        limits=EnvLimits(**IMAGE_LIMITS["judge"]),
    ),
}


def judge_variant(languages: Sequence[str]) -> EnvSpec:
    """The judge image with only ``languages`` (names of ``farm.judge.languages``, the opt-in
    ones among them)."""
    unknown = sorted(set(languages) - set(LANGUAGES))
    if unknown:
        raise ImageBuildError(f"unknown languages {unknown}; known: {sorted(LANGUAGES)}")
    chosen = {name: LANGUAGES[name] for name in sorted(set(languages))}
    return VARIANTS["judge"].model_copy(update={"languages": chosen})


def judge_rebuilt(recorded: EnvSpec) -> EnvSpec:
    """The judge image's spec for a rebuild: the languages it was built with, each with the
    table's row as it is now (a fix to a row must reach the images built before it); a
    language the table no longer has keeps its recorded row."""
    rows = {name: LANGUAGES.get(name, row) for name, row in recorded.languages.items()}
    return recorded.model_copy(update={"languages": rows})


def ensure_variant_image(
    name: str,
    client: docker.DockerClient | None = None,
    *,
    force: bool = False,
    repo_root: Path | None = None,
    languages: Sequence[str] = (),
) -> SandboxImage:
    """Make ``farm-sandbox:NAME`` current for the variant ``name``, building only if needed;
    ``languages`` (judge only) builds ``farm-sandbox:judge`` with those languages alone. (What
    its boxes may reach is their egress policy's, per session: no image has a network.)"""
    if name not in VARIANTS:
        raise ImageBuildError(f"unknown sandbox variant {name!r}; known: {sorted(VARIANTS)}")
    variant = VARIANTS[name]
    if languages:
        if name != "judge":
            raise ImageBuildError("only the judge variant takes languages")
        variant = judge_variant(languages)
    return ensure_env_image(variant, client, force=force, repo_root=repo_root, tag=variant.tag)
