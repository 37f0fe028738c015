"""Environments with real builds and real Docker: one module-scoped environment (numpy from
PyPI, downloaded by the host, and Debian's nodejs through apt) runs real code in a local farm
that starts its worker on demand; ``--from`` a user's image adds the kernel offline; builds
that cannot succeed say which package failed; ``farm image ls`` shows the spec.

Every image, container, process and build directory made here is removed at the end.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from farm.client import Farm
from farm.errors import ImageBuildError, SandboxUnavailable
from farm.local.embedded import LocalFarm
from farm.registry import Registry
from farm.sandbox.catalog import build_image, list_images, prepare
from farm.sandbox.environments import CONTEXT_DIR, ENV_DOCKERFILE, WHEELS_DIR, ensure_env_image
from farm.sandbox.envspec import EnvLimits, EnvSpec, load_spec, make_spec
from farm.sandbox.images import (
    KERNEL_DIR,
    LABEL_KERNEL_HASH,
    default_repo_root,
    kernel_source_hash,
)
from farm.sweep import Sweep, plan_sweep
from tests.conftest import (
    Cells,
    build_test_image,
    make_docker_sandbox,
    remove_image_tags,
    removing_images,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUN = f"{os.getpid()}"
ENV = f"pytest-env-{RUN}"
SPEC = f"""\
name = "{ENV}"
requirements = ["requirements.txt"]
apt = ["nodejs", "gcc", "libc6-dev"]

[limits]
memory_mb = 768
"""
# A user's image: python3 (Debian's), a file of its own, and a last USER that is not root.
USERS_DOCKERFILE = "FROM farm-base:bookworm\nRUN echo {marker} > /marker\nUSER 65534\n"
NODE = "console.log([1, 2, 3].map((x) => x * 7).join(','))"


def _forget(client: Any, *names: str) -> None:
    """Remove what building ``names`` left: their images (with pinned tags), wheels, contexts."""
    root = default_repo_root()
    for name in names:
        remove_image_tags(client, f"farm-sandbox:{name}")
        shutil.rmtree(root / WHEELS_DIR / name, ignore_errors=True)
        shutil.rmtree(root / CONTEXT_DIR / name, ignore_errors=True)
        (root / CONTEXT_DIR / f"{name}.lock").unlink(missing_ok=True)


def _dangling_farm_layers(client: Any) -> set[str]:
    return {
        str(image.id)
        for image in client.images.list(filters={"dangling": True, "label": "farm.managed=1"})
    }


@pytest.fixture(scope="module", autouse=True)
def no_layers_left(docker_env: Any) -> Iterator[None]:
    """The layers builds here leave as cache once their images are gone (and a failed build's
    steps) are removed too: every farm layer that is dangling now and was not before."""
    before = _dangling_farm_layers(docker_env)
    yield
    with removing_images():  # a build in another test process commits dangling layers too
        for image_id in _dangling_farm_layers(docker_env) - before:
            with contextlib.suppress(docker.errors.APIError):  # a build of another run uses it
                docker_env.images.remove(image_id)


@pytest.fixture(scope="module")
def project(tmp_path_factory: Any) -> Path:
    """A user's project: a spec file beside the requirements file it names."""
    path = tmp_path_factory.mktemp("project")
    (path / "requirements.txt").write_text("numpy>=1.26\n")
    (path / "farm-env.toml").write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def env_image(docker_env: Any, project: Path) -> Iterator[EnvSpec]:
    """The environment of ``project``'s spec file, built once; its resolved spec."""
    spec = load_spec(project / "farm-env.toml")
    try:
        assert build_image(ENV, spec, client=docker_env, base_dir=project).built
        yield spec.resolve(project)
    finally:
        _forget(docker_env, ENV)


