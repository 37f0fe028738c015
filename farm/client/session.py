"""``Session``: a stateful REPL on one worker's sandbox, as the caller holds it.

Every call goes to the owning worker generation: a plain run on its run lane
(``farm.events.lanes``), any other call on its direct queue (``farm.celeryconf`` names); each
is watched while it waits (``Broker.wait``); results are ``ExecResult``s, losses are
exceptions (``SessionLost``, ``StateLost``) unless the session opted in to restoring them
(``farm.client.journal_replay``). ``stream`` gives the same call as live events
(``farm.client.stream``).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from farm.celeryconf import TASK_CLOSE, TASK_COMMAND, TASK_EXEC, TASK_FILE
from farm.client import branching, snapshots
from farm.client.broker import Watch
from farm.client.exec_call import Call, CallerFarm
from farm.client.hostcall_handlers import Callbacks
from farm.client.session_files import SessionFiles
from farm.client.stream import EventStream
from farm.errors import FarmBusy, SessionLost, StateLost
from farm.models import (
    CloseRequest,
    CommandRequest,
    CommandResult,
    ErrorKind,
    ExecRequest,
    ExecResult,
    FileOperation,
    FileRequest,
    Opened,
    RestoreReport,
)
from farm.models.branches import Checkpoint
from farm.registry import MOVED

if TYPE_CHECKING:
    from celery import Celery

    from farm.client.snapshots import Snapshot

QUEUE_WAIT_S = 600.0
INLINE_STDIN = 16 * 1024 * 1024  # a command's stdin past this is staged in the box first
OnStateLost = Literal["raise", "replay"]


class SessionFarm(CallerFarm, snapshots.MovingFarm, Protocol):
    """What a session uses of its farm (``Farm`` is one): its broker, journal, registry and
    snapshots, and its Celery app; so the session imports nothing of ``farm.client.farm``."""

    @property
    def app(self) -> Celery: ...


class Session:
    """A REPL on one worker's sandbox: variables persist between ``run`` calls.

    ``run`` returns an ``ExecResult`` for everything the code did (errors, timeouts, OOM);
    it raises ``SessionLost`` when the sandbox or worker holding the state is gone and
    ``StateLost`` when the variables are gone (call ``restart()`` to go on in a fresh
    namespace: farm never does that silently). Opened with ``on_state_lost="replay"``, it
    instead rebuilds the namespace from its journal and says so (``restores``).
    """

    def __init__(
        self,
        farm: SessionFarm,
        opened: Opened,
        timeout_s: float,
        on_state_lost: OnStateLost = "raise",
        callbacks: Callbacks | None = None,
    ) -> None:
        self.farm = farm
        self.id = opened.session_id
        self.worker = opened.worker
        self.generation = opened.generation
        self.queue = opened.queue
        self.epoch = opened.epoch
        self.timeout_s = timeout_s
        self._kernel_epoch = opened.epoch
        self.closed = False
        self.files = SessionFiles(self)
        self.on_state_lost = on_state_lost
        self.restores: list[RestoreReport] = []  # what each replay restore re-ran
        self.callbacks = (
            callbacks  # host callbacks its code may call (``farm.client.hostcall_handlers``)
        )
        # How long opening it waited for room (its worker's and kernel's queues, and asking
        # again while every worker was full): queueing, told apart from slowness.
        self.queue_s = opened.queue_s
        self.restored = opened.restored  # what its snapshot brought (``Farm.restore``)

    def __repr__(self) -> str:
        return f"Session({self.id!r}, worker={self.worker!r}, epoch={self.epoch})"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_alive(self) -> str:
        """Raise ``SessionLost`` unless the session can take a call; return the broker's mark
        (for ``Broker.wait``)."""
        for _ in range(snapshots.MAX_MOVES):
            if self.closed:
                raise SessionLost(self.id, self.worker, "the session was closed")
            where = (self.worker, self.generation)
            why, mark = self.farm.broker.after_outage(  # a move is no outage's doing
                functools.partial(self.farm.registry.session_state, self.id, *where),
                lambda state: state[0] is None or state[0].startswith(MOVED),
            )
            if why is None:
                return mark
            # it moved: its new owner takes it, found here or by another call of this session
            # meanwhile (which adopted it first: then there is nothing left to follow)
            if not snapshots.follow(self) and (self.worker, self.generation) == where:
                raise SessionLost(self.id, self.worker, why)
        raise SessionLost(self.id, self.worker, "it kept moving while a call was sent")

    def run(
        self,
        code: str,
        timeout_s: float | None = None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
        rollback_to: Checkpoint | str | None = None,
    ) -> ExecResult:
        """Run ``code``; an ``exec_id`` of the caller's makes a retry of the same call return
        the first one's result instead of running the code again (the worker's claim runs an
        id's code once and answers a second delivery with the first one's result).
        ``rollback_to``: first return to that checkpoint (kept), in the same call, so that
        ``code`` runs on the state it holds; an unknown one is an ``input`` result
        (``UnknownCheckpoint``) and nothing runs."""
        more: dict[str, Any] = {"max_output_bytes": max_output_bytes}
        if rollback_to is not None:
            more["rollback_to"] = branching.checkpoint_id(rollback_to)
        if self.callbacks is not None:  # its calls arrive as events: read them to answer
            stream = self.stream(code, timeout_s, **more)
            for _ in stream:
                pass
            assert stream.result is not None
            return stream.result
        call = self.send(code, timeout_s, exec_id=exec_id, **more)
        return self.settle(self.collect(call), code, timeout_s, **more)

    def stream(
        self,
        code: str,
        timeout_s: float | None = None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
        rollback_to: Checkpoint | str | None = None,
    ) -> EventStream:
        """Run ``code`` and yield its events as they happen (``farm.events.run_events``);
        the stream's ``result`` is then what ``run`` would have returned."""
        more = {"rollback_to": branching.checkpoint_id(rollback_to)} if rollback_to else {}
        return EventStream(
            self, code, timeout_s, max_output_bytes=max_output_bytes, exec_id=exec_id, **more
        )

    # --- the calls' three steps: also used by farm.client.stream and farm.client.journal_replay ---

    def exec_request(
        self,
        code: str,
        timeout_s: float | None = None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
        stream: bool = False,
        replay_of: str | None = None,
        rollback_to: str | None = None,
    ) -> ExecRequest:
        """The one place a cell's request is built (sync and async callers alike): ``stream``
        publishes its events, ``replay_of`` names the run it replays."""
        return ExecRequest(
            exec_id=exec_id or uuid.uuid4().hex,
            code=code,
            timeout_s=timeout_s or self.timeout_s,
            max_output_bytes=max_output_bytes,
            session_id=self.id,
            epoch=self.epoch,
            generation=self.generation,
            stream=stream,
            replay_of=replay_of,
            calls=self.callbacks.names if self.callbacks is not None else None,
            rollback_to=rollback_to,
        )

    def send(
        self,
        code: str,
        timeout_s: float | None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
        stream: bool = False,
        replay_of: str | None = None,
        rollback_to: str | None = None,
    ) -> Call:
        """Send one exec (its request: ``exec_request``)."""
        request = self.exec_request(
            code,
            timeout_s,
            max_output_bytes=max_output_bytes,
            exec_id=exec_id,
            stream=stream,
            replay_of=replay_of,
            rollback_to=rollback_to,
        )
        wire = request.model_dump(mode="json")
        pending, mark = snapshots.routed_send(self, TASK_EXEC, wire, lane=not stream)
        request = ExecRequest.model_validate(wire)  # the owner it found: generation, epoch
        watch = Watch(
            worker=(self.worker, self.generation),
            exec_id=request.exec_id,
            mark=mark,
            session_id=self.id,
        )
        deadline = time.monotonic() + request.timeout_s + QUEUE_WAIT_S
        return Call(pending, request, deadline, watch)

    def collect(self, call: Call) -> ExecResult:
        """Wait for ``call``'s result; a loss of state moves the epoch ``restart`` accepts."""
        result = ExecResult.model_validate(snapshots.wait_result(self, call))
        if result.state_lost:
            self._kernel_epoch = result.epoch
        elif call.request.rollback_to is not None and result.kind != ErrorKind.SANDBOX_LOST:
            self.epoch = self._kernel_epoch = result.epoch  # it rolled back: a new epoch
        return result

    def settle(
        self, result: ExecResult, code: str, timeout_s: float | None, **kwargs: Any
    ) -> ExecResult:
        """Turn losses into what the caller gets: ``SessionLost``, ``StateLost`` (default),
        or, with ``on_state_lost="replay"``, a restored namespace
        (``farm.client.journal_replay``)."""
        if result.kind == ErrorKind.SANDBOX_LOST:
            raise SessionLost(self.id, self.worker, result.error.evalue if result.error else "")
        if result.state_lost and self.on_state_lost == "replay":
            from farm.client.journal_replay import restore

            kwargs.pop("exec_id", None)  # the lost call's id is spent: a rerun gets its own
            return restore(self, result, code, timeout_s, **kwargs)
        if result.kind == ErrorKind.STATE_LOST:
            raise StateLost(result)
        return result

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
    ) -> CommandResult:
        """Run a command in the session's box (an argv list, or a string for ``/bin/sh -c``):
        any program of the image, as the session's uid, from its workspace (``cwd`` relative
        to it), beside its cells. ``input`` goes to its stdin (of any size: a large one is
        staged in the box first). A timeout kills its whole process group (``timed_out``,
        kind ``timeout``); a death by signal N is returncode 128 + N. A caller's ``exec_id``
        makes a retry return the first call's result (claimed like a cell)."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        timeout = timeout_s or self.timeout_s
        exec_id = exec_id or uuid.uuid4().hex
        data = input.encode() if isinstance(input, str) else input
        stdin = stdin_path = None
        if data is not None and len(data) <= INLINE_STDIN:
            stdin = base64.b64encode(data).decode("ascii")
        elif data is not None:
            stdin_path = f".farm-stdin-{exec_id}"
            self.files.write(stdin_path, data)
        request = CommandRequest(
            exec_id=exec_id,
            session_id=self.id,
            generation=self.generation,
            argv=argv,
            timeout_s=timeout,
            cwd=cwd,
            env=dict(env or {}),
            max_output_bytes=max_output_bytes,
            stdin=stdin,
            stdin_path=stdin_path,
        )
        pending, mark = snapshots.routed_send(self, TASK_COMMAND, request.model_dump(mode="json"))
        watch = Watch((self.worker, self.generation), exec_id, mark, self.id)
        raw = self.farm.broker.wait(pending, time.monotonic() + timeout + QUEUE_WAIT_S, watch)
        result = CommandResult.model_validate(raw)
        if result.kind == ErrorKind.SANDBOX_LOST:
            raise SessionLost(self.id, self.worker, result.error.evalue if result.error else "")
        return result

    def file_operation(self, operation: FileOperation, blob: bytes | None = None) -> dict[str, Any]:
        """One chunk of a file operation (``farm.client.session_files`` builds them); its
        bytes travel raw beside the task's message (``farm.stores.parcels``)."""
        parcels = self.farm.snapshots.parcels
        parcel = parcels.put(blob) if blob is not None else None
        request = FileRequest(
            **operation.model_dump(exclude={"parcel"}),
            parcel=parcel,
            session_id=self.id,
            generation=self.generation,
        )
        try:
            sent = request.model_dump(mode="json")
            pending, mark = snapshots.routed_send(self, TASK_FILE, sent)
            watch = Watch((self.worker, self.generation), None, mark, self.id)
            reply: dict[str, Any] = self.farm.broker.wait(
                pending, time.monotonic() + QUEUE_WAIT_S, watch
            )
        finally:
            if parcel is not None:
                parcels.drop(parcel)
        if (reply.get("error") or {}).get("ename") == "SessionLost":
            raise SessionLost(self.id, self.worker, reply["error"]["evalue"])
        if reply.get("parcel"):
            reply["blob"] = parcels.take(str(reply.pop("parcel"))) or b""
        return reply

    # --- branching (``farm.client.branching``; docs/design/fork.md) ---

    def checkpoint(self) -> Checkpoint:
        """Keep the session as it is now (variables, modules, files) to ``rollback`` to."""
        return branching.checkpoint(self)

    def rollback(self, cp: Checkpoint | str, *, keep: bool = True) -> None:
        """Return to ``cp`` exactly; the session's processes since then are ended. ``cp``
        stays, to return to again, unless ``keep=False`` (then it costs one fork less)."""
        self.epoch = self._kernel_epoch = branching.rollback(self, cp, keep)

    def drop_checkpoint(self, cp: Checkpoint | str) -> None:
        branching.drop(self, cp)

    def fork(self, n: int = 1) -> branching.Forks[Session]:
        """``n`` new sessions, each a box of its own, starting from this one's files and
        variables (by value: ``Forks.not_carried`` says what did not cross)."""
        opened, not_carried = branching.fork(self, n)
        same = (self.timeout_s, self.on_state_lost, self.callbacks)
        return branching.Forks([Session(self.farm, o, *same) for o in opened], not_carried)

    def snapshot(self, *, keep: bool = False) -> Snapshot:
        """A portable snapshot: the variables it could carry (``info.lost`` names the rest,
        and why), the workspace's files, the image's identity; its bytes (``data``), or with
        ``keep`` kept by the farm for ``snapshot_ttl_s`` (``id``). ``Farm.restore`` opens it."""
        return self.farm.snapshots.take(self, keep=keep)

    def pause(self) -> Snapshot:
        """Free the box, the snapshot kept by the farm; ``resume()`` brings it back."""
        return self.farm.snapshots.take(self, pause=True)

    def resume(self) -> None:
        """Bring a paused session back, same id, on any worker of its image."""
        snapshots.adopt(self, self.farm.snapshots.resume(self.id))

    def restart(self) -> None:
        """Accept the loss of state: continue in the fresh namespace of the current epoch."""
        self.epoch = self._kernel_epoch

    def close(self) -> None:
        """Close the session on its worker; best effort: when its worker or the broker is
        gone, the session goes with the worker or ends at the worker's idle timeout."""
        if self.closed:
            return
        self.closed = True
        self.farm.broker.quietly(self._close_on_worker)

    def _close_on_worker(self) -> None:
        if not self.farm.registry.worker_alive(self.worker, self.generation):
            return  # its sessions went with it
        request = CloseRequest(session_id=self.id)
        pending = self.farm.app.send_task(
            TASK_CLOSE, args=[request.model_dump(mode="json")], queue=self.queue
        )
        owner = (self.worker, self.generation)
        with contextlib.suppress(SessionLost, FarmBusy):  # the worker died or hangs meanwhile
            watch = Watch(worker=owner, session_id=self.id)
            self.farm.broker.wait(pending, time.monotonic() + 30, watch)
