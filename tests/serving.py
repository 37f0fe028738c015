"""A real ``farm serve`` for the tests: the command itself, in a process of its own, over a real
farm's broker; ``tokens`` made by the real ``farm token create``. Stopped at the end (its
sessions are closed as it stops)."""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from farm.local.redis_server import free_port
from tests.waiting import wait_for

FARM = str(Path(sys.executable).parent / "farm")


@dataclass
class Server:
    url: str
    admin: str  # FARM_API_TOKEN of the server
    env: dict[str, str]
    proc: subprocess.Popen[bytes]

    def token(self, name: str, *scopes: str, concurrency: int | None = None) -> str:
        """A token made by ``farm token create`` (stored hashed in the farm's registry)."""
        args = [FARM, "token", "create", name]
        for scope in scopes:
            args += ["--scope", scope]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def client(self, token: str | None, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


@contextlib.contextmanager
def farm_serve(
    broker_url: str,
    state_dir: Path,
    *args: str,
    admin: str | None = "random",
    verify: ssl.SSLContext | bool = True,
) -> Iterator[Server]:
    """``farm serve`` over the farm at ``broker_url`` (passed in its environment, never on a
    command line), ready when ``/healthz`` answers; ``admin`` is its ``FARM_API_TOKEN``
    (``None``: none set); with ``--ssl-certfile`` it is https, checked against ``verify``."""
    port = free_port()
    admin = secrets.token_urlsafe(24) if admin == "random" else admin
    env = {
        **os.environ,
        "FARM_BROKER_URL": broker_url,
        "FARM_SERVE_STATE_FILE": str(state_dir / "serve.json"),
    }
    env.pop("FARM_API_TOKEN", None)
    if admin is not None:
        env["FARM_API_TOKEN"] = admin
    log = (state_dir / "serve.log").open("ab")
    proc = subprocess.Popen(
        [FARM, "serve", "--port", str(port), *args], env=env, stdout=log, stderr=log
    )
    url = f"{'https' if '--ssl-certfile' in args else 'http'}://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=2, verify=verify).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # it exited: stop waiting, fail below

        assert wait_for(answers, 60, 0.1) and proc.poll() is None, (
            state_dir / "serve.log"
        ).read_text()
        env_for_cli = {k: v for k, v in env.items() if k != "FARM_API_TOKEN"}
        yield Server(url=url, admin=admin or "", env=env_for_cli, proc=proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
