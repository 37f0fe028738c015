"""``Farm``: a connection to a farm, its sessions (``farm.session``: a stateful REPL on it)
and one-shot runs.

The client reaches workers only through the broker (task and queue names from
``farm.celeryconf``) and reads who owns what from the registry. A session call goes to the
owning worker generation's direct queue; while it waits, the client watches that worker's
heartbeat, so a dead worker turns into ``SessionLost`` within seconds instead of a hang.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from farm.backoff import delays
from farm.celeryconf import TASK_RUN, make_app
from farm.client.broker import Broker, Watch
from farm.client.mapping import MapRun
from farm.client.opening import Answers, callbacks_field, egress_field, limits_field, open_once
from farm.client.session import QUEUE_WAIT_S, OnStateLost, Session
from farm.client.snapshots import Snapshot, Snapshots
from farm.errors import (
    BrokerLost,
    BrokerUnavailable,
    FarmBusy,
    InvalidRequest,
    SandboxUnavailable,
    SessionLost,
    SessionPaused,
    WorkerFailed,
)
from farm.events.journal import Journal
from farm.events.run_events import Event
from farm.image_name import ImageName
from farm.judge import problems
from farm.judge.front import ProblemRef, judge_one
from farm.models import BoxLimits, Busy, ErrorKind, ExecResult, Opened, Refused, RunRequest
from farm.models.batch import BatchItem
from farm.models.judge import JudgeResult
from farm.models.snapshot_info import DrainReport
from farm.registry import Registry, chunks_key
from farm.settings import FarmSettings

DEFAULT_TIMEOUT_S = 30.0
IMAGE_CHECK_S = 1.0
RETRYABLE = (ErrorKind.SANDBOX_LOST, ErrorKind.INFRA)


class Farm:
    """``Farm.connect()`` for a running farm, ``Farm.local()`` for an embedded one."""

    def __init__(self, settings: FarmSettings | None = None, *, owned: Any = None) -> None:
        self.settings = settings or FarmSettings()
        self.app = make_app(self.settings)
        self.registry = Registry.connect(self.settings)
        self.journal = Journal(self.registry.redis, self.settings)
        self.broker = Broker(
            self.app,
            self.registry,
            self.settings.broker_url,
            self.settings.broker_wait_s,
            grace_s=2 * self.settings.heartbeat_ttl_s,
        )
        self._owned = owned
        self._served: dict[str, float] = {}
        self.answers = Answers(self.registry)  # to this client's session opens
        self._uploads = problems.Uploads()  # the problems this client stored
        self.snapshots = Snapshots(self)  # session snapshots, resumes, drains

    @classmethod
    def connect(cls, broker_url: str | None = None) -> Farm:
        settings = FarmSettings()
        if broker_url:
            settings = settings.model_copy(update={"broker_url": broker_url})
        return cls(settings)

    @classmethod
    def default(cls) -> Farm:
        """The farm of ``default_settings()``."""
        return cls(cls.default_settings())

    @staticmethod
    def default_settings() -> FarmSettings:
        """``FARM_BROKER_URL`` when set, else the farm `farm up` recorded, else the default:
        the one broker discovery of ``Farm.default()`` and ``farm doctor``."""
        settings = FarmSettings()
        if "broker_url" not in settings.model_fields_set and settings.state_file.exists():
            import json

            state = json.loads(settings.state_file.read_text())
            settings = settings.model_copy(update={"broker_url": state["broker_url"]})
        return settings

    @classmethod
    def local(
        cls, workers: int = 2, *, backend: str = "docker", images: dict[str, int] | None = None
    ) -> Farm:
        """Start an embedded farm (redis + worker processes) owned by this ``Farm``.

        ``images={"default": 2, "docs": 1}`` chooses workers per image; a session asking for
        an image no worker serves yet gets a worker started on demand.
        """
        from farm.local.embedded import LocalFarm

        local = LocalFarm(images or workers, backend=backend).start()
        return cls(local.settings(), owned=local)

    @property
    def local_farm(self) -> Any:
        return self._owned

    def close(self) -> None:
        self.answers.close()
        self.snapshots.close()
        self.registry.close()
        self.app.close()
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- discovery ----------------------------------------------------------------------

    def workers(self) -> list[dict[str, Any]]:
        return self.registry.workers()

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each shared and direct queue of the live workers, and map
        chunks in each image's list of them (``chunks_key``: the batch backlog)."""
        workers = self.registry.workers()
        shared = {ImageName(str(w["image"])).queue for w in workers}
        names = shared | {chunks_key(q) for q in shared} | {str(w["queue"]) for w in workers}
        return {name: self.registry.queue_length(name) for name in sorted(names)}

    def require_image(self, image: str | ImageName) -> None:
        """Fail fast (``SandboxUnavailable``) when no live worker serves ``image``, after
        asking a local farm to start one (checked at most once a second).
        An image this client saw served gets until ``open_wait_s`` after that to come back:
        its workers may be restarting, or re-registering with a broker that restarted."""
        name = ImageName.parse(image)
        image = name.asked
        now = time.monotonic()
        last = self._served.get(image)
        if last is not None and now - last < IMAGE_CHECK_S:
            return
        wait_until = last + self.settings.open_wait_s if last is not None else now
        while True:
            workers = self.broker.call(self.registry.workers, sent=False)
            if any(w.get("image") == image for w in workers):
                self._served[image] = time.monotonic()
                return
            if self._owned is not None:
                self._owned.serve_image(name)
                return
            if time.monotonic() >= wait_until:
                raise SandboxUnavailable(
                    f"no live worker serves image {image!r}; start one (`farm worker` with "
                    f"FARM_IMAGE={image}) or pick another image"
                )
            time.sleep(IMAGE_CHECK_S / 4)

    # --- sessions -----------------------------------------------------------------------

    def session(
        self,
        image: str | ImageName = "default",
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_wait_s: float | None = None,
        tools: bool = True,
        on_state_lost: OnStateLost = "raise",
        callbacks: Mapping[str, Callable[..., Any]] | None = None,
        max_depth: int = 2,
        max_calls: int = 32,
        callback_timeout_s: float = 60.0,
        limits: BoxLimits | Mapping[str, int] | None = None,
        egress: Sequence[str] | None = None,
    ) -> Session:
        """Open a session on a worker of ``image``; waits up to ``open_wait_s`` for room.

        The session is a box of its own: its own uid, workspace and ``/tmp`` directory, and
        ``limits`` (``BoxLimits``: memory per process, processes, file size, open files; the
        worker's ``FARM_BOX_*`` defaults otherwise; over the sandbox's caps raises
        ``InvalidRequest``). ``on_state_lost="replay"`` opts in to restoring lost state by
        re-running the journal's successful cells (see ``Session``); the default raises
        ``StateLost``. ``callbacks`` are functions of this process the session's code may call
        by name, within ``max_depth`` nested sessions, ``max_calls`` calls per run and
        ``callback_timeout_s`` per call (``farm.client.hostcall_handlers``). ``egress`` names the
        hosts its box may reach through the worker's proxy (``"api.example.com"``,
        ``"*.example.org:443"``), within the farm's ceiling; none by default."""
        name = ImageName.parse(image)
        hooks = callbacks_field(callbacks, max_depth, max_calls, callback_timeout_s)
        wanted = limits_field(limits)
        hosts = egress_field(egress)
        self.require_image(name)
        asked = time.monotonic()
        deadline = asked + (open_wait_s or self.settings.open_wait_s)
        fields = {"tools": tools, "limits": wanted, "egress": hosts}
        for backoff in delays(0.05, 1.0):
            sent = time.monotonic()  # queued until a worker has room, or the deadline
            try:
                reply = open_once(self.broker, self.answers, name.queue, fields, deadline)
            except BrokerLost as exc:  # the open died with the broker's data
                reply = Busy(reason=str(exc))
            if isinstance(reply, Opened):
                reply.queue_s += sent - asked  # the opens that found no room, and their pauses
                return Session(self, reply, timeout_s, on_state_lost, hooks)
            if isinstance(reply, Refused):
                raise InvalidRequest(f"worker {reply.worker} refused the session: {reply.reason}")
            if time.monotonic() + backoff > deadline:
                raise FarmBusy(
                    f"every worker of image {name.asked!r} is full or not ready: "
                    f"{reply.reason} ({self._room(name)}); retry later or add workers"
                )
            time.sleep(backoff)  # back off before asking again
        raise AssertionError("unreachable")

    def _room(self, name: ImageName) -> str:
        """What the workers of image ``name`` hold now, in words (for a busy error)."""
        workers = self.broker.quietly(self.registry.workers) or []
        rooms = [w.get("room") or {} for w in workers if w.get("image") == name.asked]
        in_use, boxes = (
            sum(r.get("in_use", 0) for r in rooms),
            sum(r.get("boxes", 0) for r in rooms),
        )
        sessions = sum(r.get("sessions", 0) for r in rooms)
        return f"{in_use} of {boxes} boxes in use, {sessions} sessions, on {len(rooms)} workers"

    def replay(self, session_id: str) -> Iterator[Event]:
        """The events of a session's runs as its journal holds them (any process, any time
        within ``journal_ttl_s``): the same types ``Session.stream`` yields."""
        return self.journal.events(session_id)

    def attach(
        self,
        session_id: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        callbacks: Mapping[str, Callable[..., Any]] | None = None,
        max_depth: int = 2,
        max_calls: int = 32,
        callback_timeout_s: float = 60.0,
    ) -> Session:
        """Continue a session opened elsewhere (another process), as it is now; its code
        may call this process's ``callbacks`` (see ``session``)."""
        entry = self.registry.session(session_id)
        if entry is None and self.snapshots.paused(session_id):
            raise SessionPaused(session_id, None, "it is paused: Farm.resume(session_id)")
        if entry is None:
            raise SessionLost(session_id, None, "no such session (closed, expired or lost)")
        opened = Opened(
            session_id=session_id,
            worker=str(entry["worker"]),
            generation=int(entry["generation"]),
            queue=str(entry["queue"]),
            epoch=int(entry["epoch"]),
        )
        hooks = callbacks_field(callbacks, max_depth, max_calls, callback_timeout_s)
        return Session(self, opened, timeout_s, callbacks=hooks)

    def restore(
        self,
        snapshot: Snapshot | bytes | str,
        *,
        image: str | ImageName | None = None,
        limits: BoxLimits | Mapping[str, int] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Session:
        """A new session holding ``snapshot`` (its bytes, or a kept one's id), on any worker
        of its image (``image``: another, which must have the same Python and packages, else
        ``SnapshotIncompatible``), in a box of its session's limits unless ``limits`` says
        otherwise; ``session.restored`` says what did not come back."""
        opened = self.snapshots.restore(snapshot, image=image, limits=limits_field(limits))
        return Session(self, opened, timeout_s)

    def resume(self, session_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Session:
        """A paused session (``Session.pause``), back on any worker of its image, same id."""
        return Session(self, self.snapshots.resume(session_id), timeout_s)

    def drain(self, worker_id: str) -> DrainReport:
        """Move every session of ``worker_id`` to other workers, same ids, before it stops;
        it takes no new session meanwhile (``farm.worker.drain``)."""
        return self.snapshots.drain(worker_id)

    def run(
        self,
        code: str,
        *,
        image: str | ImageName = "default",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 0,
        max_output_bytes: int | None = None,
        limits: BoxLimits | Mapping[str, int] | None = None,
        exec_id: str | None = None,
        egress: Sequence[str] | None = None,
    ) -> ExecResult:
        """One-shot run in a fresh session (a box of its own, with ``limits``); failures are
        results, never exceptions, once the call was sent (before that: ``SandboxUnavailable``
        when no worker serves ``image``, ``BrokerUnavailable`` with ``sent=False`` when the
        broker cannot be reached, ``InvalidRequest`` for bad limits).

        Up to ``retries`` infrastructure failures are retried, and only those that happened
        before the code started (its exec id was never claimed by a worker): code that may
        have run is not run again behind the caller's back. A caller's ``exec_id`` (its first
        attempt's) makes a retry of the whole call return the first one's result.
        """
        name, wanted, hosts = ImageName.parse(image), limits_field(limits), egress_field(egress)
        for attempt in range(retries + 1):
            request = RunRequest(
                exec_id=(exec_id if not attempt else None) or uuid.uuid4().hex,
                code=code,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
                limits=wanted,
                egress=hosts,
            )
            try:
                self.require_image(name)
                raw = self._run_reply(name, request, timeout_s)
                if raw.get("busy"):  # nothing ran, and no worker had room all that while
                    busy = Busy.model_validate(raw)
                    raise FarmBusy(
                        f"every worker of image {name.asked!r} stayed full for "
                        f"{self.settings.open_wait_s:g} s (last: {busy.reason}); nothing ran"
                    )
                result = ExecResult.model_validate(raw)
            except SessionLost as exc:
                result = ExecResult.failure(
                    ErrorKind.SANDBOX_LOST,
                    "SessionLost",
                    str(exc),
                    exec_id=request.exec_id,
                    worker=exc.worker,
                )
            except (BrokerLost, BrokerUnavailable) as exc:  # no retry: the broker is gone
                if isinstance(exc, BrokerUnavailable) and not exc.sent:
                    raise
                return ExecResult.failure(
                    ErrorKind.INFRA, type(exc).__name__, str(exc), exec_id=request.exec_id
                )
            except WorkerFailed as exc:
                result = ExecResult.failure(
                    ErrorKind.INFRA, type(exc).__name__, str(exc), exec_id=request.exec_id
                )
            if result.kind not in RETRYABLE or attempt == retries or self._started(request):
                return result
        raise AssertionError("unreachable")

    def _run_reply(self, name: ImageName, request: RunRequest, timeout_s: float) -> dict[str, Any]:
        """A worker's answer to a one-shot run, asked again after a pause while the worker
        that took it had no room for its box (nothing ran), for up to ``open_wait_s``: then
        the last busy reply. A call sent that stays unanswered is ``FarmBusy`` (an ``infra``
        result for the caller: it may have run)."""
        deadline = time.monotonic() + self.settings.open_wait_s
        for backoff in delays(0.05, 1.0):
            request.wait_s = max(deadline - time.monotonic(), 0.0)
            pending, mark = self.broker.send(
                TASK_RUN, name.queue, args=[request.model_dump(mode="json")]
            )
            watch = Watch(exec_id=request.exec_id, mark=mark)
            try:
                raw = self.broker.wait(pending, time.monotonic() + timeout_s + QUEUE_WAIT_S, watch)
            except FarmBusy as exc:  # sent, never answered: it may have run
                return ExecResult.failure(
                    ErrorKind.INFRA, type(exc).__name__, str(exc), exec_id=request.exec_id
                ).model_dump(mode="json")
            if not raw.get("busy") or time.monotonic() + backoff > deadline:
                return raw
            time.sleep(backoff)  # back off before asking the shared queue again
        raise AssertionError("unreachable")

    def map(
        self,
        items: Iterable[BatchItem | dict[str, Any] | str],
        *,
        image: str | ImageName = "default",
        concurrency: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 0,
        ordered: bool = True,
        journal: bool = False,
        egress: Sequence[str] | None = None,
    ) -> MapRun:
        """Run many items, each in a box of its own; iterate the result for one ``BatchRecord``
        per item (the model of a ``farm sweep`` output line), in the items' order or, with
        ``ordered=False``, as they finish.

        An item is a code string or a dict shaped like a sweep line (``id``, ``code`` or
        ``cells``, ``setup``, ``files``, ``timeout_s``, ``limits``); a malformed one becomes a
        record of kind ``input``. Items are read lazily, at most ``concurrency`` at a time
        (default: the capacity of the image's workers); leaving the loop early cancels the
        rest and stops what runs. ``retries`` infrastructure failures are retried per item;
        user errors, timeouts and OOMs are results (``farm.client.mapping``). ``egress``:
        the hosts each item's box may reach unless the item names its own (``egress``)."""
        return MapRun(
            self,
            items,
            image=image,
            concurrency=concurrency,
            timeout_s=timeout_s,
            retries=retries,
            ordered=ordered,
            journal=journal,
            egress=egress_field(egress),
        )

    def judge(
        self,
        language: str,
        source: str,
        tests: Sequence[Mapping[str, Any]] | None = None,
        *,
        problem: ProblemRef | None = None,
        **options: Any,
    ) -> JudgeResult:
        """Judge one submission (``farm.judge``) on ``tests``, or on a ``problem``: a
        ``Problem``, a stored one's digest or a package's directory (Kattis, Polygon).
        ``options`` are a judge item's (``checker``, ``limits``, ``all_tests``, ``groups``,
        ``special_judge``, ``files``, ``image``) and ``retries``.
        Many submissions: ``Farm.map`` of judge items, on the same engine."""
        return judge_one(self, language, source, tests, problem=problem, **options)

    def put_problem(self, problem: problems.Problem, *, again: bool = False) -> str:
        """Store ``problem`` (once: this client remembers what it stored, unless ``again``)
        and return its digest, which judge items name as their ``problem``; a ``Problem``
        in an item is stored so by ``map``. ``ProblemTooLarge`` past its size limit."""
        redis = self.registry.redis
        if again:
            return self.broker.call(lambda: problems.put(redis, problem), sent=False)
        return self.broker.call(lambda: self._uploads.put(redis, problem), sent=False)

    def _started(self, request: RunRequest) -> bool:
        """Whether a worker claimed ``request`` (may have run it); unknown counts as yes."""
        try:
            record = self.broker.call(lambda: self.registry.exec_record(request.exec_id), sent=True)
        except BrokerUnavailable:
            return True
        return record is not None


def replay(session_id: str, broker_url: str | None = None) -> list[Event]:
    """``farm.replay(session_id)``: a session's journal, read through a farm of its own
    (``broker_url``, else the one ``Farm.default()`` finds); ``Farm.replay`` reuses yours."""
    with Farm.connect(broker_url) if broker_url else Farm.default() as farm:
        return list(farm.replay(session_id))
