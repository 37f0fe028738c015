"""Outages of a local farm's real ``redis-server``: stop it (saving its data, or losing it, as a
restart with or without persistence would) and start a new one on the same port."""

from __future__ import annotations

from farm.local.embedded import LocalFarm


def stop_redis(local: LocalFarm, *, save: bool) -> None:
    """Stop the farm's redis-server; ``save`` writes its data to its dir first, so that the
    next start loads it (a restart with persistence), else the next start is empty."""
    if not save:
        (local.dir / "dump.rdb").unlink(missing_ok=True)
    local.redis.stop(save=save)


def start_redis(local: LocalFarm) -> None:
    """Start a redis-server with the same config (port, password, dir) and wait until it
    pings; the LocalFarm owns it from now on (its close() stops it)."""
    local.redis.start()
