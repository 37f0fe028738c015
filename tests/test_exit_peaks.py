"""The listener on a test's ``exit_group`` (``farm.kernel.boxes.exit_peaks``), on this machine's
kernel: a starter-like child adds the filter and starts programs; this process answers."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from farm.kernel.boxes import exit_peaks

pytestmark = pytest.mark.skipif(
    os.uname().machine not in exit_peaks.NUMBERS, reason="exit_group's number is not known here"
)

# the child: no_new_privs, the filter, the listener to us, then one program per line we send
CHILD = """
import os, socket, sys
from farm.kernel.boxes import exit_peaks, uids
uids.prctl(uids.PR_SET_NO_NEW_PRIVS, 1)
sock = socket.socket(fileno=int(sys.argv[1]))
listener = exit_peaks.listen()
socket.send_fds(sock, [b"listening"], [listener])
os.close(listener)
while (line := sock.recv(4096)):
    if line == b"missing":  # an execve that fails: posix_spawn's child ends with 127
        try:
            os.posix_spawn("/nonexistent/program", ["program"], os.environ)
        except FileNotFoundError:
            sock.send(b"refused")
        continue
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", line.decode()], os.environ)
    sock.send(str(pid).encode())
    _, status = os.waitpid(pid, 0)
    sock.send(str(os.waitstatus_to_exitcode(status)).encode())
"""


@pytest.fixture
def starter() -> Iterator[tuple[socket.socket, int]]:
    """The child's socket and the listener it sent."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    try:
        data, fds, _, _ = socket.recv_fds(ours, 64, 1)
        assert data == b"listening" and len(fds) == 1, data
        yield ours, fds[0]
        with contextlib.suppress(OSError):  # one test closes it itself
            os.close(fds[0])
    finally:
        ours.close()
        child.kill()
        child.wait()


def _answered(sock: socket.socket, listener: int, code: str) -> tuple[int, int | None]:
    """Run ``code`` in the child, answering its exits: its exit status and its peak (kB)."""
    sock.send(code.encode())
    pid = int(sock.recv(64))
    peak = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock, listener], [], [], deadline - time.monotonic())
        if listener in ready:
            seen = exit_peaks.answer(listener)
            if seen is not None and seen[0] == pid:
                peak = seen[1]
        if sock in ready:
            return int(sock.recv(64)), peak
    raise AssertionError(f"{code!r} did not end")


def test_a_program_s_peak_is_read_at_its_exit_and_its_status_kept(
    starter: tuple[socket.socket, int],
) -> None:
    sock, listener = starter
    small = _answered(sock, listener, "import sys; sys.exit(3)")
    large = _answered(sock, listener, "x = bytearray(64 << 20); x[::4096] = b'1' * (16 << 10)")
    assert small[0] == 3 and large[0] == 0
    assert small[1] is not None and 1024 < small[1] < 32 << 10, small
    assert large[1] is not None and large[1] > small[1] + (60 << 10), large


def test_a_thread_s_exit_group_names_its_process(starter: tuple[socket.socket, int]) -> None:
    sock, listener = starter
    code = "import os, threading; t = threading.Thread(target=os._exit, args=(5,)); t.start()"
    status, peak = _answered(sock, listener, code + "; t.join()")
    assert status == 5 and peak is not None and peak > 1024


def test_a_spawn_that_fails_is_not_stopped_at_its_exit(
    starter: tuple[socket.socket, int],
) -> None:
    """The spawning child's ``exit_group(127)`` while its parent waits in ``vfork``: were it
    stopped, nobody would answer (the runner waits for the starter's answer)."""
    sock, _ = starter
    sock.send(b"missing")
    ready, _, _ = select.select([sock], [], [], 10)
    assert ready and sock.recv(64) == b"refused"
    assert _answered(sock, starter[1], "pass")[0] == 0


def test_with_the_listener_gone_a_program_still_ends(starter: tuple[socket.socket, int]) -> None:
    """libc's ``_exit`` meets ``ENOSYS`` from ``exit_group`` and ends the thread with ``exit``:
    a runner gone leaves no program stuck in its exit."""
    sock, listener = starter
    os.close(listener)
    sock.send(b"import sys; sys.exit(7)")
    int(sock.recv(64))
    ready, _, _ = select.select([sock], [], [], 30)
    assert ready and int(sock.recv(64)) == 7
