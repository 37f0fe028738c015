"""``python -m farm.worker.spare``: a local farm's worker server (``farm.local.spares``).

It imports what a worker's start imports, once, then reads orders on stdin, one JSON line
each: ``env``, a worker's whole environment, and ``log``, the file its output goes to. For
each it forks the worker with ``CLONE_PARENT``, so the worker is the *farm's* child (waited,
signalled and tied to it as one it started itself), and answers its pid on stdout. The fork
sets the environment, its log, a session of its own and the farm's tie, then runs
``farm.worker.__main__.main``. The server stays single-threaded and reads no setting, holds no
connection: each worker is the one its environment names. Stdin closed: exit 0.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import platform
import signal
import sys
import threading
from typing import Any

# What a worker's start imports beyond ``farm.worker.tasks``: Celery's worker (not its command
# line: ``farm.worker.__main__.run_worker``) and its bootsteps, the broker's transport,
# Docker's client and farm's sandboxes.
AHEAD = (
    "farm.worker.tasks",
    "farm.worker.__main__",
    "farm.sandbox.docker",
    "farm.sandbox.process",
    "celery.apps.worker",
    "celery.worker.consumer.consumer",
    "celery.worker.components",
    "celery.worker.autoscale",
    "celery.concurrency.thread",
    "celery.backends.redis",
    "kombu.transport.redis",
    "docker",
)
CLONE_PARENT = 0x00008000
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
PR_SET_PDEATHSIG = 1

_api = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the clone


def fork_sibling() -> int:
    """``os.fork`` whose child's parent is this process's parent (``CLONE_PARENT``): the
    child gets 0, this process the child's pid. Python's own fork hooks run around it."""
    number = SYS_CLONE.get(platform.machine())
    if number is None:
        raise OSError(f"no clone number known for {platform.machine()}")
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _api.syscall(number, CLONE_PARENT | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def become(order: dict[str, Any]) -> None:
    """In the fork: become the worker ``order`` names; never returns."""
    code = 1
    try:
        os.setsid()
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        _api.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # tied as the farm's own
        if os.getppid() != order["farm"]:  # the farm died before the tie: go too
            os._exit(1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ.clear()
        os.environ.update(order["env"])
        from farm.worker.__main__ import main as worker_main

        worker_main([])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    for module in AHEAD:
        importlib.import_module(module)
    from farm.models import frames

    frames.build_all()  # else each fork builds the validators of its first calls' frames
    gc.freeze()  # what was imported stays out of the forks' collections: its pages stay shared
    answers = sys.stdout.buffer
    for line in sys.stdin.buffer:
        order = json.loads(line)
        try:
            if threading.active_count() > 1:  # an import started one: a fork would lose it
                raise OSError("the worker server runs threads: it forks none")
            pid = fork_sibling()
        except OSError as exc:
            answers.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        else:
            if pid == 0:
                become(order)
            answers.write(json.dumps({"pid": pid}).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    main()
