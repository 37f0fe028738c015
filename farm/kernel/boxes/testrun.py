"""One measured run of a program in a box: a judge's compile or test (``judging``).

A test is forked and exec'd by C code (``subprocess``) straight into the box's uid, under the
runner's lowered rlimits, with stdin from a box-readable file or a memfd and outputs to memfds.
Memory, CPU and wall time are sampled on the tree and enforced by killing it; ``wait4`` gives
CPU time and peak RSS (where it is the program's: ``own_peak_kb``); whatever the program left
is killed and reaped. Why and how:
docs/design/judge.md, "Measuring and limiting a test".
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import exit_peaks, uids
from . import starter as starters
from .box_protocol import BoxInfo
from .starter import Starter, StarterFailed
from .trees import kill_tree, tree, tree_stats

POLL_S = 0.01  # a test's tree sampled this often: each look costs a wake-up (design/judge.md)
TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
KILL_WAIT_S = 5.0
INHERITED_SLACK_KB = 512  # what a forked child may touch before its execve (its stack)


@dataclass
class Limits:
    cpu_s: float
    wall_s: float
    memory_kb: int
    output_bytes: int
    stack_bytes: int
    out_of_memory: tuple[bytes, ...] = ()  # a runtime's words on stderr for its heap's limit


@dataclass
class Measured:
    """What one run did: ``killed`` says why the runner killed it (``wait``), if it did."""

    exit_code: int | None
    signal: int | None
    cpu_s: float
    wall_s: float
    memory_kb: int
    killed: str | None
    stdout: bytes
    stderr: bytes
    output_bytes: int


def confine(box: BoxInfo, limits: Limits) -> None:
    """Lower the runner's own limits to a test's, for good (it has no ``CAP_SYS_RESOURCE``
    to raise them again: neither can the tests it starts), and its priority to a box's; and
    ``no_new_privs``, so that no test gains privileges from a set-uid program. The runner
    writes no file and starts nothing but tests from here on."""
    _limit(resource.RLIMIT_STACK, limits.stack_bytes, limits.stack_bytes)
    _limit(resource.RLIMIT_FSIZE, limits.output_bytes, limits.output_bytes)
    _limit(resource.RLIMIT_CORE, 0, 0)
    box_rlimits: dict[Literal["nofile", "pids"], int] = {
        "nofile": resource.RLIMIT_NOFILE,
        "pids": resource.RLIMIT_NPROC,
    }
    for name, which in box_rlimits.items():
        value = box["limits"].get(name)
        if value and (name != "pids" or box.get("uid") is not None):
            _limit(which, value, value)
    os.setpriority(os.PRIO_PROCESS, 0, uids.BOX_NICE)
    uids.prctl(uids.PR_SET_NO_NEW_PRIVS, 1)


def as_box(box: BoxInfo, isolation: str) -> contextlib.AbstractContextManager[None]:
    """For a block: this process reaches files with the box's rights (root here has no
    ``CAP_DAC_OVERRIDE``, and must not follow what the box planted as if it had)."""
    if isolation == "dirs":
        return contextlib.nullcontext()
    return uids.acting_as(box["uid"], box["gid"])


def spawn(
    argv: list[str],
    box: BoxInfo,
    isolation: str,
    *,
    stdin_fd: int | None,
    out_fd: int,
    err_fd: int,
) -> int:
    """Start a compile or test in the runner's working directory: forked and exec'd by C
    code as the box's uid (with the runner's limits: ``confine`` set a test's), in a
    session of its own, Python's ignored signals restored."""
    ids: dict[str, Any] = {}
    if isolation != "dirs":
        ids = {"user": box["uid"], "group": box["gid"], "extra_groups": []}
    proc = subprocess.Popen(
        argv,
        stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
        stdout=out_fd,
        stderr=err_fd,
        env=uids.program_env(box),
        start_new_session=True,
        restore_signals=True,
        umask=0o077,
        **ids,
    )
    proc.returncode = 0  # waited for with wait4 by the runner: Popen must not reap it
    return proc.pid


def _limit(which: int, soft: int, hard: int) -> None:
    """Set an rlimit, within the sandbox's own hard limit (no CAP_SYS_RESOURCE to pass it)."""
    ceiling = resource.getrlimit(which)[1]
    if ceiling != resource.RLIM_INFINITY:
        soft, hard = min(soft, ceiling), min(hard, ceiling)
    resource.setrlimit(which, (soft, hard))


