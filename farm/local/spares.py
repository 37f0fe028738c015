"""``Spare``: a worker process a local farm starts ahead, for the next image it must serve.

It has imported a worker's code (``python -m farm.worker.spare``) and waits on its stdin for
the environment of the worker it becomes (a JSON line: ``env``, ``log``); until then it holds
no connection, thread or container. It is tied to the farm like its workers (``popen_tied``),
forked without the caller waiting for it, and ends when its stdin closes unread. Why and
what it saves: docs/design/local-farm.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from farm.local.processes import popen_tied_soon


class Spare:
    def __init__(self, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.env = env
        log_file = log_path.open("wb")  # the child's once forked
        self._forked = popen_tied_soon(
            [sys.executable, "-m", "farm.worker.spare"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._forked.add_done_callback(lambda _: log_file.close())

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """Its process (waits for its fork, a few milliseconds after the start)."""
        return self._forked.result()

    def fits(self, env: dict[str, str]) -> bool:
        """Whether it can become the worker of ``env``: the variables its interpreter read at
        its start (``PYTHON*``: its path, its hash seed...) must be the ones ``env`` names."""
        names = {k for k in (*env, *self.env) if k.startswith("PYTHON")}
        return all(env.get(k) == self.env.get(k) for k in names)

    def take(self, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes] | None:
        """Make it the worker of ``env``, logging to ``log_path``; None when it died meanwhile
        (the caller starts a worker the usual way)."""
        try:
            stdin = self.proc.stdin
        except OSError:  # it could not be forked
            return None
        assert stdin is not None
        if self.proc.poll() is not None:
            stdin.close()
            return None
        try:
            stdin.write(json.dumps({"env": env, "log": str(log_path)}).encode() + b"\n")
            stdin.close()
        except BrokenPipeError:  # it died just now
            self.proc.wait()
            return None
        return self.proc

    def discard(self) -> None:
        """End it unused: its stdin closes, so it exits (killed if it does not in time)."""
        if self._forked.exception() is not None:
            return
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
