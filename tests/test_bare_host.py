"""The kernel straight on a host, as root: a root that lacks what Docker gives a sandbox.

The host is simulated by a root of this machine's own with parts missing (``ROOT_SCRIPT``),
which the kernel is started in, in mount, IPC and pid namespaces of its own: the machine's
``/dev``, ``/var/tmp``, queues and processes are left as they were, and everything the kernel
started ends with the namespace.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.kernel.wire import auth
from farm.kernel.wire.client import KernelClient

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(map(shutil.which, ("unshare", "pivot_root"))),
    reason="needs root, unshare and pivot_root (util-linux)",
)

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
UID_BASE = 60_000  # below the docker sandboxes' blocks (farm.sandbox.docker.UID_FIRST)
FRESH = (Path("/tmp"), Path("/var/tmp"))  # the root's own: what was there is hidden


def kept_paths() -> list[str]:
    """The checkout and the Python it runs on, where they live under a directory the root
    makes fresh (a clone in /tmp, as CI may make): bound again at the same path."""
    ours = {Path(__file__).resolve().parents[1], Path(sys.prefix).resolve()}
    return sorted(str(p) for p in ours if any(p.is_relative_to(f) for f in FRESH))


# In new mount, IPC and pid namespaces: a root of tmpfs holding this machine's directories
# (bound), a fresh /proc, /tmp, /var/tmp and /dev (its device nodes bound, a fresh /dev/shm),
# a /workspace ($1: yes or no) and a /dev/mqueue ($2), pivoted to; then the command. $KEEP
# names directories under the fresh /tmp or /var/tmp to bind again (a checkout in /tmp).
ROOT_SCRIPT = r"""
set -e
workspace=$1 mqueue=$2; shift 2
R=/mnt
mount -t tmpfs -o mode=0755 farm-root "$R"
for d in /*; do
    n=${d#/}
    case $n in dev|proc|tmp|var|mnt) continue ;; esac
    if [ -L "$d" ]; then ln -s "$(readlink "$d")" "$R/$n"
    elif [ -d "$d" ]; then mkdir "$R/$n" && mount --rbind "$d" "$R/$n"
    fi
done
mkdir "$R/dev" "$R/proc" "$R/tmp" "$R/var" "$R/mnt"
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=1777 farm-tmp "$R/tmp"
mount --rbind /var "$R/var"
mount -t tmpfs -o mode=1777 farm-var-tmp "$R/var/tmp"
for k in $KEEP; do mkdir -p "$R$k" && mount --rbind "$k" "$R$k"; done
mount -t tmpfs -o mode=0755 farm-dev "$R/dev"
for n in null zero full random urandom tty; do
    touch "$R/dev/$n" && mount --bind "/dev/$n" "$R/dev/$n"
done
mkdir "$R/dev/pts" "$R/dev/shm"
mount --rbind /dev/pts "$R/dev/pts"
mount -t tmpfs -o mode=1777 farm-shm "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"
ln -s pts/ptmx "$R/dev/ptmx"
if [ "$mqueue" = yes ]; then mkdir "$R/dev/mqueue" && mount -t mqueue mqueue "$R/dev/mqueue"; fi
if [ "$workspace" = yes ]; then mkdir "$R/workspace"; fi
cd "$R" && mkdir .old && pivot_root . .old && umount -l /.old && rmdir /.old && cd /
"$@"
"""


class Kernel:
    def __init__(self, address: str, token: str, log: Path) -> None:
        self.address, self.token, self.log = address, token, log

    def client(self) -> KernelClient:
        return KernelClient(address=self.address, token=self.token)


@contextlib.contextmanager
def kernel_in_root(tmp_path: Path, *, workspace: bool, mqueue: bool) -> Iterator[Kernel]:
    """A kernel (namespaces asked for) started as root in a root with or without
    ``/workspace`` and ``/dev/mqueue``; stopped, with all it started, at the end."""
    token = auth.new_token()
    log = tmp_path / "kernel.log"
    unshare = ["unshare", "--mount", "--ipc", "--pid", "--fork", "--kill-child"]
    kernel = [sys.executable, "-m", "farm.kernel", "--listen", "127.0.0.1:0"]
    kernel += ["--workspace", "/var/tmp/boxes", "--tmp-root", "/var/tmp/tmp"]
    kernel += ["--box-uid-base", str(UID_BASE), "--isolation", "namespaces"]
    flags = ["yes" if workspace else "no", "yes" if mqueue else "no"]
    env = {**os.environ, "FARM_KERNEL_TOKEN": token, "FARM_KERNEL_LOG_LEVEL": "INFO"}
    env["KEEP"] = " ".join(kept_paths())
    with (
        log.open("wb") as stderr,
        subprocess.Popen(
            [*unshare, "--propagation", "private", "sh", "-c", ROOT_SCRIPT, "sh", *flags, *kernel],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=tmp_path,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            readable, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
            line = proc.stdout.readline() if readable else b""
            assert line, f"the kernel did not become ready: {log.read_text()}"
            ready = json.loads(line)  # the kernel's readiness line
            yield Kernel(str(ready["listen"]), token, log)
        finally:
            stop(proc)


def stop(unshare: subprocess.Popen[bytes]) -> None:
    """Kill the pid namespace's init (unshare's child): the kernel ends every process of the
    namespace before the init is reaped, so unshare's exit means nothing of it is left."""
    for pid in children(unshare.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        unshare.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        unshare.kill()  # --kill-child: its child is killed with it
        unshare.wait(STOP_TIMEOUT_S)


def children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) == parent:  # the field after the state
                found.append(int(entry))
    return found


# A session's cell: whether the queue of the last session of its box number is still there,
# then one of its own left behind.
LEAVE_A_QUEUE = """
import ctypes, os
rt = ctypes.CDLL("librt.so.1", use_errno=True)
found = rt.mq_open(b"/left-by-a-session", os.O_RDWR) >= 0
assert rt.mq_open(b"/left-by-a-session", os.O_RDWR | os.O_CREAT, 0o600, None) >= 0
(os.getuid(), found)
"""


def test_without_dev_mqueue_a_box_still_removes_the_queues_it_was_left(tmp_path: Path) -> None:
    """Where the root has no /dev/mqueue, boxes keep their namespaces (they mount their queues
    where only their init reaches them), and the next box of a number finds none of the queues
    the last one left: sessions open until a number comes round again."""
    with kernel_in_root(tmp_path, workspace=True, mqueue=False) as kernel, kernel.client() as c:
        pong = c.ping()
        assert (pong["isolation"], pong["isolation_fallback"]) == ("namespaces", None)
        seen: list[tuple[int, bool]] = []
        deadline = time.monotonic() + 60
        while len({uid for uid, _ in seen}) == len(seen) and time.monotonic() < deadline:
            session = c.open_session()["session_id"]
            result = c.execute(session, LEAVE_A_QUEUE, epoch=1)
            c.close_session(session)
            assert result.get("error") is None, result
            uid, found = ast.literal_eval(result["value"]["text"])
            seen.append((uid, found))
    assert len({uid for uid, _ in seen}) < len(seen), f"no box number came round again: {seen}"
    assert not any(found for _, found in seen), seen
    assert "each box mounts its queues where its init alone sees them" in kernel.log.read_text()


def test_without_workspace_boxes_fall_back_to_uids_and_say_so(tmp_path: Path) -> None:
    """A box's working directory is its /workspace, mounted on the root's: where the root has
    none, the start probe fails as a box would, and the kernel falls back to uid boxes, loudly
    (log and pong), whose sessions work."""
    with kernel_in_root(tmp_path, workspace=False, mqueue=True) as kernel, kernel.client() as c:
        pong = c.ping()
        session = c.open_session()["session_id"]
        result = c.execute(session, "import os\nos.getcwd()", epoch=1)
    assert pong["isolation"] == "uids"
    assert "no /workspace" in str(pong["isolation_fallback"])
    assert "BOXES HAVE NO NAMESPACES" in kernel.log.read_text()
    assert result.get("error") is None, result
    assert result["value"]["text"].startswith("'/var/tmp/boxes/box-")  # a uid box's directory
