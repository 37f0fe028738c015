"""``WorkerServer``: the process a local farm forks its workers from, having imported their code.

It runs ``python -m farm.worker.spare``, started with the farm (its ~0.5 s of imports overlap
the broker's start and the image's preparation) and tied to it like the workers. Each worker
it forks is the farm's own child (``CLONE_PARENT``): ``Forked`` waits for and signals it as
``subprocess.Popen`` does its children. So a farm's first workers and each image served later
pay a fork, not an interpreter's start and imports each. A server that died, or does not answer
in time, is dropped and the farm starts its workers the usual way. Why and what it saves:
docs/design/local-farm.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from farm.local.processes import popen_tied_soon

ANSWER_S = 60.0  # the server answers once its imports are done: seconds under a heavy load


class Forked:
    """A worker the server forked: this process's child, with ``Popen``'s waiting and signals."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.args = ["farm.worker.spare", str(pid)]
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: its status is lost
                    self.returncode = 0
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.poll()
        if code is not None:
            return code
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            pidfd = None
        if pidfd is not None:
            try:
                ready, _, _ = select.select([pidfd], [], [], timeout)
            finally:
                os.close(pidfd)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        code = self.poll()
        return code if code is not None else 0

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerServer:
    def __init__(self, log_path: Path, env: dict[str, str]) -> None:
        self.env = env
        self._lock = threading.Lock()
        log_file = log_path.open("wb")  # the child's once forked
        self._forked = popen_tied_soon(
            [sys.executable, "-m", "farm.worker.spare"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
        )
        self._forked.add_done_callback(lambda _: log_file.close())

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """Its process (waits for its fork, a few milliseconds after the start)."""
        return self._forked.result()

    def fits(self, env: dict[str, str]) -> bool:
        """Whether it can fork the worker of ``env``: the variables its interpreter read at
        its start (``PYTHON*``: its path, its hash seed...) must be the ones ``env`` names."""
        names = {k for k in (*env, *self.env) if k.startswith("PYTHON")}
        return all(env.get(k) == self.env.get(k) for k in names)

    def launch(self, env: dict[str, str], log_path: Path) -> Forked | None:
        """Fork the worker of ``env``, logging to ``log_path``; None when the server is gone
        or silent (it is then ended: the caller starts that worker the usual way, and no
        late fork can double it)."""
        with self._lock:
            try:
                proc = self.proc
            except OSError:  # it could not be started
                return None
            assert proc.stdin is not None and proc.stdout is not None
            if proc.poll() is not None:
                return None
            order = {"env": env, "log": str(log_path), "farm": os.getpid()}
            try:
                proc.stdin.write(json.dumps(order).encode() + b"\n")
                proc.stdin.flush()
            except OSError:  # it died just now
                self._end(proc)
                proc.stdout.close()
                return None
            ready, _, _ = select.select([proc.stdout], [], [], ANSWER_S)
            if not ready:
                self._end(proc)  # what it says after its end is still read below
            try:
                answer = json.loads(proc.stdout.readline() or b"{}")
            except ValueError:
                answer = {}
            if not ready:
                proc.stdout.close()
            pid = answer.get("pid") if isinstance(answer, dict) else None
            return Forked(pid) if isinstance(pid, int) and pid > 1 else None

    def close(self) -> None:
        """End it: its stdin closes, so it exits (killed if it does not in time)."""
        with self._lock:
            if self._forked.exception() is None:
                self._end(self.proc)
                if self.proc.stdout is not None:
                    self.proc.stdout.close()

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        if proc.stdin is not None and not proc.stdin.closed:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
