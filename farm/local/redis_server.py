"""``RedisServer``: the ephemeral ``redis-server`` of a local farm (and of the tests).

Invariants: loopback only, a free port, a password made at start that travels only in 0600
files and the environment of the processes that need it (never a command line or a log line);
persistence off. With ``tls`` it serves TLS only. Why: docs/design/control-plane.md.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from farm.errors import LocalFarmError
from farm.local.processes import popen_tied

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner can read (created 0600, never wider)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


@dataclass(frozen=True)
class ServerTLS:
    """The server's certificate and key and the CA of its clients' certificates; with a client
    certificate, the server demands one (signed by ``ca_file``) and its clients present it."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert_file: Path | None = None
    client_key_file: Path | None = None


class RedisServer:
    """One ``redis-server`` in ``directory`` (its config, data and log live there)."""

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        tls: ServerTLS | None = None,
        extra_config: Sequence[str] = (),
    ) -> None:
        self.dir = directory
        self.password = password or secrets.token_urlsafe(32)
        self.tls = tls
        self.extra_config = list(extra_config)  # more redis.conf lines (tests: an older server)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = directory / "redis.conf"

    @property
    def url(self) -> str:
        """The broker URL, password included: give it to processes, never print it."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://:{self.password}@127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        tls = self.tls
        if tls is not None:
            kwargs = {"ssl": True, "ssl_ca_certs": str(tls.ca_file), **kwargs}
            if tls.client_cert_file is not None:
                kwargs.setdefault("ssl_certfile", str(tls.client_cert_file))
                kwargs.setdefault("ssl_keyfile", str(tls.client_key_file))
        return redis.Redis(port=self.port, password=self.password, **kwargs)

    def _listen(self) -> list[str]:
        if self.tls is None:
            return [f"port {self.port}"]
        return [
            "port 0",
            f"tls-port {self.port}",
            f'tls-cert-file "{self.tls.cert_file}"',
            f'tls-key-file "{self.tls.key_file}"',
            f'tls-ca-cert-file "{self.tls.ca_file}"',
            f"tls-auth-clients {'no' if self.tls.client_cert_file is None else 'yes'}",
        ]

    def start(self) -> RedisServer:
        if shutil.which("redis-server") is None:
            raise LocalFarmError("redis-server is not installed: run `make setup`")
        if not self.port:
            self.port = free_port()
            write_private(
                self.config,
                "\n".join(
                    [
                        *self._listen(),
                        "bind 127.0.0.1",
                        "protected-mode yes",
                        f'requirepass "{self.password}"',
                        'save ""',
                        "appendonly no",
                        f'dir "{self.dir}"',
                        *self.extra_config,
                    ]
                )
                + "\n",
            )
        self.proc = popen_tied(
            ["redis-server", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        client = self.client(socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise LocalFarmError("redis-server did not start") from None
                    time.sleep(0.02)  # poll interval of the deadline-bounded readiness check
        finally:
            client.close()

    def stop(self, *, save: bool = False) -> None:
        """Stop the server; ``save`` writes its data to ``dir`` first (a restart then keeps
        it, as a Redis with persistence would), otherwise its data is gone."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if save:
            client = self.client(socket_timeout=5)
            try:
                client.shutdown(save=True)
            except redis.ConnectionError:
                pass  # the shutdown closed the connection
            finally:
                client.close()
        else:
            proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