def test_an_environment_runs_numpy_and_node_on_a_worker_started_on_demand(
    docker_env: Any, env_image: EnvSpec
) -> None:
    with Farm.local(workers=0) as farm, farm.session(image=ENV) as session:
        numpy = session.run("import numpy as np\nint(np.arange(10).sum()), np.__version__")
        assert numpy.ok, numpy.error
        assert numpy.value is not None and numpy.value.text.startswith("(45, '")
        node = session.run(
            "import subprocess\n"
            f"subprocess.run(['node', '-e', {NODE!r}], capture_output=True, text=True).stdout"
        )
        assert node.ok, node.error
        assert node.value is not None and node.value.text == "'7,14,21\\n'"
        (worker,) = [w for w in farm.workers() if w["image"] == ENV]
        # the spec's limits reached the worker (the default image's memory is 512)
        assert worker["sandbox"]["limits"]["memory_mb"] == 768
        assert worker["sandbox"]["image_digest"] == docker_env.images.get(env_image.tag).id


def test_a_local_farms_first_workers_are_prepared_like_those_on_demand(
    docker_env: Any, env_image: EnvSpec
) -> None:
    """Workers a local farm starts with (``images={NAME: n}``) get the prepared build and the
    spec's limits too, not only those it starts for a session."""
    with Farm.local(images={ENV: 1}) as farm:
        (worker,) = farm.workers()
        assert worker["image"] == ENV and worker["sandbox"]["limits"]["memory_mb"] == 768
        assert worker["sandbox"]["image_digest"] == docker_env.images.get(env_image.tag).id


COMPILE_AND_RUN = "gcc -o six six.c && ./six 6"
C_SOURCE = """#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) { printf("%d\\n", atoi(argv[1]) * 7); return 0; }
"""


def test_one_sweep_runs_python_javascript_and_c_items_on_their_images(
    env_image: EnvSpec, tmp_path: Path
) -> None:
    """Items name their image; a command item compiles and runs C, another runs node, in the
    same sweep as Python items on the default image; each line's manifest names its image."""
    items = [
        {"id": "py", "code": "sum(range(10))"},
        {"id": "js", "image": ENV, "cmd": ["node", "-e", NODE]},
        {
            "id": "c",
            "image": ENV,
            "files": {"six.c": C_SOURCE},
            "cmd": "gcc -o six six.c && ./six 6",
        },
        {"id": "numpy", "image": ENV, "code": "import numpy\nint(numpy.arange(4).sum())"},
        {"id": "fails", "image": ENV, "cmd": "exit 4"},
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in items))
    out = tmp_path / "out.jsonl"
    with Farm.local(workers=1) as farm:
        Sweep(farm, concurrency=4).run(plan_sweep(source, out), out)
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["py"]["cells"][0]["value"]["text"] == "45"
    js = records["js"]
    assert js["status"] == "ok" and js["command"]["stdout"] == "7,14,21\n", js
    c = records["c"]
    assert c["status"] == "ok" and c["command"]["stdout"] == "42\n", c
    assert records["numpy"]["cells"][0]["value"]["text"] == "6"
    assert (records["fails"]["status"], records["fails"]["kind"]) == ("error", "user")
    assert records["fails"]["command"]["returncode"] == 4
    assert records["py"]["manifest"]["image"] == "default"
    manifest = records["c"]["manifest"]
    assert manifest["image"] == ENV and manifest["image_ref"].startswith(f"farm-sandbox:{ENV}")
    assert manifest["image_spec"]["apt"] == ["nodejs", "gcc", "libc6-dev"]
    assert manifest["image_digest"].startswith("sha256:")


