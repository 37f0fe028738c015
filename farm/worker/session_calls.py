"""``SessionCalls``: a worker's calls on its sessions — cells, commands, files, one-shot runs.

Each request is checked against its model on arrival (``farm.models.worker_requests``). Each
call is claimed before it runs (its ``exec_id``, in Redis), so a redelivered or duplicated
message returns the first delivery's result instead of running twice; a call whose session is
gone (closed, expired, its sandbox replaced) gets ``sandbox_lost``, never a run in a fresh one;
bad input (a malformed request, a cell too large for a frame, limits over the sandbox's caps)
gets ``input`` and the worker and session live on. Cells and commands are recorded
(``ExecRecorder``: the session's journal and live stream); file operations are not.
"""

from __future__ import annotations

import json
import logging
import time
from errno import EINVAL
from typing import Any

from farm.kernel.wire.branch_frames import Branch
from farm.kernel.wire.client import KernelClient, KernelError, KernelRequestError
from farm.kernel.wire.framing import DEFAULT_MAX_FRAME
from farm.kernel.wire.protocol import FILE_CHUNK, INPUT_CODES
from farm.models import (
    CloseRequest,
    CommandRequest,
    CommandResult,
    ErrorKind,
    ExecError,
    ExecRequest,
    ExecResult,
    FileRequest,
    Malformed,
    RunRequest,
    arrived,
)
from farm.worker import metrics
from farm.worker.box_gate import OPEN_WAIT_S
from farm.worker.opens import SessionOpens
from farm.worker.recorder import ExecRecorder, branch_event
from farm.worker.task_reply import Replier
from farm.worker.worker_host import HeldSession, WorkerHost

log = logging.getLogger(__name__)

DUPLICATE_POLL_S = 0.05
BRANCH_TIMEOUT_S = 120.0  # a checkpoint copies the box's files; a fork opens boxes
# Kernel refusals of a request that was whole and valid but not acceptable: bad input.


