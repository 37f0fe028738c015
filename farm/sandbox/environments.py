# docker ships no type hints (see images.py).
# mypy: disable-error-code="import-untyped"
"""The one engine that builds farm environments: a spec in (``farm.sandbox.envspec``), the
image ``farm-sandbox:NAME`` out, for the built-in variants and users' environments alike.

Invariants: an image is reused while its labels (kernel hash, spec hash, a ``from`` image's
id) match what it would be built from now, and rebuilt otherwise; wheels are downloaded on the
host, so only apt reaches a network in the build; a failed build is an ``ImageBuildError``
naming the package that failed. How and why: docs/design/images.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import docker
import docker.errors

from farm.errors import ImageBuildError, InvalidRequest
from farm.judge.languages import apt_packages
from farm.sandbox.envspec import EnvSpec
from farm.sandbox.images import (
    BASE_BUILD_TIMEOUT_S,
    BUILD_TOTAL_TIMEOUT_S,
    KERNEL_DIR,
    SandboxImage,
    default_repo_root,
    docker_client,
    ensure_sandbox_image,
    image_exists,
    try_pull,
)
from farm.sandbox.wheels import WheelError, download_closure, marker_env

logger = logging.getLogger(__name__)

ENV_DOCKERFILE = Path("images/sandbox/env.Dockerfile")
WHEELS_DIR = Path("build/sandbox-wheels")
CONTEXT_DIR = Path("build/sandbox-context")
LOCK_TIMEOUT_S = BUILD_TOTAL_TIMEOUT_S + BASE_BUILD_TIMEOUT_S
MIN_PYTHON = (3, 9)

LABEL_ENV = "farm.env"
LABEL_ENV_HASH = "farm.env_hash"
LABEL_JUDGE_INCLUDE = "farm.judge_include"  # the digest of images/judge/include (testlib.h)
JUDGE_INCLUDE = Path("images/judge/include")
LABEL_ENV_SPEC = "farm.env_spec"
LABEL_FROM_ID = "farm.from_id"

# Why a build failed, from its log: (pattern, group naming the package, what it means).
# Whole lines only: the log also echoes each step's command, which holds these words too.
FAILURES = (
    (r"^E: Unable to locate package (\S+)$", 1, "apt: no such package in the base's mirror"),
    (r"^E: Package '([^']+)' has no installation candidate$", 1, "apt: no installable version"),
    (r"^E: Version '[^']+' for '([^']+)' was not found$", 1, "apt: no such version"),
    (r"^E: Failed to fetch (\S+)", None, "apt: the base's mirror did not answer"),
    (r"^farm: (.+)$", None, ""),
    (r"^ERROR: (.+)$", None, "pip install"),
)


def ensure_env_image(
    spec: EnvSpec,
    client: docker.DockerClient | None = None,
    *,
    force: bool = False,
    repo_root: Path | None = None,
    tag: str | None = None,
    buildargs: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> SandboxImage:
    """Make ``tag`` (default ``spec.tag``) an image of ``spec`` and the current kernel,
    building only when it is missing or stale (see the module's invariant).

    ``spec`` must be resolved (:meth:`EnvSpec.resolve`): the image records exactly what it
    holds. ``buildargs`` and ``labels`` are a variant's extras (the browser's allowlist).
    """
    if spec.requirements:
        raise InvalidRequest(f"{spec.name}: read its requirements files first (EnvSpec.resolve)")
    tag = tag or spec.tag
    root = (repo_root or default_repo_root()).resolve()
    with docker_client(client) as client:
        from_id = _from_image_id(client, spec.from_image, tag) if spec.from_image else ""

        def prepare(base: str) -> Path:
            env = _python_of(base, tag) if spec.pip or spec.from_image else {}
            return _build_context(spec, _download_wheels(spec, base, env, client, root, tag), root)

        # One builder at a time per name on this checkout: two would share the wheel and context
        # directories. The second one then finds the image current.
        lock_path = root / CONTEXT_DIR / f"{spec.name}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("w") as lock:
            _wait_for_lock(lock.fileno(), tag)
            try:
                return ensure_sandbox_image(
                    client,
                    tag=tag,
                    force=force,
                    repo_root=root,
                    dockerfile=ENV_DOCKERFILE,
                    buildargs={
                        "APT_PACKAGES": " ".join(spec.apt),
                        "JUDGE_APT_PACKAGES": " ".join(apt_packages(spec.languages)),
                        **(buildargs or {}),
                    },
                    labels={
                        LABEL_ENV: spec.name,
                        LABEL_ENV_HASH: spec.digest(),
                        LABEL_ENV_SPEC: spec.canonical(),
                        LABEL_FROM_ID: from_id,
                        **({LABEL_JUDGE_INCLUDE: _include_digest(root)} if spec.languages else {}),
                        **(labels or {}),
                    },
                    prepare=prepare,
                    base=spec.from_image,
                    # Only apt fetches anything in the build; without it the build is offline.
                    network_mode=None if spec.apt or apt_packages(spec.languages) else "none",
                )
            except ImageBuildError as exc:
                raise explain(exc, tag) from exc


def explain(exc: ImageBuildError, tag: str) -> ImageBuildError:
    """``exc`` with a first line that says which package failed and why, when the build's
    log says it, and ``image`` set to ``tag``."""
    text = str(exc)
    if exc.image is not None and text.startswith(f"{exc.image}: "):
        return exc  # explained already
    for pattern, group, meaning in FAILURES:
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            package = found[group] if group else exc.package
            headline = f"{meaning}: {found[0]}" if meaning else found[1]
            break
    else:
        package, headline = exc.package, "the build failed"
    if package and package not in headline:
        headline = f"{package}: {headline}"
    return ImageBuildError(f"{tag}: {headline}\n{text}", image=tag, package=package)


def _from_image_id(client: docker.DockerClient, ref: str, tag: str) -> str:
    """The id of the local image ``ref`` (pulled if a registry answers in time): part of the
    labels, so rebuilding the user's base rebuilds the environment."""
    if not image_exists(client, ref) and not try_pull(client, ref):
        raise ImageBuildError(
            f"{tag}: the base image {ref} is neither local nor pullable "
            "(`docker images` lists the local ones)",
            image=tag,
        )
    return str(client.images.get(ref).id)


