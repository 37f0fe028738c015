"""The docker backend against real Docker: hardening, isolation, token, health, replacement.

Each property is checked from inside the sandbox, by running code in it.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from farm.errors import SandboxStartError
from farm.kernel.wire.client import KernelConnectionError
from farm.sandbox import images
from farm.sandbox.docker import DockerSandbox, remove_orphans
from farm.sandbox.images import own_sandbox_tag
from farm.sandbox.sandbox_keeper import SandboxKeeper
from tests.conftest import TEST_OWNER, Cells, make_docker_sandbox, remove_image_tags
from tests.waiting import wait_for

pytestmark = pytest.mark.docker


def inside(sandbox: DockerSandbox, code: str, timeout_s: float = 30) -> Any:
    """Run ``code`` in a fresh session of ``sandbox``; return the value of its last expression."""
    with sandbox.kernel() as client:
        cells = Cells(client)
        result = cells.run(code, timeout_s=timeout_s)
        client.close_session(cells.id)
    assert result.ok, result.error
    assert result.value is not None
    return eval(result.value.data["text/plain"])


def test_user_code_runs_unprivileged_in_a_hardened_container(docker_sandbox: DockerSandbox) -> None:
    facts = inside(
        docker_sandbox,
        "import os, resource\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "def writable(p):\n"
        "    try:\n        open(p, 'w').close(); os.remove(p); return True\n"
        "    except OSError:\n        return False\n"
        "{'uid': os.getuid(), 'gid': os.getgid(), 'cap_eff': status['CapEff'].strip(),\n"
        " 'cap_bnd': status['CapBnd'].strip(), 'nnp': status['NoNewPrivs'].strip(),\n"
        " 'root_writable': writable('/etc/farm-probe'), 'tmp': writable('/tmp/p'),\n"
        " 'workspace': writable('/workspace/p'), 'cwd': os.getcwd(),\n"
        " 'nofile': resource.getrlimit(resource.RLIMIT_NOFILE),\n"
        " 'core': resource.getrlimit(resource.RLIMIT_CORE),\n"
        " 'fsize': resource.getrlimit(resource.RLIMIT_FSIZE),\n"
        " 'pid1': open('/proc/1/cmdline').read().split(chr(0))[0]}",
    )
    assert facts["uid"] >= 100_000 and facts["gid"] == facts["uid"]  # a box's own uid
    assert int(facts["cap_eff"], 16) == 0 and int(facts["cap_bnd"], 16) == 0
    assert facts["nnp"] == "1"
    assert not facts["root_writable"]
    assert facts["tmp"] and facts["workspace"]  # the box's own /tmp and /workspace
    assert facts["cwd"] == "/workspace"
    assert facts["nofile"] == (1024, 1024)
    assert facts["core"] == (0, 0)
    assert facts["fsize"] == (256 * 1024 * 1024,) * 2
    assert "python" in facts["pid1"]  # the box's own init (the kernel's fork) reaps zombies


def test_cgroup_limits_are_in_force(docker_sandbox: DockerSandbox) -> None:
    state = docker_sandbox.docker.api.inspect_container(docker_sandbox.container.id)
    host = state["HostConfig"]
    # the boxes' disks (6144 MB together) are tmpfs: in the sandbox's memory
    assert host["Memory"] == host["MemorySwap"] == (512 + 6144) * 1024 * 1024
    assert host["PidsLimit"] == 4096
    caps = ["CHOWN", "KILL", "NET_ADMIN", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN"]
    assert sorted(host["CapAdd"]) == caps
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["ReadonlyRootfs"] is True
    sizes = inside(
        docker_sandbox,
        "import os\n"
        "def size(p):\n    s = os.statvfs(p); return s.f_blocks * s.f_frsize // 2**20\n"
        "(size('/tmp'), size('/workspace'))",
    )
    assert sizes == (128, 128)  # one disk of the box's own (disk_mb) for both


def test_the_sandbox_has_no_network_at_all(docker_sandbox: DockerSandbox) -> None:
    facts = inside(
        docker_sandbox,
        "import os, socket\n"
        "routes = open('/proc/net/route').read().splitlines()[1:]\n"
        "def reach(host, port):\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close(); return 'connected'\n"
        "    except OSError as e:\n        return type(e).__name__\n"
        "def resolve(name):\n"
        "    try:\n        socket.getaddrinfo(name, 80); return 'resolved'\n"
        "    except OSError as e:\n        return type(e).__name__\n"
        "{'ifaces': sorted(os.listdir('/sys/class/net')), 'routes': routes,\n"
        " 'gateway_redis': reach('172.17.0.1', 6379),\n"
        " 'gateway_docker': reach('172.17.0.1', 2375),\n"
        " 'public': reach('1.1.1.1', 443), 'dns': resolve('pypi.org')}",
    )
    assert facts["ifaces"] == ["lo"]
    assert facts["routes"] == []
    for key in ("gateway_redis", "gateway_docker", "public"):
        assert facts[key] != "connected", key
    assert facts["dns"] != "resolved"


def test_the_kernel_token_is_invisible_inside(docker_sandbox: DockerSandbox) -> None:
    dump = inside(
        docker_sandbox,
        "import os, glob\n"
        "seen = [repr(dict(os.environ))]\n"
        "try:\n    seen.append(str(os.listdir('/run/farm')))\n"
        "except OSError as e:\n    seen.append(type(e).__name__)\n"
        "for p in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n        seen.append(open(p, 'rb').read().decode('latin-1'))\n"
        "    except OSError as e:\n        seen.append(type(e).__name__)\n"
        "'\\n'.join(seen)",
    )
    assert docker_sandbox.token not in dump
    assert "FARM_KERNEL_TOKEN" not in dump
    assert dump.splitlines()[1] == "[]"  # a box sees an empty directory at /run/farm
    assert docker_sandbox.container is not None
    listing = docker_sandbox.container.exec_run(["ls", "-A", "/run/farm"]).output.decode()
    assert listing.split() == ["kernel.sock"]  # as root: the token file was deleted


def test_one_sandbox_cannot_see_or_reach_another(
    docker_env: Any, tmp_path_factory: Any, docker_sandbox: DockerSandbox
) -> None:
    with make_docker_sandbox(docker_env, tmp_path_factory) as other:
        other_socket = other.address.removeprefix("unix:")
        facts = inside(
            docker_sandbox,
            "import os, socket\n"
            f"target = {other_socket!r}\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(target); outcome = 'connected'\n"
            "except OSError as e:\n    outcome = type(e).__name__\n"
            "own = socket.socket(socket.AF_UNIX)\n"
            "try:\n    own.connect('/run/farm/kernel.sock'); own_kernel = 'connected'\n"
            "except OSError as e:\n    own_kernel = type(e).__name__\n"
            "{'own_kernel': own_kernel, 'outcome': outcome,\n"
            " 'other_dir_visible': os.path.exists(os.path.dirname(target))}",
        )
    assert facts["own_kernel"] == "FileNotFoundError"  # its own kernel is hidden from it
    assert facts["outcome"] != "connected"
    assert not facts["other_dir_visible"]


def test_info_reports_backend_image_digest_and_limits(docker_sandbox: DockerSandbox) -> None:
    info = docker_sandbox.info()
    assert info.backend == "docker" and info.isolated
    assert info.image == own_sandbox_tag() and info.image.startswith("farm-sandbox:default-k")
    assert info.image_digest is not None and info.image_digest.startswith("sha256:")
    assert info.container_id == docker_sandbox.container.id
    assert info.limits["memory_mb"] == 512 and info.limits["network"] == "none"
    assert info.kernel_version
    json.dumps(info.model_dump())


def test_a_memory_bomb_is_kind_oom_and_the_kernel_survives(docker_sandbox: DockerSandbox) -> None:
    with docker_sandbox.kernel() as client:
        bystander = Cells(client)
        bystander.run("alive = 'yes'")
        bomber = Cells(client)
        result = bomber.run("x = bytearray(2 * 10**9)", timeout_s=60)
        assert result.error is not None
        assert result.error.kind == "oom", result.error
        assert bomber.value("1 + 1") == "2"  # the session carries on in a new epoch
        assert bystander.value("alive") == "'yes'"
        assert client.ping()["type"] == "pong"


def test_a_killed_container_fails_calls_fast_and_is_replaced(
    docker_env: Any, tmp_path_factory: Any
) -> None:
    lost: list[tuple[int, str]] = []
    keeper = SandboxKeeper(
        lambda: make_docker_sandbox(docker_env, tmp_path_factory),
        interval_s=0.2,
        on_lost=lambda gen, why: lost.append((gen, why)),
    )
    with keeper:
        first = keeper.sandbox
        assert isinstance(first, DockerSandbox) and first.container is not None
        client = keeper.kernel()
        cells = Cells(client)
        outcome: dict[str, Any] = {}
        started = threading.Event()

        def on_event(event: dict[str, Any]) -> None:
            if event["type"] == "started":
                started.set()  # the kernel runs it: the state under test

        def run() -> None:
            try:
                cells.run("import time\ntime.sleep(60)", timeout_s=120, on_event=on_event)
                outcome["error"] = None
            except KernelConnectionError as exc:
                outcome["error"] = exc
            outcome["failed_at"] = time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        assert started.wait(30), "the cell never started"
        docker_env.containers.get(first.container.id).kill()
        killed_at = time.monotonic()
        thread.join(timeout=30)
        assert isinstance(outcome.get("error"), KernelConnectionError)
        # the call in flight fails at once (a lenient bound for a loaded machine; the cell
        # would have run for 60 s)
        assert outcome["failed_at"] - killed_at < 5.0
        client.close()

        assert wait_for(lambda: keeper.ready and keeper.sandbox is not first, 60)
        assert keeper.ready and keeper.sandbox is not first
        assert keeper.restarts == 1 and keeper.generation == 2
        assert lost and lost[0][0] == 1
        assert keeper.health().ok
        with keeper.kernel() as fresh:
            assert Cells(fresh).value("'replacement works'") == "'replacement works'"
        assert keeper.info().restarts == 1


def test_a_fresh_kernels_first_open_takes_a_spare_on_its_way(
    docker_env: Any, tmp_path_factory: Any
) -> None:
    """A worker's first open comes right after its sandbox answers, while the kernel's first
    spares are being made (a box takes ~10 ms here): it takes one of them rather than a box of
    its own, which the zygote would only make after them."""
    with make_docker_sandbox(docker_env, tmp_path_factory) as sandbox, sandbox.kernel() as c:
        opened = c.open_session(session_id="first")
        seen = c.ping()
        assert (seen["opens"], seen["spare_opens"]) == (1, 1)
        result = c.execute("first", "6 * 7", epoch=opened["epoch"])
        assert result["value"]["data"]["text/plain"] == "42"


def test_a_failed_start_leaves_no_container(docker_env: Any, tmp_path_factory: Any) -> None:
    sandbox = make_docker_sandbox(docker_env, tmp_path_factory, image="farm-no-such-image:x")
    # not farm's, so pulled first (no registry serves it): the error says both
    with pytest.raises(SandboxStartError, match="missing and its pull failed: pull or build"):
        sandbox.start()
    names = [c.name for c in docker_env.containers.list(ignore_removed=True, all=True)]
    assert f"farm-sandbox-{sandbox.id}" not in names
    assert not sandbox.dir.exists()


def test_orphans_of_a_dead_owner_are_removed(docker_env: Any) -> None:
    import socket

    container = docker_env.containers.create(
        "farm-sandbox:default",
        labels={
            "farm.managed": "1",
            "farm.owner": TEST_OWNER,
            "farm.host": socket.gethostname(),
            "farm.pid": "999999999",
        },
        network_mode="none",
    )
    mine = docker_env.containers.create(
        "farm-sandbox:default",
        labels={
            "farm.managed": "1",
            "farm.owner": TEST_OWNER,
            "farm.host": socket.gethostname(),
            "farm.pid": str(__import__("os").getpid()),
        },
        network_mode="none",
    )
    try:
        removed = remove_orphans(docker_env)
        assert container.name in removed
        assert mine.name not in removed
    finally:
        mine.remove(force=True)


def other_checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's kernel and Dockerfile, its kernel changed by a comment."""
    repo = images.default_repo_root()
    other = tmp_path / "other"
    shutil.copytree(
        repo / images.KERNEL_DIR,
        other / images.KERNEL_DIR,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (other / images.DOCKERFILE).parent.mkdir(parents=True)
    shutil.copy(repo / images.DOCKERFILE, other / images.DOCKERFILE)
    init = other / images.KERNEL_DIR / "__init__.py"
    init.write_text(init.read_text() + "\n# another checkout's kernel\n")
    return other


def test_a_pruned_pin_is_missing_not_another_kernels_plain_tag(
    docker_env: Any, tmp_path: Path
) -> None:
    """This checkout's pinned build is gone (another checkout's builds prune old pins) and the
    plain tag holds another kernel: the pinned tag is named (missing: a clear error where a
    sandbox starts), never the other kernel's build."""
    tag = f"farm-sandbox:prunetest{os.getpid()}"
    try:
        other = other_checkout(tmp_path)
        theirs = images.ensure_sandbox_image(docker_env, tag=tag, repo_root=other)
        assert docker_env.images.get(tag).id == theirs.image_id
        mine = images.own_sandbox_tag(tag)
        assert mine != tag and not images.image_exists(docker_env, mine)
    finally:
        remove_image_tags(docker_env, tag)


def test_two_kernels_on_one_host_each_keep_their_own_build(docker_env: Any, tmp_path: Path) -> None:
    """Two checkouts with different kernels (a developer and a CI run) build the same tag in
    turn: each still starts the sandboxes of its own kernel (its pinned tag), and going back
    to a kernel built before moves the plain tag back without a rebuild."""
    tag = f"farm-sandbox:pintest{os.getpid()}"
    other = other_checkout(tmp_path)
    try:
        mine = images.ensure_sandbox_image(docker_env, tag=tag)
        theirs = images.ensure_sandbox_image(docker_env, tag=tag, repo_root=other)
        assert theirs.built and theirs.image_id != mine.image_id
        assert docker_env.images.get(tag).id == theirs.image_id  # the plain tag moved
        assert docker_env.images.get(images.own_sandbox_tag(tag)).id == mine.image_id
        assert docker_env.images.get(images.own_sandbox_tag(tag, other)).id == theirs.image_id
        again = images.ensure_sandbox_image(docker_env, tag=tag)
        assert not again.built and again.image_id == mine.image_id
        assert docker_env.images.get(tag).id == mine.image_id
    finally:
        remove_image_tags(docker_env, tag)
