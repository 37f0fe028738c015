"""Bring your own image: any image with ``python3`` >= 3.9 runs as a sandbox without being
rebuilt (farm mounts its kernel read-only and starts it with the image's interpreter), with
every hardening flag and the per-session box; an image without a usable python3, or one that
does not exist, fails fast saying so. Images here are built by the test, from the offline base,
without farm's kernel, and removed at the end."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Any

import pytest

from farm.client import Farm
from farm.errors import SandboxUnavailable
from farm.local import LocalFarm
from farm.sandbox.images import ensure_base

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TAG = f"pytest-byo/users-image:{os.getpid()}"
NO_PYTHON = f"pytest-byo/no-python:{os.getpid()}"


def _build(client: Any, tag: str, dockerfile: str) -> None:
    client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, network_mode="none"
    )


@pytest.fixture(scope="module")
def images(docker_env: Any) -> Iterator[None]:
    base = ensure_base(docker_env)
    _build(
        docker_env,
        TAG,
        f"FROM {base}\nRUN echo users > /marker && mkdir -p /opt/app\n"
        'ENTRYPOINT ["sleep"]\nUSER 65534\n',  # nothing of farm's, and not root
    )
    _build(docker_env, NO_PYTHON, f"FROM {base}\nRUN rm -f /usr/bin/python3*\n")
    try:
        yield
    finally:
        for tag in (TAG, NO_PYTHON):
            docker_env.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def farm(images: None) -> Iterator[Farm]:
    local = LocalFarm(0).start()  # no worker yet: the image's is started on demand
    with Farm(local.settings(), owned=local) as farm:
        yield farm


def test_any_image_with_python3_is_a_hardened_sandbox_with_boxes(farm: Farm) -> None:
    with farm.session(image=TAG) as a, farm.session(image=TAG) as b:
        facts = a.run(
            "import os, sys\nstatus = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
            "(open('/marker').read(), os.getuid(), status['CapEff'].strip(), "
            "sys.version_info >= (3, 9), os.getcwd())"
        )
        assert facts.ok, facts.error
        marker, uid, caps, new_enough, cwd = eval(facts.value.text)  # type: ignore[union-attr]
        assert marker == "users\n" and uid >= 100_000 and int(caps, 16) == 0 and new_enough
        assert cwd.startswith("/workspace/box-")
        other = b.run(f"open('{cwd}/x', 'w')")
        assert other.error is not None and other.error.ename == "PermissionError"
        command = a.exec(["cat", "/marker"])
        assert command.ok and command.stdout == "users\n"
    (worker,) = [w for w in farm.workers() if w["image"] == TAG]
    sandbox = worker["sandbox"]
    assert sandbox["image"] == TAG and sandbox["image_digest"].startswith("sha256:")
    records = list(farm.map([{"id": 1, "code": "open('/marker').read()", "image": TAG}]))
    assert records[0].ok and records[0].manifest["image_ref"] == TAG


def test_an_image_without_python3_fails_fast_saying_so(farm: Farm) -> None:
    with pytest.raises(SandboxUnavailable, match="python3"):  # its start fails: no hang
        farm.session(image=NO_PYTHON)


def test_an_image_that_does_not_exist_fails_fast_saying_so(farm: Farm) -> None:
    with pytest.raises(SandboxUnavailable, match="no such image"):
        farm.session(image="pytest-byo/never-built:1")
