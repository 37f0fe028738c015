"""Bring your own image: any image with ``python3`` >= 3.9 runs as a sandbox without being
rebuilt (farm mounts its kernel read-only and starts it with the image's interpreter), with
every hardening flag and the per-session box; an image without a usable python3, one whose
python3 is older than 3.9, or one that does not exist, fails fast saying so. Images here are
built by the test, from the offline base, without farm's kernel, and removed at the end."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import Farm
from farm.errors import ImageBuildError, SandboxUnavailable
from farm.local.embedded import LocalFarm
from farm.sandbox.environments import CONTEXT_DIR, WHEELS_DIR, ensure_env_image
from farm.sandbox.envspec import make_spec
from farm.sandbox.images import default_repo_root, ensure_base
from tests.conftest import build_test_image, removing_images

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TAG = f"pytest-byo/users-image:{os.getpid()}"
NO_PYTHON = f"pytest-byo/no-python:{os.getpid()}"
OLD_PYTHON = f"pytest-byo/old-python:{os.getpid()}"
# The image's python3 as a Python 3.8 looks to farm: Debian's 3.11 underneath, reporting 3.8.18
# (``sys.version_info``, which the kernel checks, and ``sys.version``, which ``platform`` reads),
# for ``python3 -m MODULE ...`` (the kernel's start) and ``python3 -c CODE`` (a build's probe).
OLD_PYTHON3 = """#!/usr/bin/python3.11
import runpy
import sys

sys.version_info = (3, 8, 18, "final", 0)
sys.version = "3.8.18 (default, Jan  1 2024, 00:00:00) [GCC 12.2.0]"
flag, target, *rest = sys.argv[1:]
if flag == "-m":
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *rest]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
"""


def _build(client: Any, tag: str, dockerfile: str) -> None:
    build_test_image(
        client,
        fileobj=io.BytesIO(dockerfile.encode()),
        tag=tag,
        rm=True,
        forcerm=True,
        network_mode="none",
    )


@pytest.fixture(scope="module")
def images(docker_env: Any, tmp_path_factory: Any) -> Iterator[None]:
    base = ensure_base(docker_env)
    context = Path(tmp_path_factory.mktemp("old-python"))
    (context / "python3").write_text(OLD_PYTHON3)
    (context / "python3").chmod(0o755)
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY python3 /usr/local/bin/python3\n"  # first on PATH
    )
    build_test_image(docker_env, path=str(context), tag=OLD_PYTHON, rm=True, network_mode="none")
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
        with removing_images():
            for tag in (TAG, NO_PYTHON, OLD_PYTHON):
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
        assert cwd == "/workspace"  # a box of its own, as in farm's images
        assert a.run("open('/workspace/x', 'w').write('a')").ok
        other = b.run("open('/workspace/x').read()")
        assert other.error is not None and other.error.ename == "FileNotFoundError"
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


def test_an_image_whose_python3_is_too_old_fails_fast_saying_so(farm: Farm) -> None:
    """The kernel's own check (``farm.kernel``: Python >= 3.9) stops its start, and what it
    said reaches the caller: within seconds, not at a start timeout."""
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable) as caught:
        farm.session(image=OLD_PYTHON)
    assert "farm's kernel needs Python >= 3.9; this is 3.8.18" in str(caught.value)
    assert time.monotonic() - started < 25  # the default start timeout is 30 s


def test_an_environment_from_an_image_whose_python3_is_too_old_is_refused(
    images: None, docker_env: Any
) -> None:
    name = f"pytest-oldpy-{os.getpid()}"
    try:
        with pytest.raises(
            ImageBuildError, match=r"has Python 3\.8\.18; farm's kernel needs >= 3\.9"
        ):
            ensure_env_image(make_spec(name=name, **{"from": OLD_PYTHON}), docker_env)
        assert docker_env.images.list(name=f"farm-sandbox:{name}") == []
    finally:  # what the refused build made: its lock file (it fails before anything else)
        root = default_repo_root()
        (root / CONTEXT_DIR / f"{name}.lock").unlink(missing_ok=True)
        assert not (root / CONTEXT_DIR / name).exists() and not (root / WHEELS_DIR / name).exists()


def test_an_image_that_does_not_exist_fails_fast_saying_so(farm: Farm) -> None:
    """Docker has no such image and pulls it first, as ``docker run`` would; no registry here
    has it (this machine reaches none), which fails at once."""
    with pytest.raises(SandboxUnavailable, match="no such image and could not pull it"):
        farm.session(image="pytest-byo/never-built:1")
