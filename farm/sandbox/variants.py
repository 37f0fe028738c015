# docker ships no type hints (see images.py).
# mypy: disable-error-code="import-untyped"
"""Sandbox image variants: the default sandbox plus what one kind of work needs.

- ``docs`` (``farm-sandbox:docs``): ``markitdown`` with its PDF, DOCX, PPTX and XLSX
  converters, for ``read_document`` (``farm/kernel/documents.py``). Untrusted files are parsed
  inside the sandbox, never on a worker.
- ``browser`` (``farm-sandbox:browser``): Debian's ``chromium`` and Playwright (whose node
  driver comes in its wheel; its browser download is never used), for the ``browser`` global
  (``farm/kernel/browser.py``).

Both are built from ``images/sandbox/variant.Dockerfile`` on the same base as the default
image. Python packages come as wheels the host downloads into ``build/sandbox-wheels/NAME/``
(``farm.sandbox.wheels``: a container build cannot be trusted to reach PyPI), built from a
context of their own (``build/sandbox-context/NAME/``); Debian packages
are installed with apt in the build, from the mirror the base was bootstrapped from. Heavy
layers come before the kernel, so a kernel change rebuilds only the last layers.

An image is reused while its labels match: the kernel hash, the variant Dockerfile and the
package lists. ``python -m farm.sandbox.variants [--force] NAME...`` is the command line.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import docker

from farm.errors import DockerUnavailable, ImageBuildError
from farm.sandbox.images import (
    BASE_BUILD_TIMEOUT_S,
    BUILD_TOTAL_TIMEOUT_S,
    KERNEL_DIR,
    SandboxImage,
    connect,
    default_repo_root,
    ensure_sandbox_image,
)
from farm.sandbox.wheels import WheelError, download_closure, marker_env

logger = logging.getLogger(__name__)

VARIANT_DOCKERFILE = Path("images/sandbox/variant.Dockerfile")
WHEELS_DIR = Path("build/sandbox-wheels")
CONTEXT_DIR = Path("build/sandbox-context")
LOCK_TIMEOUT_S = BUILD_TOTAL_TIMEOUT_S + BASE_BUILD_TIMEOUT_S
LABEL_VARIANT = "farm.variant"
LABEL_VARIANT_HASH = "farm.variant_hash"
LABEL_ALLOW_HOSTS = "farm.browser_allow_hosts"


@dataclass(frozen=True)
class Variant:
    """A sandbox image: the default one plus ``pip`` requirements and ``apt`` packages."""

    name: str
    pip: tuple[str, ...]
    apt: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return f"farm-sandbox:{self.name}"

    def spec_hash(self, repo_root: Path) -> str:
        digest = hashlib.sha256((repo_root / VARIANT_DOCKERFILE).read_bytes())
        digest.update(json.dumps([self.name, self.pip, self.apt]).encode())
        return digest.hexdigest()


VARIANTS: dict[str, Variant] = {
    "docs": Variant("docs", pip=("markitdown[pdf,docx,pptx,xlsx]>=0.1,<0.2",)),
    "browser": Variant(
        "browser",
        pip=("playwright>=1.49,<2", "markdownify>=0.13"),
        apt=("chromium", "fonts-dejavu-core", "libatomic1"),  # libatomic1: Playwright's node
    ),
}


def _download_wheels(variant: Variant, base: str, client: docker.DockerClient, root: Path) -> Path:
    """Put ``variant``'s wheels (and pip's own, to install them) in build/sandbox-wheels/NAME.

    Skipped when ``wheels.stamp`` says they were made for this base image and these
    requirements.
    """
    dest = root / WHEELS_DIR / variant.name
    base_id = str(client.images.get(base).id)
    stamp = json.dumps({"base": base_id, "pip": variant.pip})
    stamp_file = dest / "wheels.stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        logger.info("wheels for %s are current", variant.tag)
        return dest
    started = time.monotonic()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    env = marker_env(base)
    logger.info("downloading wheels for %s (Python %s)", variant.tag, env["python_full_version"])
    try:
        download_closure(["pip", *variant.pip], dest, env)
    except (WheelError, OSError) as exc:
        raise ImageBuildError(f"wheels for {variant.tag}: {exc}") from exc
    stamp_file.write_text(stamp)
    count = len(list(dest.glob("*.whl")))
    logger.info("%d wheels in %s (%.0fs)", count, dest, time.monotonic() - started)
    return dest


def _build_context(variant: Variant, wheels: Path, root: Path) -> Path:
    """build/sandbox-context/NAME: the kernel, the Dockerfile and the wheels, laid out like the
    repository, so the repository's own build context (the default image's, the worker's)
    never carries the variants' wheels."""
    context = root / CONTEXT_DIR / variant.name
    shutil.rmtree(context, ignore_errors=True)
    (context / VARIANT_DOCKERFILE).parent.mkdir(parents=True)
    shutil.copy2(root / VARIANT_DOCKERFILE, context / VARIANT_DOCKERFILE)
    shutil.copytree(
        root / KERNEL_DIR, context / KERNEL_DIR, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(wheels, context / WHEELS_DIR / variant.name, copy_function=_link_or_copy)
    return context


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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
    tag = f"{variant.tag}-egress" if hosts else variant.tag
    root = (repo_root or default_repo_root()).resolve()
    client = client if client is not None else connect()

    def prepare(base: str) -> Path:
        return _build_context(variant, _download_wheels(variant, base, client, root), root)

    # One builder at a time per variant on this checkout: two would share the wheel and
    # context directories. The second one then finds the image current.
    lock_path = root / CONTEXT_DIR / f"{variant.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        _wait_for_lock(lock.fileno(), tag)
        return ensure_sandbox_image(
            client,
            tag=tag,
            force=force,
            repo_root=root,
            dockerfile=VARIANT_DOCKERFILE,
            buildargs={
                "VARIANT": variant.name,
                "APT_PACKAGES": " ".join(variant.apt),
                "BROWSER_ALLOW_HOSTS": hosts,
            },
            labels={
                LABEL_VARIANT: variant.name,
                LABEL_VARIANT_HASH: variant.spec_hash(root),
                LABEL_ALLOW_HOSTS: hosts,
            },
            prepare=prepare,
        )


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m farm.sandbox.variants",
        description="Build sandbox image variants (docs, browser) when missing or stale.",
    )
    parser.add_argument("names", nargs="+", choices=sorted(VARIANTS), metavar="NAME")
    parser.add_argument("--force", action="store_true", help="rebuild without the layer cache")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="browser only: build farm-sandbox:browser-egress, whose browser may request HOST "
        "(repeatable; the sandbox network must let it out, see the README)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show build output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("farm.sandbox.images").setLevel(
        logging.DEBUG if args.verbose else logging.INFO
    )
    for name in args.names:
        started = time.monotonic()
        try:
            image = ensure_variant_image(name, force=args.force, allow_hosts=args.allow_host)
        except DockerUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except ImageBuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        how = f"built from {image.base}" if image.built else "reused"
        print(f"{image.tag}\t{image.image_id}\t{how}\t{time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
