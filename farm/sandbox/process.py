"""The ``process`` backend: the kernel as a local subprocess. NO isolation: development only.

User code runs as you, with your files, network and environment, minus farm's own variables
(``kernel_environment``). Every start logs a loud warning and ``info().isolated`` is False.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from farm.errors import SandboxStartError
from farm.kernel.wire import auth
from farm.kernel.wire.client import KernelError
from farm.local.processes import popen_tied
from farm.models import Preloaded, SandboxInfo
from farm.sandbox.backend import KERNEL_ENV, Sandbox, box_arguments
from farm.settings import BoxSettings, FarmSettings

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
# What the kernel keeps of farm's variables: its own (it reads FARM_KERNEL_LOG_LEVEL).
KERNEL_PREFIX = "FARM_KERNEL_"
# Credentials for the broker that are not farm's variables: redis-cli's password (docs/deployment.md
# has operators export it).
OTHER_SECRETS = frozenset({"REDISCLI_AUTH"})


def kernel_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment of the kernel, and so of user code, given the worker's: without any of
    farm's settings (``FarmSettings``' ``FARM_*``). They hold the broker's credentials
    (``FARM_BROKER_URL`` may carry the password, ``FARM_BROKER_PASSWORD``, the TLS client key's
    path), and whoever holds those can submit code to every sandbox and read every result;
    none of the rest is user code's business either. Defence in depth only: code running as
    your uid may still read the worker's ``/proc/<pid>/environ`` and your files (this backend
    isolates nothing)."""
    prefix = str(FarmSettings.model_config.get("env_prefix", "FARM_"))
    return {
        name: value
        for name, value in environ.items()
        if name not in OTHER_SECRETS
        and (not name.upper().startswith(prefix) or name.upper().startswith(KERNEL_PREFIX))
    }


_warned = False  # the warning that this backend isolates nothing was given in this process


class ProcessSandbox(Sandbox):
    def __init__(
        self,
        *,
        grace_s: float = 2.0,
        box: BoxSettings | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self._token = auth.new_token()
        self.grace_s = grace_s
        self.extra_args = [*box_arguments(box), *(extra_args or [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.kernel_pid: int | None = None
        self.restarts = 0
        self.workspace: str | None = None
        self.preload: Preloaded | None = None

    @property
    def token(self) -> str:
        return self._token

    def start(self, launched: Callable[[], None] | None = None) -> None:
        global _warned
        if not _warned:  # once per process, however many sandboxes it starts or restarts
            _warned = True
            log.warning(
                "process sandbox: user code runs UNISOLATED on this host (your files, network "
                "and environment), and its sessions share one uid: each has private directories "
                "only. Use it for development; use the docker backend for real work."
            )
        self.workspace = tempfile.mkdtemp(prefix="farm-workspace-")
        env = kernel_environment(dict(os.environ)) | KERNEL_ENV | {"FARM_KERNEL_TOKEN": self._token}
        cmd = [
            sys.executable,
            "-m",
            "farm.kernel",
            "--listen",
            "127.0.0.1:0",
            "--grace-s",
            str(self.grace_s),
            "--isolation",
            "dirs",
            "--dirs-warned",  # this process said it, once: the kernel need not say it again
            "--workspace",
            os.path.join(self.workspace, "boxes"),
            "--tmp-root",
            os.path.join(self.workspace, "tmp"),
            *self.extra_args,
        ]
        # tied to this process (not to the thread that starts it): a worker killed with
        # SIGKILL takes its kernel along instead of leaving it running with PPID 1
        self.proc = popen_tied(
            cmd, stdout=subprocess.PIPE, env=env, start_new_session=True, cwd=self.workspace
        )
        if launched is not None:
            launched()
        try:
            ready = self._wait_ready(self.proc)
            self.address = str(ready["listen"])
            self.kernel_pid = int(str(ready["pid"]))
            with self.kernel() as client:  # what it preloaded (--preload in extra_args)
                self.preload = Preloaded.model_validate(client.ping()["preload"])
        except KernelError as exc:
            self.stop()
            raise SandboxStartError(f"the kernel process did not answer at start: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        self.started_at = time.time()

    @staticmethod
    def _wait_ready(proc: subprocess.Popen[bytes]) -> dict[str, object]:
        assert proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([proc.stdout], [], [], 0.2)
            if readable:
                line = proc.stdout.readline()
                if not line:
                    break
                message = json.loads(line)
                if message.get("event") == "ready":
                    return dict(message)
            if proc.poll() is not None:
                break
        raise SandboxStartError(f"the kernel process did not become ready (exit {proc.poll()})")

    def stop(self) -> None:
        try:
            self._stop_process()
        finally:
            if self.workspace is not None:
                shutil.rmtree(self.workspace, ignore_errors=True)
                self.workspace = None

    def _stop_process(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(STOP_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            backend="process",
            isolated=False,
            address=self.address,
            limits={},
            kernel_version=None,
            isolation="dirs",
            preload=self.preload,
            started_at=self.started_at,
            restarts=self.restarts,
        )
