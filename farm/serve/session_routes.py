"""``/v1/sessions``: open, list, get and close sessions; run code (a JSON result, or the live
events as server-sent events), run commands, restart after a loss.

Each route is a thin front over ``farm.client.Session``: the same call, off the event loop.
A failure of the code is a 200 whose result holds an ``error``; a lost session (410) or lost
state (409) is a problem document, as ``Session.run`` raises them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import StreamingResponse

from farm.client import Session
from farm.errors import FarmError
from farm.models import CommandResult, ExecResult
from farm.serve.access import Sessions, Slots, caller, idempotent_id
from farm.serve.problem_documents import Problem, ProblemError, for_farm_error, problem_json
from farm.serve.schemas import ExecRequest, SessionCreate, SessionInfo, SessionRunRequest
from farm.serve.tokens import Token

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
Caller = Annotated[Token, Depends(caller("run"))]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="a retry with the same key returns the first call's result, never runs twice",
    ),
]
PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": why}
    for status, why in [
        (400, "malformed body"),
        (401, "no token, or an unknown one"),
        (404, "no such session (or not the caller's)"),
        (409, "the session's state was lost: POST .../restart"),
        (410, "the session is lost"),
        (422, "the body does not validate"),
        (429, "the token's concurrency cap is reached"),
        (503, "the farm is busy or unavailable"),
    ]
}
SSE = {"text/event-stream": {"schema": {"type": "string"}}}


def sessions_of(request: Request) -> Sessions:
    held: Sessions = request.app.state.sessions
    return held


def slots_of(request: Request) -> Slots:
    slots: Slots = request.app.state.slots
    return slots


def info(session: Session, image: str | None = None) -> SessionInfo:
    return SessionInfo(id=session.id, image=image, worker=session.worker, epoch=session.epoch)


@router.post("", status_code=201, response_model=SessionInfo, responses=PROBLEMS)
async def create_session(body: SessionCreate, token: Caller, request: Request) -> SessionInfo:
    """Open a session (a sandboxed REPL whose variables persist between runs)."""
    options = body.model_dump(exclude_none=True)
    options["limits"] = body.limits.model_dump(exclude_none=True) if body.limits else None
    session = await sessions_of(request).open(token, **options)
    return info(session, body.image).model_copy(update={"queue_s": session.queue_s})


@router.get("", response_model=list[SessionInfo], responses=PROBLEMS)
async def list_sessions(token: Caller, request: Request) -> list[SessionInfo]:
    """The caller's live sessions."""
    rows = await sessions_of(request).list(token)
    return [
        SessionInfo(
            id=r["id"], image=r.get("image"), worker=r.get("worker"), epoch=r.get("epoch", 0)
        )
        for r in rows
    ]


@router.get("/{session_id}", response_model=SessionInfo, responses=PROBLEMS)
async def get_session(session_id: str, token: Caller, request: Request) -> SessionInfo:
    session = await sessions_of(request).get(token, session_id)
    entry = await asyncio.to_thread(session.farm.registry.session, session_id)
    if entry is None:
        raise ProblemError(410, "sandbox_lost", f"session {session_id} is closed or expired")
    return SessionInfo(
        id=session_id, image=entry.get("image"), worker=session.worker, epoch=session.epoch
    )


@router.delete("/{session_id}", status_code=204, responses=PROBLEMS)
async def delete_session(session_id: str, token: Caller, request: Request) -> Response:
    """Close the session; its box and everything in it go."""
    await sessions_of(request).close(token, session_id)
    return Response(status_code=204)


@router.post("/{session_id}/restart", response_model=SessionInfo, responses=PROBLEMS)
async def restart_session(session_id: str, token: Caller, request: Request) -> SessionInfo:
    """Accept a loss of state (409 ``state_lost``): go on in the fresh namespace."""
    session = await sessions_of(request).get(token, session_id)
    session.restart()
    return info(session)


@router.post(
    "/{session_id}/run",
    response_model=ExecResult,
    responses={**PROBLEMS, 200: {"content": SSE, "description": "the result, or its events"}},
)
async def run(
    session_id: str,
    body: SessionRunRequest,
    token: Caller,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Run code in the session. ``Accept: text/event-stream`` streams its events (``exec_start``,
    ``stream``, ``display``, ``result``, ``error``, ``exec_end``:
    ``farm.events.run_events``) and then the ``ExecResult`` as a ``done`` event."""
    session = await sessions_of(request).get(token, session_id)
    exec_id = idempotent_id(token, session_id, idempotency_key)
    if "text/event-stream" in request.headers.get("accept", ""):
        slots = slots_of(request)
        slots.check(token)
        return StreamingResponse(
            _events(slots, token, session, body, exec_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    async with slots_of(request).hold(token):
        started = time.perf_counter()
        result = await asyncio.to_thread(
            session.run,
            body.code,
            body.timeout_s,
            max_output_bytes=body.max_output_bytes,
            exec_id=exec_id,
            rollback_to=body.rollback_to,
        )
        took_ms = (time.perf_counter() - started) * 1000
    timing = {"Server-Timing": f"run;dur={took_ms:.2f}"}  # the farm's share of the request
    return Response(result.model_dump_json(), media_type="application/json", headers=timing)


async def _events(
    slots: Slots, token: Token, session: Session, body: SessionRunRequest, exec_id: str | None
) -> AsyncIterator[str]:
    """The run's events as SSE; a loss the stream raises ends it with a ``problem`` event."""
    async with slots.hold(token):
        stream = session.stream(
            body.code,
            body.timeout_s,
            max_output_bytes=body.max_output_bytes,
            exec_id=exec_id,
            rollback_to=body.rollback_to,
        )
        events = iter(stream)
        done: Any = object()
        try:
            while (event := await asyncio.to_thread(next, events, done)) is not done:
                yield f"id: {event.seq}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n"
        except FarmError as exc:
            body_ = json.dumps(problem_json(for_farm_error(exc)))
            yield f"event: problem\ndata: {body_}\n\n"
            return
        assert stream.result is not None
        yield f"event: done\ndata: {stream.result.model_dump_json()}\n\n"


@router.post("/{session_id}/exec", response_model=CommandResult, responses=PROBLEMS)
async def exec_command(
    session_id: str,
    body: ExecRequest,
    token: Caller,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> CommandResult:
    """Run a command in the session's box (argv, or a string for ``sh -c``)."""
    session = await sessions_of(request).get(token, session_id)
    stdin: bytes | str | None = body.input
    if body.input_base64 is not None:
        try:
            stdin = base64.b64decode(body.input_base64, validate=True)
        except ValueError:
            raise ProblemError(422, "input", "input_base64 is not base64") from None
    async with slots_of(request).hold(token):
        return await asyncio.to_thread(
            session.exec,
            body.cmd,
            input=stdin,
            cwd=body.cwd,
            env=body.env,
            timeout_s=body.timeout_s,
            max_output_bytes=body.max_output_bytes,
            exec_id=idempotent_id(token, session_id, idempotency_key),
        )
