"""Python's compile step (a syntax check) without a Python start: ``compile()`` in a fork of the
runner that became the box's uid, measured and limited like any compile (``testrun.wait``).

Taken only for the table's own check (``CHECK_ARGV``) and only when the box's ``python3`` is
the runner's interpreter, so the parser is the one that runs the tests; otherwise the check
runs as a process. The fork parses and never executes the source. Why: docs/design/judge.md,
"Measuring and limiting a test".
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import sys
import time
import traceback

from . import testrun, uids
from .box_protocol import BoxInfo

# The python3 row's compile command (farm/judge/language_table.py), with the source's name after it.
CHECK_CODE = 'import sys; compile(open(sys.argv[1], "rb").read(), sys.argv[1], "exec")'
CHECK_ARGV = ["python3", "-I", "-S", "-c", CHECK_CODE]


def applies(argv: list[str], box: BoxInfo) -> str | None:
    """The source file to check when ``argv`` is the table's Python check and the box's
    ``python3`` (on the box's ``PATH``) is this interpreter; else ``None``."""
    if len(argv) != len(CHECK_ARGV) + 1 or argv[:-1] != CHECK_ARGV:
        return None
    path = uids.program_env(box).get("PATH")
    found = shutil.which("python3", path=path)
    if found is None or os.path.realpath(found) != os.path.realpath(sys.executable):
        return None
    return argv[-1]


def _child(
    source: str, box: BoxInfo, isolation: str, limits: testrun.Limits, fds: tuple[int, int]
) -> None:
    """In the fork: the box's uid, the compile's CPU limit, outputs to the memfds; compile
    the source as ``python3 -I -S`` would (no future flag of this module: ``dont_inherit``).
    Exit 0, or 1 with the error on stderr; never returns."""
    code = 1
    try:
        gc.disable()  # a collection would touch (copy) every page of the runner's heap
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.closerange(3, 1 << 16)  # the runner's: none is the check's
        os.setsid()
        os.umask(0o077)
        seconds = int(limits.cpu_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds))
        if isolation != "dirs":
            uids.become(box["uid"], box["gid"])
        with open(source, "rb") as f:
            data = f.read()
        try:
            compile(data, source, "exec", dont_inherit=True)
            code = 0
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            text = "".join(traceback.format_exception_only(type(exc), exc))
            os.write(2, text.encode(errors="replace"))
    except BaseException as exc:  # the fork must exit, whatever happened
        os.write(2, f"farm: {exc!r}\n".encode(errors="replace"))
    finally:
        os._exit(code)


def run(
    source: str,
    box: BoxInfo,
    isolation: str,
    limits: testrun.Limits,
    *,
    keep: int,
    keep_tail: int,
) -> testrun.Measured:
    """Check ``source`` (in the runner's working directory) as the box; what ``testrun.run``
    would say of the check's process, its outputs kept as ``keep`` and ``keep_tail`` bytes."""
    out_fd = os.memfd_create("stdout", os.MFD_CLOEXEC)
    err_fd = os.memfd_create("stderr", os.MFD_CLOEXEC)
    try:
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(source, box, isolation, limits, (out_fd, err_fd))
        status, usage, wall, peak, killed = testrun.wait(pid, limits, started, (out_fd, err_fd))
        testrun.sweep_leftovers()
        stdout, size = testrun.read_all(out_fd, keep, keep_tail)
        stderr, _ = testrun.read_all(err_fd, keep, keep_tail)
    finally:
        os.close(out_fd)
        os.close(err_fd)
    return testrun.Measured(
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        cpu_s=usage.ru_utime + usage.ru_stime,
        wall_s=wall,
        memory_kb=max(int(usage.ru_maxrss), peak),
        killed=killed,
        stdout=stdout,
        stderr=stderr,
        output_bytes=size,
    )
