"""Where the host forbids what boxes' namespaces need, the kernel says so, or refuses to start.

The host is simulated honestly: Docker runs the sandbox under a seccomp profile that refuses
``mount`` (as AppArmor's ``docker-default`` does), and the kernel's own probe finds that out.
The seccomp filter of a box is checked here too, on this host, in a forked child.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

import pytest

from farm.errors import SandboxStartError
from farm.kernel.boxes import seccomp
from farm.kernel.wire.client import KernelRequestError
from tests.conftest import make_docker_sandbox, no_mount_limits


@pytest.mark.docker
def test_a_host_that_forbids_mount_gets_uid_boxes_and_says_so(uid_sandbox: Any) -> None:
    with uid_sandbox.kernel() as client:
        pong = client.ping()
        opened = client.open_session()
        cwd = client.execute(opened["session_id"], "import os\nos.getcwd()", epoch=1)
    assert pong["isolation"] == "uids"
    assert "mount" in pong["isolation_fallback"] and "Operation not permitted" in str(
        pong["isolation_fallback"]
    )
    info = uid_sandbox.info()
    assert (info.isolation, info.isolation_fallback) == ("uids", pong["isolation_fallback"])
    assert cwd["value"]["text"].startswith("'/workspace/box-")  # a uid box's directories


@pytest.mark.docker
def test_uid_boxes_refuse_egress_since_their_loopback_is_shared(uid_sandbox: Any) -> None:
    """An endpoint on a loopback every box shares would be every box's way out: refused as
    bad input (the worker answers kind ``input``), and no session is left behind."""
    with uid_sandbox.kernel() as attached, uid_sandbox.kernel() as client:
        channel = attached.attach_egress()
        try:
            before = client.ping()["sessions"]
            with pytest.raises(KernelRequestError, match="egress needs boxes with namespaces"):
                client.open_session(egress=True)
            assert client.ping()["sessions"] == before
        finally:
            channel.close()


@pytest.mark.docker
def test_require_namespaces_refuses_to_start_where_they_are_forbidden(
    docker_env: Any, tmp_path_factory: Any
) -> None:
    limits = no_mount_limits(tmp_path_factory, require_namespaces=True)
    sandbox = make_docker_sandbox(docker_env, tmp_path_factory, limits=limits)
    with pytest.raises(SandboxStartError, match="cannot have namespaces"):
        sandbox.start()
    assert sandbox.container is None  # nothing left behind


def test_the_variable_that_requires_namespaces_is_farm_require_namespaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from farm.settings import FarmSettings

    monkeypatch.setenv("FARM_REQUIRE_NAMESPACES", "1")
    assert FarmSettings().limits.require_namespaces is True


REFUSED = {
    "unshare(CLONE_NEWUSER)": lambda libc: libc.unshare(0x10000000),
    "unshare(CLONE_NEWNS)": lambda libc: libc.unshare(0x00020000),
    "mount tmpfs": lambda libc: libc.mount(b"none", b"/mnt", b"tmpfs", 0, None),
    "setns": lambda libc: libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0),
    "clone(CLONE_NEWPID)": lambda libc: libc.syscall(56, 0x20000000 | 17, 0, 0, 0, 0),
    "bpf": lambda libc: libc.syscall(321, 0, 0, 0),
    "keyctl": lambda libc: libc.syscall(250, 0, 0, 0),
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86-64 below")
@pytest.mark.parametrize("built_before_fork", [False, True])
def test_the_box_filter_refuses_namespace_calls_and_lets_threads_and_forks_through(
    built_before_fork: bool,
) -> None:
    """In a forked child of this (root) process: before the filter, unshare works; after it,
    every call that could undo a box's namespaces is EPERM, clone3 is ENOSYS (libc falls back
    to clone), and a thread and a plain fork still start. The same whether the child builds
    the filter or installs the one its parent built before forking (as the zygote does)."""
    if built_before_fork:
        seccomp.prepare()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            seccomp.install()
            got = {}
            for name, call in REFUSED.items():
                got[name] = "ok" if call(libc) >= 0 else errno.errorcode[ctypes.get_errno()]
            got["clone3"] = errno.errorcode[ctypes.get_errno()] if libc.syscall(435, 0, 0) else "ok"
            import threading

            thread = threading.Thread(target=int)
            thread.start()
            thread.join()
            child = os.fork()
            if child == 0:
                os._exit(0)
            got["fork"] = "ok" if os.waitpid(child, 0)[1] == 0 else "failed"
            got["thread"] = "ok"
            os.write(write_end, repr(got).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        got = eval(reader.read())
    os.waitpid(pid, 0)
    expected = dict.fromkeys(REFUSED, "EPERM")
    expected.update({"clone3": "ENOSYS", "fork": "ok", "thread": "ok"})
    assert got == expected


def test_the_box_filter_is_built_for_both_architectures() -> None:
    for machine in ("x86_64", "aarch64"):
        program = seccomp.program(machine)
        assert len(program) % 8 == 0 and len(program) // 8 < 128
    assert seccomp.program("x86_64") != seccomp.program("aarch64")


@pytest.mark.docker
def test_farm_doctor_warns_when_boxes_fell_back_to_uids(tmp_path_factory: Any) -> None:
    from farm.cli.diagnose import _kernel_checks
    from farm.settings import FarmSettings

    settings = FarmSettings(limits=no_mount_limits(tmp_path_factory))
    check, _ = _kernel_checks(settings)
    assert check.ok and check.warn, check
    assert "BOXES HAVE NO NAMESPACES" in check.detail and "mount" in check.detail
    assert "apparmor" in check.fix.lower()
    check, capacity = _kernel_checks(FarmSettings())
    assert not check.warn  # boxes with namespaces: no warning
    # the default sandbox: 6144 MB of disks, 128 MB a box (its pids would allow 62)
    assert capacity.ok and not capacity.warn and "holds 48 boxes" in capacity.detail, capacity
    assert "FARM_SANDBOX_DISK_MB=6144" in capacity.detail, capacity
