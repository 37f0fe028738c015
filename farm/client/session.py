"""``Session``: a stateful REPL on one worker's sandbox, as the caller holds it.

Every call goes to the owning worker generation's direct queue (``farm.celeryconf`` names)
and is watched while it waits (``Farm._wait``); results are ``ExecResult``s, losses are
exceptions (``SessionLost``, ``StateLost``) unless the session opted in to restoring them
(``farm.client.journal_replay``). ``stream`` gives the same call as live events
(``farm.client.stream``).
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from farm.celeryconf import TASK_CLOSE, TASK_COMMAND, TASK_EXEC, TASK_FILE
from farm.client import snapshots
from farm.client.broker import Watch
from farm.client.exec_call import Call
from farm.client.hostcall_handlers import Callbacks
from farm.client.session_files import SessionFiles
from farm.client.stream import EventStream
from farm.errors import FarmBusy, SessionLost, StateLost
from farm.models import CommandResult, ErrorKind, ExecResult, Opened, RestoreReport

if TYPE_CHECKING:
    from farm.client.farm import Farm
    from farm.client.snapshots import Snapshot

QUEUE_WAIT_S = 600.0
INLINE_STDIN = 16 * 1024 * 1024  # a command's stdin past this is staged in the box first
OnStateLost = Literal["raise", "replay"]


def exec_request(
    code: str, timeout_s: float, max_output_bytes: int | None, exec_id: str | None = None
) -> dict[str, Any]:
    """The one place an exec message is built (sync and async callers alike). A caller's own
    ``exec_id`` makes a retried call idempotent: the worker's claim runs an id's code once and
    answers a second delivery with the first one's result."""
    request: dict[str, Any] = {
        "code": code,
        "timeout_s": timeout_s,
        "exec_id": exec_id or uuid.uuid4().hex,
    }
    if max_output_bytes is not None:
        request["max_output_bytes"] = max_output_bytes
    return request


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
        farm: Farm,
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
        if self.closed:
            raise SessionLost(self.id, self.worker, "the session was closed")
        why, mark = self.farm.broker.after_outage(
            lambda: self.farm.registry.session_state(self.id, self.worker, self.generation),
            lambda state: state[0] is None,
        )
        if why is not None and snapshots.follow(self):  # it moved: its new owner takes it
            return self._check_alive()
        if why is not None:
            raise SessionLost(self.id, self.worker, why)
        return mark

    def run(
        self,
        code: str,
        timeout_s: float | None = None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
    ) -> ExecResult:
        """Run ``code``; an ``exec_id`` of the caller's makes a retry of the same call return
        the first one's result instead of running the code again (``exec_request``)."""
        if self.callbacks is not None:  # its calls arrive as events: read them to answer
            stream = self.stream(code, timeout_s, max_output_bytes=max_output_bytes)
            for _ in stream:
                pass
            assert stream.result is not None
            return stream.result
        call = self.send(code, timeout_s, max_output_bytes=max_output_bytes, exec_id=exec_id)
        return self.settle(self.collect(call), code, timeout_s, max_output_bytes=max_output_bytes)

    def stream(
        self,
        code: str,
        timeout_s: float | None = None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
    ) -> EventStream:
        """Run ``code`` and yield its events as they happen (``farm.events.run_events``);
        the stream's ``result`` is then what ``run`` would have returned."""
        return EventStream(
            self, code, timeout_s, max_output_bytes=max_output_bytes, exec_id=exec_id
        )

    # --- the calls' three steps: also used by farm.client.stream and farm.client.journal_replay ---

    def send(
        self,
        code: str,
        timeout_s: float | None,
        *,
        max_output_bytes: int | None = None,
        exec_id: str | None = None,
        **extra: Any,
    ) -> Call:
        """Send one exec (``extra``: ``stream``, ``replay_of``); the one place it is built."""
        timeout = timeout_s or self.timeout_s
        request = exec_request(code, timeout, max_output_bytes, exec_id)
        request.update(session_id=self.id, epoch=self.epoch, generation=self.generation, **extra)
        if self.callbacks is not None:
            request["calls"] = self.callbacks.names
        pending, mark = snapshots.routed_send(self, TASK_EXEC, request)
        watch = Watch(
            worker=(self.worker, self.generation),
            exec_id=request["exec_id"],
            mark=mark,
            session_id=self.id,
        )
        return Call(pending, request, time.monotonic() + timeout + QUEUE_WAIT_S, watch)

    def collect(self, call: Call) -> ExecResult:
        """Wait for ``call``'s result; a loss of state moves the epoch ``restart`` accepts."""
        result = ExecResult.model_validate(snapshots.wait_result(self, call))
        if result.state_lost:
            self._kernel_epoch = result.epoch
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
        request: dict[str, Any] = {
            "exec_id": exec_id,
            "session_id": self.id,
            "generation": self.generation,
            "argv": argv,
            "timeout_s": timeout,
            "cwd": cwd,
            "env": dict(env or {}),
            "max_output_bytes": max_output_bytes,
        }
        data = input.encode() if isinstance(input, str) else input
        if data is not None and len(data) <= INLINE_STDIN:
            request["stdin"] = base64.b64encode(data).decode("ascii")
        elif data is not None:
            request["stdin_path"] = f".farm-stdin-{exec_id}"
            self.files.write(request["stdin_path"], data)
        pending, mark = snapshots.routed_send(self, TASK_COMMAND, request)
        watch = Watch((self.worker, self.generation), exec_id, mark, self.id)
        raw = self.farm.broker.wait(pending, time.monotonic() + timeout + QUEUE_WAIT_S, watch)
        result = CommandResult.model_validate(raw)
        if result.kind == ErrorKind.SANDBOX_LOST:
            raise SessionLost(self.id, self.worker, result.error.evalue if result.error else "")
        return result

    def file_operation(self, request: dict[str, Any]) -> dict[str, Any]:
        """One chunk of a file operation (``farm.client.session_files`` builds them)."""
        request = {**request, "session_id": self.id, "generation": self.generation}
        pending, mark = snapshots.routed_send(self, TASK_FILE, request)
        watch = Watch((self.worker, self.generation), None, mark, self.id)
        reply: dict[str, Any] = self.farm.broker.wait(
            pending, time.monotonic() + QUEUE_WAIT_S, watch
        )
        if (reply.get("error") or {}).get("ename") == "SessionLost":
            raise SessionLost(self.id, self.worker, reply["error"]["evalue"])
        return reply

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
        pending = self.farm.app.send_task(TASK_CLOSE, args=[self.id], queue=self.queue)
        owner = (self.worker, self.generation)
        with contextlib.suppress(SessionLost, FarmBusy):  # the worker died or hangs meanwhile
            watch = Watch(worker=owner, session_id=self.id)
            self.farm.broker.wait(pending, time.monotonic() + 30, watch)