def resident_kb(pid: int | str = "self") -> int:
    """The resident memory of one process now (kB), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_KB
    except (OSError, ValueError, IndexError):
        return 0


def own_peak_kb(maxrss_kb: int, inherited_kb: int) -> int:
    """A program's own peak from ``wait4``'s ``ru_maxrss``, or 0 when that may be the
    runner's: the kernel keeps the high-water mark of the process image an ``execve``
    replaced, and a child forked from the runner starts with up to the runner's resident
    pages (``inherited_kb``), so a one-line C program showed as the runner's 16 MB."""
    return maxrss_kb if maxrss_kb > inherited_kb + INHERITED_SLACK_KB else 0


def tree_usage(pid: int) -> tuple[int, float]:
    """The resident memory (kB) and CPU time (s) of ``pid`` and everything below it now."""
    rss, ticks = 0, 0
    for fields in tree_stats(pid):
        try:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            rss += int(fields[21]) * PAGE_KB
        except (ValueError, IndexError):
            continue
    return rss, ticks / TICKS


def wait(
    pid: int,
    limits: Limits,
    started: float,
    outputs: tuple[int, ...] = (),
    reap: Callable[[int], tuple[int, Any]] | None = None,
    exits: int | None = None,
) -> tuple[int, Any, float, int, str | None]:
    """Wait for ``pid``: its wait status, rusage, wall time since ``started`` (taken before
    it was started), the peak resident memory of its tree as sampled, or of ``pid`` as read
    at its ``exit_group`` on the listener ``exits`` (kB), and why the runner killed it
    (``memory``, ``cpu``, ``wall``, or ``output``: the memfds ``outputs`` together past
    ``limits.output_bytes``). ``reap`` (a starter's) gives the status and usage of a ``pid``
    that is not the runner's child, once its pidfd said it ended."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        if reap is None:
            raise
        raise StarterFailed(f"no process {pid}") from None
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if exits is not None:
        poller.register(exits, select.POLLIN)
    killed: str | None = None
    peak = 0
    sample = time.monotonic() + POLL_S
    try:
        while True:
            now = time.monotonic()
            left = started + limits.wall_s - now
            if left <= 0:
                killed = "wall"
                break
            ready = poller.poll(max(0.0, min(sample - now, left)) * 1000)
            if any(fd == pidfd for fd, _ in ready):
                break
            for fd, events in ready:  # an exit_group waits for its answer on ``exits``
                if events & (select.POLLHUP | select.POLLERR):  # no process left under it
                    poller.unregister(fd)
                else:
                    peak = max(peak, exit_peaks.answer_waiting(fd, pid) or 0)
            if time.monotonic() < sample:
                continue
            sample = time.monotonic() + POLL_S
            rss, cpu = tree_usage(pid)
            peak = max(peak, rss)
            if peak > limits.memory_kb:
                killed = "memory"
                break
            if cpu > limits.cpu_s:
                killed = "cpu"
                break
            if outputs and sum(os.fstat(fd).st_size for fd in outputs) > limits.output_bytes:
                killed = "output"
                break
        wall = time.monotonic() - started
        if killed is not None:
            kill_tree(pid)
        if reap is not None:
            status, usage = reap(pid)
        else:
            _, status, usage = os.wait4(pid, 0)
    finally:
        os.close(pidfd)
    return status, usage, wall, peak, killed


def sweep_leftovers() -> None:
    """Kill and reap every process below the runner (a program's children, orphans it left)
    but the item's starter (``starter.live``, whose runs are reaped by then): the next run
    starts alone."""
    me = os.getpid()
    spare = starters.live()
    if not spare:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                pass  # a child runs: look for them all below
        except ChildProcessError:  # no child at all: the program left nothing (the usual case)
            return
    elif _children(me) == set(spare):  # orphans come back to the runner, a subreaper
        return
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        for child in tree(me) - {me, *spare}:
            kill_tree(child)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not tree(me) - {me, *spare}:
            return
        time.sleep(0.001)  # they are dying: poll of a deadline


def _children(pid: int) -> set[int] | None:
    """The children of single-threaded ``pid`` now, or ``None`` where ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return {int(x) for x in f.read().split()}
    except (OSError, ValueError):
        return None


def read_all(fd: int, limit: int, tail: int = 0) -> tuple[bytes, int]:
    """The first ``limit`` bytes of a memfd and its last ``tail``, with how many bytes were
    cut between them; and its size."""
    size = os.fstat(fd).st_size
    if not tail or size <= limit + tail:
        return os.pread(fd, min(size, limit + tail), 0), size
    cut = f"\n[... {size - limit - tail} bytes cut ...]\n".encode()
    return os.pread(fd, limit, 0) + cut + os.pread(fd, tail, size - tail), size


def run(
    argv: list[str],
    box: BoxInfo,
    isolation: str,
    limits: Limits,
    *,
    stdin_path: str | None = None,
    stdin_data: bytes | None = None,
    keep_stdout: int,
    keep_stderr: int = 4096,
    keep_tail: int = 0,
    watch_output: bool = False,
    starter: Starter | None = None,
) -> Measured:
    """Run ``argv`` once in the box, in the runner's working directory, and measure it (see
    the module's docstring). Of each output it keeps the head (``keep_stdout``,
    ``keep_stderr``) and the last ``keep_tail`` bytes; ``watch_output`` kills it once both
    outputs hold over ``limits.output_bytes`` (a compile's: no ``RLIMIT_FSIZE`` bounds it).
    A ``starter`` starts it; should the starter fail (the program may have killed it), the
    run is thrown away and done again without one."""
    options: dict[str, Any] = {
        "stdin_path": stdin_path,
        "stdin_data": stdin_data,
        "keep": (keep_stdout, keep_stderr, keep_tail),
        "watch_output": watch_output,
    }
    if starter is not None and starter.alive:
        try:
            return _run(argv, box, isolation, limits, starter=starter, **options)
        except StarterFailed:
            sweep_leftovers()  # the starter is gone: whatever it started comes back here
    return _run(argv, box, isolation, limits, starter=None, **options)


def _run(
    argv: list[str],
    box: BoxInfo,
    isolation: str,
    limits: Limits,
    *,
    stdin_path: str | None,
    stdin_data: bytes | None,
    keep: tuple[int, int, int],
    watch_output: bool,
    starter: Starter | None,
) -> Measured:
    keep_stdout, keep_stderr, keep_tail = keep
    out_fd = os.memfd_create("stdout", os.MFD_CLOEXEC)
    err_fd = os.memfd_create("stderr", os.MFD_CLOEXEC)
    in_fd = None
    try:
        if stdin_path is not None:  # opened with the box's rights: only what it may read
            with as_box(box, isolation):
                in_fd = os.open(stdin_path, os.O_RDONLY | os.O_CLOEXEC)
        elif stdin_data is not None:
            in_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
            os.write(in_fd, stdin_data)
            os.lseek(in_fd, 0, os.SEEK_SET)
        inherited = resident_kb()  # what the child starts with, before its execve
        started = time.monotonic()  # a spawn returns once exec succeeded: it may have run
        if starter is not None:  # its refusal (not found, say) is the runner's to meet again
            pid, inherited = starter.start(argv, in_fd, out_fd, err_fd)
        else:
            try:
                pid = spawn(argv, box, isolation, stdin_fd=in_fd, out_fd=out_fd, err_fd=err_fd)
            except OSError as exc:  # not found, not executable, the directory taken away
                return Measured(127, None, 0.0, 0.0, 0, None, b"", f"farm: {exc}".encode(), 0)
        first = resident_kb(pid)  # a program done before the first sample still shows
        watched = (out_fd, err_fd) if watch_output else ()
        reap, exits = (starter.reap, starter.exits) if starter is not None else (None, None)
        status, usage, wall, peak, killed = wait(pid, limits, started, watched, reap, exits)
        sweep_leftovers()
        stdout, size = read_all(out_fd, keep_stdout, keep_tail)
        stderr, _ = read_all(err_fd, keep_stderr, keep_tail)
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
        memory_kb=max(own_peak_kb(int(usage.ru_maxrss), inherited), peak, first),
        killed=killed,
        stdout=stdout,
        stderr=stderr,
        output_bytes=size,
    )
