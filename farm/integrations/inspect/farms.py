"""The farms Inspect evals use in this process: one per broker, shared by every task that names
it, with the sample boxes open on each.

A farm is acquired by each ``task_init`` and released by each ``task_cleanup`` (the last
release closes it). Every open sample box is recorded in its farm's broker (``LEDGER``) until
its sample ends, so ``inspect sandbox cleanup farm``, in another process, can close what an
interrupted eval left. Why and how: docs/design/inspect-provider.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

import redis

from farm.client import Farm, Session
from farm.errors import SandboxUnavailable, SessionLost
from farm.integrations.inspect.config import INSPECT_IMAGE, FarmSandboxConfig
from farm.settings import FarmSettings

log = logging.getLogger(__name__)

LEDGER = "farm:inspect:sessions"
EMBEDDED = "embedded"
INSPECT_APT = ("procps",)  # `ps`, so that Inspect's process-killing checks prove something


class FarmHandle:
    """One farm this process uses: its client, how many tasks use it and the sample boxes
    open on it."""

    def __init__(self, key: str, farm: Farm) -> None:
        self.key = key
        self.farm = farm
        self.users = 0
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def serve(self, image: str) -> None:
        """Make sure a worker serves ``image``: an embedded farm starts one (building the image
        when missing or stale); a farm of yours must have one already."""
        if any(w.get("image") == image for w in self.farm.workers()):
            return
        local = self.farm.local_farm
        if local is None:
            hint = ""
            if image == INSPECT_IMAGE:
                hint = f" (`farm image build {image} --apt procps` first)"
            raise SandboxUnavailable(
                f"no worker of this farm serves image {image!r}: start one with "
                f"FARM_IMAGE={image}{hint}, or name another image in the sandbox config"
            )
        if image == INSPECT_IMAGE:  # serve_image prepares every other image itself
            _prepare(image)
        local.serve_image(image)

    def open(self, config: FarmSandboxConfig, task: str) -> Session:
        """A box for one sample environment, recorded in the ledger until it is closed."""
        session = self.farm.session(
            config.image,
            timeout_s=config.timeout_s,
            open_wait_s=config.open_wait_s,
            tools=False,
            limits=config.limits,
        )
        with self._lock:
            self.sessions[session.id] = session
        entry = json.dumps({"task": task, "opened_at": time.time()})
        with contextlib.suppress(redis.RedisError):  # the box works; only cleanup would miss it
            self.farm.registry.redis.hset(LEDGER, session.id, entry)
        return session

    def close_session(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.id, None)
        session.close()
        with contextlib.suppress(redis.RedisError):
            self.farm.registry.redis.hdel(LEDGER, session.id)

    def close_recorded(self, session_id: str | None) -> int:
        """Close the box ``session_id`` (every box in the ledger when None), held by this
        process or not; returns how many were closed."""
        ids = (
            [session_id] if session_id else [str(k) for k in self.farm.registry.redis.hkeys(LEDGER)]
        )
        closed = 0
        for sid in ids:
            with self._lock:
                session = self.sessions.get(sid)
            try:
                session = session or self.farm.attach(sid)
            except SessionLost:  # gone already (closed, expired, its worker died)
                self.farm.registry.redis.hdel(LEDGER, sid)
                continue
            self.close_session(session)
            closed += 1
        return closed

    def close(self, *, sessions: bool = True) -> None:
        """Close the boxes still open (on a farm of yours, only if ``sessions``: False is
        ``--no-sandbox-cleanup``), then the client; an embedded farm stops and removes its
        containers, boxes included."""
        with self._lock:
            left = list(self.sessions.values())
        if sessions or self.farm.local_farm is not None:
            for session in left:
                self.close_session(session)
        elif left:
            log.warning(
                "left %d farm sandbox(es) open (%s); `inspect sandbox cleanup farm` closes them",
                len(left),
                ", ".join(s.id for s in left),
            )
        self.farm.close()


class Farms:
    """This process's farms by broker (``EMBEDDED`` for the one it starts itself)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, FarmHandle] = {}

    def acquire(self, config: FarmSandboxConfig) -> FarmHandle:
        """For ``task_init``: the config's farm (started or connected on first use), serving
        its image."""
        key = farm_key(config)
        with self._lock:
            handle = self._handles.get(key)
            if handle is None:
                handle = _start(key, config)
                self._handles[key] = handle
            handle.users += 1
        try:
            handle.serve(config.image)
        except BaseException:
            self.release(config)
            raise
        return handle

    def get(self, config: FarmSandboxConfig) -> FarmHandle:
        """For ``sample_init``: the farm ``task_init`` acquired (acquired now if it did not)."""
        with self._lock:
            handle = self._handles.get(farm_key(config))
        return handle if handle is not None else self.acquire(config)

    def release(self, config: FarmSandboxConfig, *, cleanup: bool = True) -> None:
        """For ``task_cleanup``: the last task using a farm closes it."""
        key = farm_key(config)
        with self._lock:
            handle = self._handles.get(key)
            if handle is None:
                return
            handle.users -= 1
            if handle.users > 0:
                return
            del self._handles[key]
        handle.close(sessions=cleanup)

    def cleanup(self, session_id: str | None) -> int:
        """For ``inspect sandbox cleanup farm [ID]``: close that box (every recorded box when
        None, then this process's farms, then the containers of farms whose workers are gone)
        on this process's farms and on the farm ``FARM_BROKER_URL`` names; returns how many
        boxes were closed."""
        with self._lock:
            handles = list(self._handles.values())
        closed = sum(h.close_recorded(session_id) for h in handles)
        settings = FarmSettings()
        if "broker_url" in settings.model_fields_set and settings.broker_url not in {
            h.key for h in handles
        }:
            other = FarmHandle(settings.broker_url, Farm(settings))
            try:
                closed += other.close_recorded(session_id)
            finally:
                other.close()
        if session_id is None:
            with self._lock:
                handles, self._handles = list(self._handles.values()), {}
            for handle in handles:
                handle.close()
            remove_dead_farms()
        return closed