class SessionCalls:
    def __init__(self, worker: WorkerHost, opens: SessionOpens) -> None:
        self.worker = worker
        self.opens = opens

    def execute(self, raw: object, reply: Replier | None = None) -> dict[str, Any]:
        """A cell in a session (``farm.exec``); with its task's ``reply``, the result is stored
        and published in the script that records the run (else Celery stores it)."""
        try:
            request = arrived(ExecRequest, raw)
        except Malformed as exc:
            return self._refused(raw, exc).model_dump(mode="json")
        return self._execute(request, reply)

    def _execute(self, request: ExecRequest, reply: Replier | None = None) -> dict[str, Any]:
        exec_id = request.exec_id
        if request.generation != self.worker.generation:
            return self._lost(request, "the worker generation this call was sent to is gone")
        claim = self.worker.registry.claim_exec(
            exec_id, self.worker.id, self.worker.generation, request.timeout_s
        )
        if claim is not None:
            return self._recorded(exec_id, claim, request)
        t0 = time.perf_counter()
        recorder = ExecRecorder(self.worker.journal, request, self.worker.id)
        result, held = self._execute_claimed(request, recorder)
        events = recorder.close(result)
        refresh = None
        if held is not None:  # the kernel ran it: the session lives on, at this epoch
            refresh = self.worker.session_entry(request.session_id, held.epoch)
        # one script: the journal is complete before the record, and both before the result
        error = self.worker.registry.finish_exec(
            exec_id, result, session=refresh, events=events, reply=reply.encode if reply else None
        )
        if reply is not None:
            reply.stored()
        recorder.published(error)
        metrics.observe_exec(
            result["status"], (result.get("error") or {}).get("kind"), time.perf_counter() - t0
        )
        return result

    def _execute_claimed(
        self, request: ExecRequest, recorder: ExecRecorder
    ) -> tuple[dict[str, Any], HeldSession | None]:
        """The result, and the session when its kernel ran the call (else ``None``)."""
        session_id = request.session_id
        held = self.worker.sessions.get(session_id)
        if held is None:
            why = f"worker {self.worker.id} holds no session {session_id} (closed or expired)"
            return self._lost(request, why), None
        if held.lost is not None:
            return self._lost(request, held.lost), None
        if held.sandbox_generation != self.worker.keeper.generation:
            return self._lost(request, "its sandbox was replaced"), None
        held.last_used = time.monotonic()
        refused = _oversized(request.code)
        if refused is not None:
            return self._failure(request, ErrorKind.INPUT, "InputTooLarge", refused), held
        self.worker.egress.running(session_id, recorder)
        epoch = request.epoch
        try:
            with self.worker.kernel() as kernel:
                if request.rollback_to is not None:
                    try:
                        epoch = self._roll_back(kernel, session_id, held, request.rollback_to)
                    except KernelRequestError as exc:
                        if exc.code != "no_such_checkpoint":
                            raise
                        why = str(exc)
                        return self._failure(
                            request, ErrorKind.INPUT, "UnknownCheckpoint", why
                        ), held
                raw = kernel.execute(
                    session_id,
                    request.code,
                    epoch=epoch,
                    timeout_s=request.timeout_s,
                    exec_id=request.exec_id,
                    max_output_bytes=request.max_output_bytes,
                    grace_s=self.worker.settings.limits.grace_s,
                    on_event=recorder.on_kernel_event,
                    calls=request.calls,
                )
        except KernelRequestError as exc:
            if exc.code in INPUT_CODES:  # nothing ran; the session and its variables live on
                return self._failure(request, ErrorKind.INPUT, "BadRequest", str(exc)), held
            return self._lost(request, f"the sandbox no longer has it ({exc.code})"), None
        except KernelError as exc:
            held.lost = f"its sandbox failed during a call ({exc})"
            return self._lost(request, held.lost), None
        finally:
            self.worker.egress.settle(session_id)
            self.worker.egress.running(session_id, None)
        held.epoch = raw["epoch"]
        held.last_used = time.monotonic()
        return {**raw, "worker": self.worker.id}, held

    def _roll_back(self, kernel: KernelClient, session_id: str, held: HeldSession, cp: str) -> int:
        """Back to the checkpoint a call starts from (``ExecRequest.rollback_to``), over the
        run's own kernel connection: the session's new epoch, journaled before the run."""
        rollback: Branch = {
            "type": "branch", "op": "rollback", "session_id": session_id, "checkpoint_id": cp
        }  # fmt: skip
        reply = kernel.branch(rollback, BRANCH_TIMEOUT_S)
        held.epoch = reply["epoch"]
        self.worker.journal.append([branch_event(reply)])
        return held.epoch

    def command(self, raw: object) -> dict[str, Any]:
        """Run a command in the session's box (``session.exec``), claimed like a cell."""
        worker = self.worker
        try:
            request = arrived(CommandRequest, raw)
        except Malformed as exc:
            refused = self._refused(raw, exc)
            return self._command_failure(
                refused.exec_id, refused.session_id, ErrorKind.INPUT, "InvalidRequest", str(exc)
            )
        exec_id = request.exec_id
        claim = worker.registry.claim_exec(exec_id, worker.id, worker.generation, request.timeout_s)
        if claim is not None:
            return self._recorded(exec_id, claim, request)
        held, why = self.held(request.session_id, request.generation)
        if held is None:
            result = self._command_failure(
                exec_id, request.session_id, ErrorKind.SANDBOX_LOST, "SessionLost", why
            )
        else:
            result = self._command(request, held)
        refresh = None
        if held is not None:
            refresh = worker.session_entry(request.session_id, held.epoch)
        worker.registry.finish_exec(exec_id, result, session=refresh)
        return result

    def _command(self, request: CommandRequest, held: HeldSession) -> dict[str, Any]:
        worker, ids = self.worker, (request.exec_id, request.session_id)
        held.last_used = time.monotonic()
        try:
            with worker.kernel() as kernel:
                raw = kernel.command(
                    request.session_id,
                    request.argv,
                    exec_id=request.exec_id,
                    timeout_s=request.timeout_s,
                    stdin=request.stdin_bytes(),
                    stdin_path=request.stdin_path,
                    cwd=request.cwd,
                    env=request.env,
                    max_output_bytes=request.max_output_bytes,
                    grace_s=worker.settings.limits.grace_s,
                )
        except KernelRequestError as exc:
            kind = ErrorKind.INPUT if exc.code in INPUT_CODES else ErrorKind.SANDBOX_LOST
            return self._command_failure(*ids, kind, "BadRequest", str(exc))
        except KernelError as exc:
            held.lost = f"its sandbox failed during a command ({exc})"
            return self._command_failure(*ids, ErrorKind.SANDBOX_LOST, "SessionLost", held.lost)
        held.last_used = time.monotonic()
        result = CommandResult.from_kernel(raw, worker.id, request.timeout_s)
        return result.model_dump(mode="json")

    def file(self, raw: object) -> dict[str, Any]:
        """One chunk of a file operation (``session.files``): not claimed, not journaled; a
        chunk that runs twice writes the same bytes at the same offset."""
        try:
            request = arrived(FileRequest, raw)
        except Malformed as exc:
            self._refused(raw, exc)
            error = {"ename": "InvalidRequest", "evalue": str(exc), "errno": EINVAL, "path": ""}
            return {"result": None, "error": {**error, "kind": ErrorKind.INPUT.value}}
        held, why = self.held(request.session_id, request.generation)
        if held is None:
            return {"error": {"ename": "SessionLost", "evalue": why, "errno": 0, "path": ""}}
        parcels = self.worker.snapshots.parcels
        fields = request.kernel_fields()
        if request.parcel is not None:  # a write's bytes wait in Redis, raw
            try:
                fields["blob"] = parcels.get(request.parcel, FILE_CHUNK)
            except ValueError as exc:
                return _file_refused(request, "ParcelTooLarge", str(exc))
            if fields["blob"] is None:
                why = f"the bytes to write (parcel {request.parcel}) expired before they arrived"
                return _file_refused(request, "ParcelLost", why)
        try:
            with self.worker.kernel() as kernel:
                reply = kernel.file(request.session_id, request.op, request.path, **fields)
        except KernelError as exc:
            why = f"its sandbox failed during a file operation ({exc})"
            return {"error": {"ename": "SessionLost", "evalue": why, "errno": 0, "path": ""}}
        held.last_used = time.monotonic()
        done = {"result": reply["result"], "error": reply["error"]}
        if "blob" in reply:  # a read's bytes go back the same way
            done["parcel"] = parcels.put(reply["blob"])
        return done

    def close(self, raw: object) -> dict[str, Any]:
        """Close a session (``farm.close_session``): ``closed`` says whether it was held."""
        try:
            request = arrived(CloseRequest, raw)
        except Malformed as exc:
            error = ExecError(ename="InvalidRequest", evalue=str(exc), kind=ErrorKind.INPUT)
            session_id = self._refused(raw, exc).session_id
            return {
                "session_id": session_id,
                "closed": False,
                "error": error.model_dump(mode="json"),
            }
        return self.worker.close_session(request.session_id)

    def held(self, session_id: str, generation: int) -> tuple[HeldSession | None, str]:
        """The session a call names, if this worker generation still holds it live."""
        worker = self.worker
        if generation != worker.generation:
            return (
                None,
                f"session {session_id} on worker {worker.id}: its worker generation is gone",
            )
        held = worker.sessions.get(session_id)
        if held is None:
            return None, f"session {session_id} on worker {worker.id}: closed or expired"
        if held.lost is not None:
            return None, f"session {session_id} on worker {worker.id}: {held.lost}"
        if held.sandbox_generation != worker.keeper.generation:
            return None, f"session {session_id} on worker {worker.id}: its sandbox was replaced"
        return held, ""

    def _command_failure(
        self, exec_id: str, session_id: str, kind: ErrorKind, ename: str, evalue: str
    ) -> dict[str, Any]:
        error = ExecError(ename=ename, evalue=evalue, kind=kind)
        return CommandResult(
            exec_id=exec_id, session_id=session_id, worker=self.worker.id, error=error
        ).model_dump(mode="json")

    def run_once(self, raw: object) -> dict[str, Any]:
        """A one-shot run: a fresh session for this code alone, closed afterwards; the busy
        reply of its open when there was no room in time (nothing ran: the client asks
        again)."""
        try:
            request = arrived(RunRequest, raw)
        except Malformed as exc:
            return self._refused(raw, exc).model_dump(mode="json")
        opened = self.opens.for_run(request.limits, request.egress, request.wait_s or OPEN_WAIT_S)
        if opened.get("refused"):
            return self._failure(request, ErrorKind.INPUT, "InvalidRequest", opened["reason"])
        if opened.get("busy"):
            return opened
        try:
            cell = request.in_session(opened["session_id"], opened["epoch"], self.worker.generation)
            return self._execute(cell)
        finally:
            self.worker.close_session(opened["session_id"])

    def _recorded(
        self, exec_id: str, record: dict[str, Any], request: ExecRequest | CommandRequest
    ) -> dict[str, Any]:
        """A duplicate delivery: return the first delivery's result, never run again."""
        deadline = time.monotonic() + request.timeout_s + 60
        while record.get("state") != "done":
            if time.monotonic() > deadline:
                return self._failure(
                    request,
                    ErrorKind.INFRA,
                    "DuplicateExec",
                    f"exec {exec_id} is still running elsewhere",
                )
            if not self.worker.registry.worker_alive(
                str(record.get("worker")), int(record.get("generation", 0))
            ):
                return self._lost(request, "the worker running this exec died")
            time.sleep(DUPLICATE_POLL_S)  # poll interval of the deadline-bounded wait above
            record = self.worker.registry.exec_record(exec_id) or record
        log.info("exec %s was delivered again; returning its recorded result", exec_id)
        result: dict[str, Any] = record["result"]
        return result

    def _failure(
        self,
        request: ExecRequest | RunRequest | CommandRequest,
        kind: ErrorKind,
        ename: str,
        evalue: str,
    ) -> dict[str, Any]:
        session_id = "" if isinstance(request, RunRequest) else request.session_id
        return ExecResult.failure(
            kind,
            ename,
            evalue,
            exec_id=request.exec_id,
            session_id=session_id,
            epoch=request.epoch if isinstance(request, ExecRequest) else 0,
            worker=self.worker.id,
            state_lost=kind == ErrorKind.SANDBOX_LOST,
        ).model_dump(mode="json")

    def _lost(self, request: ExecRequest | CommandRequest, why: str) -> dict[str, Any]:
        return self._failure(
            request,
            ErrorKind.SANDBOX_LOST,
            "SessionLost",
            f"session {request.session_id} on worker {self.worker.id}: {why}",
        )

    def _refused(self, raw: object, exc: Malformed) -> ExecResult:
        """The ``input`` refusal of a malformed request (nothing ran), with the ids it names."""
        fields = raw if isinstance(raw, dict) else {}
        ids = {k: v for k in ("exec_id", "session_id") if isinstance(v := fields.get(k), str)}
        log.warning(
            "worker %s refused a request (exec %s): %s", self.worker.id, ids.get("exec_id"), exc
        )
        return ExecResult.failure(
            ErrorKind.INPUT,
            "InvalidRequest",
            str(exc),
            worker=self.worker.id,
            exec_id=ids.get("exec_id", ""),
            session_id=ids.get("session_id", ""),
        )


def _oversized(code: str, max_frame: int = DEFAULT_MAX_FRAME) -> str | None:
    """Why ``code`` cannot travel to the kernel in one frame, or ``None``; exact when it might
    not fit (JSON escapes can take six bytes a character), free for ordinary cells."""
    if len(code) < max_frame // 8:
        return None
    size = len(json.dumps(code, ensure_ascii=False).encode()) + 1024
    if size <= max_frame:
        return None
    return (
        f"the cell is {size} bytes as a kernel frame, over the limit of {max_frame} bytes; "
        "pass large data as files (session.files) instead; nothing was run"
    )


def _file_refused(request: FileRequest, ename: str, why: str) -> dict[str, Any]:
    error = {"ename": ename, "evalue": why, "errno": EINVAL, "path": request.path}
    return {"result": None, "error": {**error, "kind": ErrorKind.INPUT.value}}
