"""Outages of a local farm's real ``redis-server``: stop it (saving its data, or losing it, as a
restart with or without persistence would) and start a new one on the same port."""

from __future__ import annotations

import subprocess
import time

import redis

from farm.local import LocalFarm


def pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def stop_redis(local: LocalFarm, *, save: bool) -> None:
    """Stop the farm's redis-server; ``save`` writes its data to its dir first, so that the
    next start loads it (a restart with persistence), else the next start is empty."""
    assert local.redis_proc is not None
    if save:
        client = redis.Redis(port=local.port, socket_timeout=5)
        try:
            client.shutdown(save=True)
        except redis.ConnectionError:
            pass  # it closed the connection on its way out, as it should
        finally:
            client.close()
        local.redis_proc.wait(10)
    else:
        (local.dir / "dump.rdb").unlink(missing_ok=True)
        local.redis_proc.terminate()
        local.redis_proc.wait(10)


def start_redis(local: LocalFarm) -> None:
    """Start a redis-server with the same command line (port, dir) and wait until it pings;
    the LocalFarm owns it from now on (its close() stops it)."""
    assert local.redis_proc is not None
    local.redis_proc = subprocess.Popen(
        local.redis_proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    client = redis.Redis(port=local.port, socket_timeout=1)
    deadline = time.monotonic() + 10
    try:
        while not pings(client):
            assert time.monotonic() < deadline, "the new redis-server did not start"
            assert local.redis_proc.poll() is None, "the new redis-server exited"
            time.sleep(0.05)  # poll interval of the deadline-bounded readiness wait
    finally:
        client.close()