def remove_dead_farms() -> None:
    """Remove what farms whose processes are gone left on this host, as ``farm gc`` does: their
    sandbox containers (those of an embedded farm killed with its eval, or of any dead local
    worker; ``farm.sandbox.docker.remove_orphans`` judges by the ``farm.host`` and ``farm.pid``
    labels, so a live farm's containers stay) and local farms' directories whose owner died
    (``farm.local.embedded.stale_dirs``). Where Docker does not answer there are no containers to
    remove (a farm of yours elsewhere: its containers are its workers' hosts' business)."""
    import shutil

    import docker

    from farm.local.embedded import stale_dirs
    from farm.sandbox.docker import remove_orphans

    try:
        client = docker.from_env()
        try:
            removed = remove_orphans(client)
        finally:
            client.close()
    except docker.errors.DockerException as exc:
        log.info("no farm containers removed: Docker does not answer (%s)", exc)
    else:
        if removed:
            log.info("removed %d container(s) of dead farms: %s", len(removed), ", ".join(removed))
    for path in stale_dirs():
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s, the directory of a dead local farm", path)


def farm_key(config: FarmSandboxConfig) -> str:
    """The broker a config names: its own, else ``FARM_BROKER_URL``, else the embedded farm."""
    if config.broker_url:
        return config.broker_url
    settings = FarmSettings()
    return settings.broker_url if "broker_url" in settings.model_fields_set else EMBEDDED


def _start(key: str, config: FarmSandboxConfig) -> FarmHandle:
    """A client of the farm ``key`` names; for ``EMBEDDED``, a local farm started now whose
    first workers serve the config's image."""
    if key != EMBEDDED:
        return FarmHandle(key, Farm.connect(key))
    _prepare(config.image)
    return FarmHandle(key, Farm.local(images={config.image: config.workers}))


def _prepare(image: str) -> None:
    """Build ``image`` when missing or stale: the provider's own ``inspect`` environment from
    its spec, any other farm image as ``farm image build`` recorded it."""
    from farm.sandbox.catalog import build_image, prepare
    from farm.sandbox.envspec import make_spec

    if image == INSPECT_IMAGE:
        built = build_image(spec=make_spec(name=INSPECT_IMAGE, apt=list(INSPECT_APT)))
        if built.built:
            log.info("built farm-sandbox:%s for Inspect (%s)", image, built.image_id)
    else:
        prepare(image)
