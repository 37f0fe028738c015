# docker ships no type hints; types-docker (typeshed) should join the test extras. Until then
# the SDK is untyped here, and the annotations below still name its real classes.
# mypy: disable-error-code="import-untyped"
"""Build the sandbox image that every DockerSandbox runs, and only when it is out of date.

The image holds the kernel and nothing else of this repository, labelled with the kernel
digest and its Dockerfile's hash: a sandbox never runs a kernel older than the code beside it,
and a matching image is reused in well under a second. ``python -m farm.sandbox.images
[--force] [--tag TAG]`` is the command line. Bases and variants: docs/design/images.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from farm.errors import DockerUnavailable, ImageBuildError
from farm.sandbox import build_lock
from farm.sandbox.bundle import kernel_digest

logger = logging.getLogger(__name__)

PUBLIC_BASE = "python:3.12-slim"
LOCAL_BASE = "farm-base:bookworm"
DEFAULT_TAG = "farm-sandbox:default"

DOCKERFILE = Path("images/sandbox/Dockerfile")
BASE_BUILD_SCRIPT = Path("images/base/build.sh")
KERNEL_DIR = Path("farm/kernel")

LABEL_KERNEL_HASH = "farm.kernel_hash"
LABEL_BASE = "farm.base"

# Where Docker Hub is unreachable the daemon fails the pull in milliseconds (DNS), but a
# registry behind a black-holing firewall would hang it: never wait longer than this.
PULL_TIMEOUT_S = 20.0
# debootstrap takes about a minute here; allow for a slow mirror.
BASE_BUILD_TIMEOUT_S = 900.0
# A build must show progress (one log line) at least this often, and finish within the total.
BUILD_READ_TIMEOUT_S = 600
BUILD_TOTAL_TIMEOUT_S = 1800.0
PING_TIMEOUT_S = 10
# The Docker API version to speak, as the docker CLI takes it; unset: asked of the daemon
API_VERSION_ENV = "DOCKER_API_VERSION"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour in a build's stderr
PINS_KEPT = 3  # pinned builds of a tag kept on the host (other checkouts, running farms)


@dataclass(frozen=True)
class SandboxImage:
    """What :func:`ensure_sandbox_image` left in place, and whether it had to build it."""

    tag: str
    image_id: str
    built: bool
    base: str | None = None


def default_repo_root() -> Path:
    """The checkout this module was imported from (the package is installed editable)."""
    return Path(__file__).resolve().parents[2]


def client_from_env(**kwargs: Any) -> docker.DockerClient:
    """``docker.from_env``, speaking the API version ``DOCKER_API_VERSION`` names when set.
    Unset, the SDK asks the daemon (``GET /version``, ~10 ms: dockerd asks containerd and runc
    for theirs), which a local farm does once and hands its workers (``LocalFarm``)."""
    return docker.from_env(version=os.environ.get(API_VERSION_ENV) or None, **kwargs)


def connect() -> docker.DockerClient:
    """A Docker client that has answered a ping, or :class:`DockerUnavailable`."""
    client = None
    try:
        client = client_from_env(timeout=PING_TIMEOUT_S)
        client.ping()
    except docker.errors.DockerException as exc:
        if client is not None:
            client.close()
        raise DockerUnavailable(
            f"Docker is not reachable ({exc}); run scripts/bootstrap to install and start it"
        ) from exc
    return client


@contextlib.contextmanager
def docker_client(client: docker.DockerClient | None) -> Iterator[docker.DockerClient]:
    """``client``, or a new one (``connect``) that is closed at the block's end: who opens a
    Docker client closes it (an open one holds a socket to the daemon until it is)."""
    if client is not None:
        yield client
        return
    own = connect()
    try:
        yield own
    finally:
        own.close()


def kernel_source_hash(repo_root: Path, dockerfile_path: Path = DOCKERFILE) -> str:
    """The kernel's digest (``bundle.kernel_digest``) with the sandbox Dockerfile: paths go in
    with the contents, so renaming or moving a module counts as a change too. Anything else in
    the repository does not reach the image and does not count."""
    kernel = repo_root / KERNEL_DIR
    dockerfile = repo_root / dockerfile_path
    if not kernel.is_dir() or not dockerfile.is_file():
        raise ImageBuildError(f"{repo_root} has no {KERNEL_DIR}/ or {dockerfile_path}")
    return kernel_digest(kernel, dockerfile, root=repo_root)


def pinned_tag(tag: str, want: Mapping[str, str]) -> str:
    """``tag`` with a digest of what the image must hold appended (``farm-sandbox:default-k…``).

    The plain tag names the newest build on this host; the pinned one names the image of these
    sources for good, so two checkouts with different kernels on one host (a developer and a
    CI run, or an upgrade while a farm runs) each start the sandboxes of their own kernel."""
    digest = hashlib.sha256(json.dumps(dict(want), sort_keys=True).encode()).hexdigest()
    repository, _, name = tag.rpartition(":")
    return f"{repository or name}:{name if repository else 'latest'}-k{digest[:12]}"


def own_sandbox_tag(tag: str = DEFAULT_TAG, repo_root: Path | None = None) -> str:
    """The pinned tag of this checkout's kernel for the default sandbox image ``tag``, or
    ``tag`` itself when the sources to hash are not here (an installed package, e.g. the worker
    image) or the plain tag is of this kernel, or of none recorded (built before pinning
    existed). The plain tag of another checkout's kernel is never a silent stand-in for the
    pinned one (pruned by that checkout's build, ``PINS_KEPT``): the pinned tag is named, and
    its absence said as missing. Docker failing to answer raises (``DockerUnavailable``, or
    the SDK's error)."""
    try:
        want = {LABEL_KERNEL_HASH: kernel_source_hash(repo_root or default_repo_root())}
    except (ImageBuildError, OSError):
        return tag
    pinned = pinned_tag(tag, want)
    with docker_client(None) as client:
        if image_exists(client, pinned):
            return pinned
        try:
            built = (client.images.get(tag).labels or {}).get(LABEL_KERNEL_HASH)
        except docker.errors.ImageNotFound:
            return tag
        return tag if built in (None, want[LABEL_KERNEL_HASH]) else pinned


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def try_pull(client: docker.DockerClient, ref: str, timeout_s: float = PULL_TIMEOUT_S) -> bool:
    """Pull ``ref``; False if it fails or takes longer than ``timeout_s``.

    The SDK's pull has no timeout of its own, so it runs in a daemon thread that is abandoned
    on timeout (the daemon may finish the pull later; that is harmless).
    """
    outcome: list[BaseException | None] = []

    def pull() -> None:
        try:
            client.images.pull(ref)  # the SDK parses registry:port/repo:tag and @digest
            outcome.append(None)
        except BaseException as exc:  # reported to the caller below
            outcome.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=pull, name=f"pull {ref}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    elapsed = time.monotonic() - started
    if not outcome:
        logger.info("pulling %s took over %.0fs; giving up", ref, timeout_s)
        return False
    if outcome[0] is not None:
        logger.info("cannot pull %s (%.2fs): %s", ref, elapsed, outcome[0])
        return False
    logger.info("pulled %s in %.1fs", ref, elapsed)
    return True


def _run_base_build(script: Path, *, force: bool) -> None:
    """Run ``images/base/build.sh``, logging its output and killing it at the deadline."""
    cmd = [str(script), *(["--force"] if force else [])]
    logger.info("building %s with debootstrap (about a minute)", LOCAL_BASE)
    tail: deque[str] = deque(maxlen=30)
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        watchdog = threading.Timer(BASE_BUILD_TIMEOUT_S, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail.append(line.rstrip())
                logger.debug("%s", line.rstrip())
            returncode = proc.wait()
        finally:
            watchdog.cancel()
    if returncode != 0:
        raise ImageBuildError(
            f"{script} failed (exit {returncode}); last lines:\n" + "\n".join(tail)
        )


def ensure_base(
    client: docker.DockerClient, *, force: bool = False, repo_root: Path | None = None
) -> str:
    """The image to build the sandbox FROM: the public one if Docker can have it, else ours.

    ``python:3.12-slim`` is preferred when it is local or can be pulled within
    :data:`PULL_TIMEOUT_S`. Otherwise ``farm-base:bookworm`` is built offline by
    ``images/base/build.sh`` (skipped when it exists, unless ``force``).
    """
    if image_exists(client, PUBLIC_BASE) or try_pull(client, PUBLIC_BASE):
        return PUBLIC_BASE
    if force or not image_exists(client, LOCAL_BASE):
        _run_base_build((repo_root or default_repo_root()) / BASE_BUILD_SCRIPT, force=force)
    if not image_exists(client, LOCAL_BASE):
        raise ImageBuildError(f"{BASE_BUILD_SCRIPT} finished but {LOCAL_BASE} does not exist")
    return LOCAL_BASE


def tagged_image(client: docker.DockerClient, tag: str) -> tuple[str, dict[str, str]] | None:
    """The id and labels of the image ``tag`` names now, or None."""
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return str(image.id), dict(image.labels or {})


def _is_current(tag: str, have: dict[str, str], want: dict[str, str]) -> bool:
    stale = sorted(k for k, v in want.items() if have.get(k) != v)
    if stale:
        logger.info("%s is out of date (%s)", tag, ", ".join(stale))
    return not stale


def _remove_superseded(client: docker.DockerClient, image_id: str) -> None:
    """Drop the image a rebuild replaced, so kernel edits do not pile up images on disk.

    Best effort: Docker refuses while a container still runs it or another tag names it, and
    then it stays.
    """
    try:
        client.images.remove(image_id)
    except docker.errors.APIError as exc:
        logger.debug("keeping superseded image %s: %s", image_id, exc)
    else:
        logger.info("removed superseded image %s", image_id)


def _build_log(lines: Iterator[dict[str, Any]], tail: deque[str]) -> str | None:
    """Log a build's output as it streams; the built image id, or raise on a build error.

    Output comes in chunks that need not end lines (a step's stderr arrives a few characters
    at a time, coloured): ``tail`` gets whole lines without colour codes, so a reader (or
    ``environments.explain``) sees ``E: Unable to locate package x`` on one line."""
    deadline = time.monotonic() + BUILD_TOTAL_TIMEOUT_S
    image_id: str | None = None
    partial = ""
    for chunk in lines:
        partial += ANSI_ESCAPE.sub("", str(chunk.get("stream", "")))
        *complete, partial = partial.split("\n")
        for line in complete:
            if line.strip():
                tail.append(line.rstrip())
                logger.debug("%s", line.rstrip())
        if "error" in chunk:
            if partial.strip():
                tail.append(partial.rstrip())
            tail.append(ANSI_ESCAPE.sub("", str(chunk["error"])).rstrip())
            with contextlib.suppress(docker.errors.DockerException, OSError, ValueError):
                for _ in lines:  # the error ends the build: read its stream to the end, which
                    pass  # lets docker-py give the connection back (else its socket leaks)
            raise ImageBuildError("sandbox image build failed:\n" + "\n".join(tail))
        aux = chunk.get("aux")
        if isinstance(aux, dict) and "ID" in aux:
            image_id = str(aux["ID"])
        if time.monotonic() > deadline:
            raise ImageBuildError(f"sandbox image build took over {BUILD_TOTAL_TIMEOUT_S:.0f}s")
    return image_id


def ensure_sandbox_image(
    client: docker.DockerClient | None = None,
    *,
    tag: str = DEFAULT_TAG,
    force: bool = False,
    repo_root: Path | None = None,
    dockerfile: Path = DOCKERFILE,
    buildargs: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    prepare: Callable[[str], Path] | None = None,
    base: str | None = None,
    network_mode: str | None = None,
) -> SandboxImage:
    """Make ``tag`` an image of the current kernel, building only when it is missing or stale.

    Invariant: an image reused under ``tag`` has ``farm.kernel_hash`` equal to the hash of the
    kernel sources now, and every label of ``labels`` as given; anything else is rebuilt.
    ``force`` rebuilds without the layer cache (e.g. to take newer pip packages).

    Environments (``farm.sandbox.environments``) pass their own ``dockerfile``, ``buildargs``
    and ``labels``, ``prepare``, called with the base image before a build: it returns the
    build context to use instead of the repository (the Dockerfile, the kernel and the wheels
    it installs), ``base`` when the image starts from another one than the sandbox base, and
    ``network_mode="none"`` when the build needs no network (nothing to fetch: it must not).
    """
    root = (repo_root or default_repo_root()).resolve()
    with docker_client(client) as client:
        want = {LABEL_KERNEL_HASH: kernel_source_hash(root, dockerfile), **(labels or {})}
        pinned = pinned_tag(tag, want)
        previous = tagged_image(client, tag)
        if previous is not None and not force and _is_current(tag, previous[1], want):
            logger.debug("%s is current (%s)", tag, previous[0])
            _tag(client, previous[0], pinned)
            return SandboxImage(tag=tag, image_id=previous[0], built=False)
        kept = tagged_image(client, pinned)
        if kept is not None and not force and _is_current(pinned, kept[1], want):
            logger.info("%s: back to the build of these sources (%s)", tag, pinned)
            _tag(client, kept[0], tag)  # another checkout's build moved the plain tag: move it back
            return SandboxImage(tag=tag, image_id=kept[0], built=False)

        base = base or ensure_base(client, repo_root=root)
        context = prepare(base) if prepare is not None else root
        logger.info("building %s from %s", tag, base)
        tail: deque[str] = deque(maxlen=40)
        try:
            with build_lock.building():
                lines = client.api.build(
                    path=str(context),
                    dockerfile=dockerfile.as_posix(),
                    tag=tag,
                    buildargs={"BASE": base, **(buildargs or {})},
                    labels={**want, LABEL_BASE: base},
                    nocache=force,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    network_mode=network_mode,
                    decode=True,
                    timeout=BUILD_READ_TIMEOUT_S,
                )
                built_id = _build_log(lines, tail)
                image_id = str(client.images.get(tag).id)
        except docker.errors.DockerException as exc:
            raise ImageBuildError(f"building {tag} failed: {exc}\n" + "\n".join(tail)) from exc
        if built_id is not None and built_id != image_id:
            raise ImageBuildError(f"built {built_id} but {tag} now names {image_id}")
        _tag(client, image_id, pinned)
        with build_lock.removing() as no_build_runs:
            if no_build_runs:  # else the next build tidies up
                _prune_pins(client, tag, keep=PINS_KEPT)
                if previous is not None and previous[0] != image_id:
                    _remove_superseded(client, previous[0])
        return SandboxImage(tag=tag, image_id=image_id, built=True, base=base)


def _tag(client: docker.DockerClient, image_id: str, ref: str) -> None:
    repository, _, name = ref.rpartition(":")
    client.images.get(image_id).tag(repository, name)


def _prune_pins(client: docker.DockerClient, tag: str, keep: int) -> None:
    """Untag all but the ``keep`` newest pinned builds of ``tag`` (each kernel edit makes
    one); Docker keeps an image a container still runs, and removes the rest."""
    pin = re.compile(re.escape(pinned_tag(tag, {}).rpartition("-k")[0]) + r"-k[0-9a-f]{12}$")
    pins = []
    for image in client.images.list(name=tag.rpartition(":")[0] or tag):
        pins += [(image.attrs.get("Created", ""), ref) for ref in image.tags if pin.match(ref)]
    for _, ref in sorted(pins, reverse=True)[keep:]:
        try:
            client.images.remove(ref)
        except docker.errors.APIError as exc:
            logger.debug("keeping %s: %s", ref, exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m farm.sandbox.images",
        description="Build the farm sandbox image if the kernel changed; reuse it otherwise.",
    )
    parser.add_argument("--force", action="store_true", help="rebuild without the layer cache")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image tag (default {DEFAULT_TAG})")
    parser.add_argument("-v", "--verbose", action="store_true", help="show build output")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    # Progress (INFO) shows without -v; the build's own output (DEBUG) only with it.
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        image = ensure_sandbox_image(tag=args.tag, force=args.force)
    except DockerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    how = f"built from {image.base}" if image.built else "reused"
    print(f"{image.tag}\t{image.image_id}\t{how}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
