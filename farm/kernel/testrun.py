"""One measured run of a program in a box: a judge's compile or test (``judging``).

The runner forks the program as the box's uid (its limits, a process group of its own), with
stdin from a file the box may read (opened as the box) or a memfd, and stdout and stderr to
memfds that only the runner and the program hold. It waits on a pidfd, sampling the resident
memory of everything below it every ``POLL_S``; past the memory limit or the wall limit the
tree is killed. ``wait4`` gives the CPU time and peak RSS (``ru_maxrss``; the sampled peak of
the tree where that is larger: children count). Afterwards every
process the program left (children, double-forked orphans: the runner is a child subreaper,
so they come back to it) is stopped, killed and reaped before the next run starts.

Memory is measured, not bounded by ``RLIMIT_AS``/``RLIMIT_DATA``: Java, Go and node reserve
far more address space than they use (isolate's ``--cg-mem`` rather than ``--mem``).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import uids
from .commands import kill_tree, tree

POLL_S = 0.005
_DEFAULT_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGCHLD,
    signal.SIGPIPE,
    signal.SIGHUP,
    signal.SIGXFSZ,
    signal.SIGXCPU,
)
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
KILL_WAIT_S = 5.0


@dataclass
class Limits:
    cpu_s: float
    wall_s: float
    memory_kb: int
    output_bytes: int
    stack_bytes: int


@dataclass
class Measured:
    """What one run did: ``killed`` is ``"wall"`` or ``"memory"`` when the runner killed it."""

    exit_code: int | None
    signal: int | None
    cpu_s: float
    wall_s: float
    memory_kb: int
    killed: str | None
    stdout: bytes
    stderr: bytes
    output_bytes: int


def start(
    argv: list[str],
    box: dict[str, Any],
    isolation: str,
    limits: Limits,
    *,
    cwd: str,
    stdin_path: str | None,
    stdin_fd: int | None,
    out_fd: int,
    err_fd: int,
    prepare: Callable[[], bool] | None = None,
) -> int:
    """Fork the program into the box. ``prepare`` runs first as the box (writing the source,
    say); when it returns False the process exits 0 without running ``argv``."""
    pid = os.fork()
    if pid != 0:
        return pid
    code = 126
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin_fd if stdin_fd is not None else devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, 1 << 16)
        for sig in _DEFAULT_SIGNALS:  # Python ignores SIGPIPE and SIGXFSZ: a program must not
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        cpu = max(1, math.ceil(limits.cpu_s + 0.5))
        _limit(resource.RLIMIT_CPU, cpu, cpu + 1)
        _limit(resource.RLIMIT_STACK, limits.stack_bytes, limits.stack_bytes)
        _limit(resource.RLIMIT_FSIZE, limits.output_bytes, limits.output_bytes)
        own = {k: v for k, v in box["limits"].items() if k not in ("memory_mb", "fsize_mb")}
        uids.enter({**box, "limits": own}, isolation)
        if prepare is not None and not prepare():
            os._exit(0)
        os.chdir(cwd)
        if stdin_path is not None:  # opened as the box: it names only what the box may read
            fd = os.open(stdin_path, os.O_RDONLY)
            os.dup2(fd, 0)
            os.close(fd)
        code = 127
        os.execvp(argv[0], argv)
    except BaseException as exc:  # never returns into the runner
        with contextlib.suppress(Exception):
            os.write(2, f"farm: cannot run {argv[0]}: {exc}\n".encode())
    finally:
        os._exit(code)


def _limit(which: int, soft: int, hard: int) -> None:
    """Set an rlimit, within the sandbox's own hard limit (no CAP_SYS_RESOURCE to pass it)."""
    ceiling = resource.getrlimit(which)[1]
    if ceiling != resource.RLIM_INFINITY:
        soft, hard = min(soft, ceiling), min(hard, ceiling)
    resource.setrlimit(which, (soft, hard))


def tree_rss_kb(pid: int) -> int:
    """The resident memory of ``pid`` and everything below it, in kB."""
    total = 0
    for member in tree(pid):
        try:
            with open(f"/proc/{member}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE_KB
        except (OSError, ValueError, IndexError):
            continue
    return total


def wait(pid: int, limits: Limits) -> tuple[int, Any, float, int, str | None]:
    """Wait for ``pid``: its wait status, rusage, wall time, the peak resident memory of its
    tree as sampled (kB), and why the runner killed it."""
    started = time.monotonic()
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    killed: str | None = None
    peak = 0
    try:
        while True:
            left = started + limits.wall_s - time.monotonic()
            if left <= 0:
                killed = "wall"
                break
            if poller.poll(min(POLL_S, left) * 1000):
                break
            peak = max(peak, tree_rss_kb(pid))
            if peak > limits.memory_kb:
                killed = "memory"
                break
        if killed is not None:
            kill_tree(pid)
        _, status, usage = os.wait4(pid, 0)
    finally:
        os.close(pidfd)
    return status, usage, time.monotonic() - started, peak, killed


def sweep_leftovers() -> None:
    """Kill and reap every process below the runner (a program's children, orphans it left):
    the next run starts alone."""
    me = os.getpid()
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        for child in tree(me) - {me}:
            kill_tree(child)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if len(tree(me)) <= 1:
            return
        time.sleep(0.001)  # they are dying: poll of a deadline


def read_all(fd: int, limit: int) -> tuple[bytes, int]:
    """The first ``limit`` bytes of a memfd, and its size."""
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, limit), 0), size


def run(
    argv: list[str],
    box: dict[str, Any],
    isolation: str,
    limits: Limits,
    *,
    cwd: str,
    stdin_path: str | None = None,
    stdin_data: bytes | None = None,
    keep_stdout: int,
    keep_stderr: int = 4096,
    prepare: Callable[[], bool] | None = None,
) -> Measured:
    """Run ``argv`` once in the box and measure it (see the module's docstring)."""
    out_fd = os.memfd_create("stdout", os.MFD_CLOEXEC)
    err_fd = os.memfd_create("stderr", os.MFD_CLOEXEC)
    in_fd = None
    if stdin_data is not None:
        in_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
        os.write(in_fd, stdin_data)
        os.lseek(in_fd, 0, os.SEEK_SET)
    try:
        pid = start(
            argv,
            box,
            isolation,
            limits,
            cwd=cwd,
            stdin_path=stdin_path,
            stdin_fd=in_fd,
            out_fd=out_fd,
            err_fd=err_fd,
            prepare=prepare,
        )
        status, usage, wall, peak, killed = wait(pid, limits)
        sweep_leftovers()
        stdout, size = read_all(out_fd, keep_stdout)
        stderr, _ = read_all(err_fd, keep_stderr)
    finally:
        for fd in (out_fd, err_fd, in_fd):
            if fd is not None:
                os.close(fd)
    died = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    return Measured(
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=died,
        cpu_s=usage.ru_utime + usage.ru_stime,
        wall_s=wall,
        memory_kb=max(int(usage.ru_maxrss), peak),
        killed=killed,
        stdout=stdout,
        stderr=stderr,
        output_bytes=size,
    )