def test_explicit_sandbox_settings_win_over_a_specs_limits(
    env_image: EnvSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FARM_SANDBOX_MEMORY_MB", "640")
    with LocalFarm(0) as local:
        worker_id = local.serve_image(ENV)
        registry = Registry.connect(local.settings())
        try:
            (worker,) = [w for w in registry.workers() if w["id"] == worker_id]
        finally:
            registry.close()
    assert worker["sandbox"]["limits"]["memory_mb"] == 640


def test_a_built_environment_is_reused_and_served_as_it_is(
    docker_env: Any, env_image: EnvSpec
) -> None:
    started = time.monotonic()
    assert not ensure_env_image(env_image, docker_env).built
    assert time.monotonic() - started < 10
    served = prepare(ENV, docker_env)  # what a local farm does first: its worker gets this
    assert EnvSpec.model_validate(served.spec) == env_image and served.kernel_built_in
    assert served.image_id == served.digest == docker_env.images.get(env_image.tag).id


def test_the_cli_builds_from_the_spec_file_and_lists_the_image_with_its_spec(
    project: Path, env_image: EnvSpec
) -> None:
    build = _farm_cli("image", "build", "-f", str(project / "farm-env.toml"))
    assert build.returncode == 0, build.stderr
    assert f"farm-sandbox:{ENV} " in build.stdout and "up to date" in build.stdout
    listed = _farm_cli("image", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (mine,) = [i for i in map(json.loads, listed.stdout.splitlines()) if i["name"] == ENV]
    assert mine["kind"] == "environment" and mine["tag"] == f"farm-sandbox:{ENV}"
    assert mine["spec"]["pip"] == ["numpy>=1.26"]
    assert mine["spec"]["apt"] == ["nodejs", "gcc", "libc6-dev"]
    assert mine["spec"]["limits"]["memory_mb"] == 768
    assert mine["env_hash"] == env_image.digest()
    assert mine["kernel_current"] is True and mine["pins"] == 1
    assert mine["digest"].startswith("sha256:") and mine["size_bytes"] > 50_000_000
    table = _farm_cli("image", "ls")
    assert ENV in table.stdout and "numpy>=1.26" in table.stdout


def test_a_python_package_that_does_not_exist_fails_the_build_naming_it(
    docker_env: Any,
) -> None:
    name = f"pytest-nopip-{RUN}"
    spec = make_spec(name=name, pip=["numpy", "farm-no-such-package-xyz"])
    try:
        with pytest.raises(ImageBuildError) as caught:
            ensure_env_image(spec, docker_env)
    finally:
        _forget(docker_env, name)
    assert caught.value.package == "farm-no-such-package-xyz"
    assert caught.value.image == f"farm-sandbox:{name}"
    assert "no wheel of 'farm-no-such-package-xyz'" in str(caught.value).splitlines()[0]


def test_the_cli_saves_the_spec_it_was_given_and_fails_a_build_naming_the_package(
    docker_env: Any, tmp_path: Path
) -> None:
    name = f"pytest-clifail-{RUN}"
    saved = tmp_path / "farm-env.toml"
    try:
        proc = _farm_cli(
            "image", "build", name, "--pip", "farm-no-such-package-xyz[extra]", "--save", str(saved)
        )
    finally:
        _forget(docker_env, name)
    assert proc.returncode == 1, proc.stdout
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "no wheel of 'farm-no-such-package-xyz[extra]'" in error, proc.stderr
    assert load_spec(saved) == make_spec(name=name, pip=["farm-no-such-package-xyz[extra]"])


def test_a_debian_package_that_does_not_exist_fails_the_build_naming_it(
    docker_env: Any,
) -> None:
    name = f"pytest-noapt-{RUN}"
    spec = make_spec(name=name, apt=["farm-no-such-deb"])
    try:
        with pytest.raises(ImageBuildError) as caught:
            ensure_env_image(spec, docker_env)
        assert docker_env.images.list(name=f"farm-sandbox:{name}") == []
    finally:
        _forget(docker_env, name)
    assert caught.value.package == "farm-no-such-deb"
    first = str(caught.value).splitlines()[0]
    assert "Unable to locate package farm-no-such-deb" in first, str(caught.value)


@pytest.fixture
def users_image(docker_env: Any) -> Iterator[str]:
    """A user's image with python3 that is not farm's: a marker file, another USER."""
    tag = f"pytest-users-image:{RUN}"
    _build_from_text(docker_env, tag, USERS_DOCKERFILE.format(marker="mine"))
    try:
        yield tag
    finally:
        with removing_images():
            docker_env.images.remove(tag)


def test_from_a_users_image_adds_the_kernel_offline_and_follows_its_spec_and_base(
    docker_env: Any, tmp_path_factory: Any, users_image: str
) -> None:
    name = f"pytest-from-{RUN}"
    spec = make_spec(name=name, **{"from": users_image})
    first_base = docker_env.images.get(users_image).id
    try:
        built = ensure_env_image(spec, docker_env)  # no packages: built with --network none
        assert built.built and built.base == users_image
        with (
            make_docker_sandbox(docker_env, tmp_path_factory, image=spec.tag) as box,
            box.kernel() as client,
        ):
            cells = Cells(client)
            assert cells.value("open('/marker').read()") == "'mine\\n'"
            assert int(str(cells.value("import os; os.getuid()"))) >= 100_000  # a box's uid
        assert not ensure_env_image(spec, docker_env).built
        # a changed spec is rebuilt (from the layer cache: only its labels differ)
        roomier = spec.model_copy(update={"limits": EnvLimits(memory_mb=1024)})
        assert ensure_env_image(roomier, docker_env).built
        # the user rebuilt their image: the environment follows it
        _build_from_text(docker_env, users_image, USERS_DOCKERFILE.format(marker="new"))
        rebuilt = ensure_env_image(roomier, docker_env)
        assert rebuilt.built and rebuilt.image_id != built.image_id
    finally:
        _forget(docker_env, name)
        with removing_images(), contextlib.suppress(docker.errors.ImageNotFound):
            docker_env.images.remove(first_base)  # else pruned with its child


def test_from_an_image_without_python_fails_saying_so(docker_env: Any, tmp_path: Path) -> None:
    tag = f"pytest-no-python:{RUN}"
    (tmp_path / "hello.txt").write_text("no interpreter here\n")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /hello.txt\n")
    build_test_image(docker_env, path=str(tmp_path), tag=tag, rm=True, network_mode="none")
    name = f"pytest-nopy-{RUN}"
    try:
        with pytest.raises(ImageBuildError, match=f"{tag} has no usable python3"):
            ensure_env_image(make_spec(name=name, **{"from": tag}), docker_env)
    finally:
        _forget(docker_env, name)
        with removing_images():
            docker_env.images.remove(tag)


def test_a_kernel_change_rebuilds_an_environment_from_its_recorded_spec(
    docker_env: Any, tmp_path: Path
) -> None:
    """``farm image build NAME`` after the kernel changed, in a copy of this checkout whose
    kernel the test edits: the image is rebuilt from the spec it recorded, holds the new
    kernel and is labelled with its hash; before the change and after the rebuild, it is
    current (nothing is built)."""
    root = tmp_path / "checkout"
    shutil.copytree(
        default_repo_root() / KERNEL_DIR,
        root / KERNEL_DIR,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (root / ENV_DOCKERFILE).parent.mkdir(parents=True)
    shutil.copy2(default_repo_root() / ENV_DOCKERFILE, root / ENV_DOCKERFILE)
    name = f"pytest-kernel-{RUN}"
    try:
        first = build_image(name, make_spec(name=name), client=docker_env, repo_root=root)
        assert first.built
        assert not build_image(name, client=docker_env, repo_root=root).built
        marker = f"# pytest {RUN}: the kernel changed\n"
        with (root / KERNEL_DIR / "__init__.py").open("a") as init:
            init.write(marker)
        rebuilt = build_image(name, client=docker_env, repo_root=root)  # from its recorded spec
        assert rebuilt.built and rebuilt.image_id != first.image_id
        image = docker_env.images.get(f"farm-sandbox:{name}")
        assert image.id == rebuilt.image_id
        assert image.labels[LABEL_KERNEL_HASH] == kernel_source_hash(root, ENV_DOCKERFILE)
        kernel = docker_env.containers.run(
            image.id,
            entrypoint=["cat", "/opt/farm/farm/kernel/__init__.py"],
            network_mode="none",
            remove=True,
        )
        assert kernel.decode().endswith(marker)
        assert not build_image(name, client=docker_env, repo_root=root).built
    finally:
        _forget(docker_env, name)


def test_a_name_that_was_never_built_is_refused_with_how_to_build_it(docker_env: Any) -> None:
    with pytest.raises(SandboxUnavailable, match=r"farm image build pytest-never-built"):
        prepare("pytest-never-built", docker_env)
    assert "pytest-never-built" not in {i.name for i in list_images(docker_env)}


def _build_from_text(client: Any, tag: str, dockerfile: str) -> None:
    build_test_image(
        client, fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none"
    )


def _farm_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``farm`` command of this checkout (``python -m farm.cli.main`` from its root)."""
    return subprocess.run(
        [sys.executable, "-m", "farm.cli.main", *args],
        cwd=default_repo_root(),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