def _python_of(base: str, tag: str) -> dict[str, str]:
    """The marker environment of ``base``'s ``python3``, which must be >= 3.9: the kernel
    and the wheels are for it."""
    try:
        env = marker_env(base)
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or exc.stdout or "").strip().splitlines()
        why = lines[-1] if lines else f"exit {exc.returncode}"
        raise ImageBuildError(f"{tag}: {base} has no usable python3 ({why})", image=tag) from None
    except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
        raise ImageBuildError(f"{tag}: cannot run python3 in {base}: {exc}", image=tag) from None
    version = tuple(int(p) for p in env["python_version"].split("."))
    if version < MIN_PYTHON:
        raise ImageBuildError(
            f"{tag}: {base} has Python {env['python_full_version']}; farm's kernel needs "
            f">= {'.'.join(map(str, MIN_PYTHON))}",
            image=tag,
        )
    return env


def _download_wheels(
    spec: EnvSpec,
    base: str,
    env: dict[str, str],
    client: docker.DockerClient,
    root: Path,
    tag: str,
) -> Path:
    """Put ``spec``'s wheels (and pip's own, to install them) in build/sandbox-wheels/NAME;
    an empty directory when it has none. Skipped when ``wheels.stamp`` says they were made
    for this base image and these requirements."""
    dest = root / WHEELS_DIR / spec.name
    stamp = json.dumps({"base": str(client.images.get(base).id), "pip": spec.pip})
    stamp_file = dest / "wheels.stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        logger.info("wheels for %s are current", tag)
        return dest
    started = time.monotonic()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    if spec.pip:
        logger.info("downloading wheels for %s (Python %s)", tag, env["python_full_version"])
        try:
            download_closure(["pip", *spec.pip], dest, env)
        except WheelError as exc:
            raise ImageBuildError(f"{tag}: {exc}", image=tag, package=exc.package) from exc
        except OSError as exc:
            raise ImageBuildError(f"{tag}: downloading wheels: {exc}", image=tag) from exc
    stamp_file.write_text(stamp)
    count = len(list(dest.glob("*.whl")))
    logger.info("%d wheels in %s (%.0fs)", count, dest, time.monotonic() - started)
    return dest


def _build_context(spec: EnvSpec, wheels: Path, root: Path) -> Path:
    """build/sandbox-context/NAME: env.Dockerfile (at its repository path, which the kernel
    hash names), the kernel, ``wheels/``, ``judge/languages.json`` (the judge's table),
    ``preload.json`` (the modules its kernel preloads) and, for a judge image,
    ``judge/include/`` (testlib.h),
    so the repository's own build context (the default image's, the worker's) never carries
    an environment's wheels."""
    context = root / CONTEXT_DIR / spec.name
    shutil.rmtree(context, ignore_errors=True)
    (context / ENV_DOCKERFILE).parent.mkdir(parents=True)
    shutil.copy2(root / ENV_DOCKERFILE, context / ENV_DOCKERFILE)
    shutil.copytree(
        root / KERNEL_DIR, context / KERNEL_DIR, ignore=shutil.ignore_patterns("__pycache__")
    )
    table = {name: language.for_image() for name, language in spec.languages.items()}
    (context / "judge").mkdir()
    (context / "judge" / "languages.json").write_text(json.dumps(table, indent=1, sort_keys=True))
    (context / "preload.json").write_text(json.dumps({"modules": list(spec.preload)}))
    if spec.languages:  # testlib.h, for the problems' checkers and interactors
        shutil.copytree(root / JUDGE_INCLUDE, context / "judge" / "include")
    shutil.copytree(
        wheels,
        context / "wheels",
        ignore=shutil.ignore_patterns("wheels.stamp"),
        copy_function=_link_or_copy,
    )
    return context


def _include_digest(root: Path) -> str:
    """The digest of the judge's headers (``images/judge/include``): a label of the image."""
    digest = hashlib.sha256()
    for path in sorted((root / JUDGE_INCLUDE).iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _wait_for_lock(fd: int, tag: str) -> None:
    """Take the builder lock, waiting at most as long as another build may take."""
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ImageBuildError(f"another build of {tag} held its lock too long") from None
            time.sleep(0.5)  # poll interval of the deadline-bounded lock wait
