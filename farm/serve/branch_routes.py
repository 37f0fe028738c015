"""``/v1/sessions/{id}/checkpoint``, ``/rollback``, ``/checkpoints/{cp}``, ``/fork``.

Thin fronts over ``farm.client.branching`` (through ``Session``), off the event loop. A fork's
sessions belong to the caller's token like any it opened. Refusals are problem documents:
``too_many_checkpoints`` and ``budget_exceeded`` (409), ``unknown_checkpoint`` (404).
Design: docs/design/fork.md.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from pydantic import Field

from farm.models import Model
from farm.models.branches import Checkpoint
from farm.serve.schemas import SessionInfo
from farm.serve.session_routes import PROBLEMS, Caller, info, sessions_of, slots_of

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


class RollbackRequest(Model):
    checkpoint_id: str
    keep: bool = Field(True, description="keep the checkpoint to return to again")


class ForkRequest(Model):
    n: int = Field(1, ge=1, le=64, description="how many sessions to fork")


class ForkInfo(Model):
    sessions: list[SessionInfo]
    not_carried: list[str] = Field(description="what of the parent the forks lack, and why")


@router.post("/{session_id}/checkpoint", status_code=201, response_model=Checkpoint,
             responses=PROBLEMS)  # fmt: skip
async def checkpoint(session_id: str, token: Caller, request: Request) -> Checkpoint:
    """Keep the session as it is (variables, modules, files) to roll back to."""
    session = await sessions_of(request).get(token, session_id)
    async with slots_of(request).hold(token):
        return await asyncio.to_thread(session.checkpoint)


@router.post("/{session_id}/rollback", response_model=SessionInfo, responses=PROBLEMS)
async def rollback(
    session_id: str, body: RollbackRequest, token: Caller, request: Request
) -> SessionInfo:
    """Return to a checkpoint exactly; the session moves to a new epoch."""
    session = await sessions_of(request).get(token, session_id)
    async with slots_of(request).hold(token):
        await asyncio.to_thread(lambda: session.rollback(body.checkpoint_id, keep=body.keep))
    return info(session)


@router.delete("/{session_id}/checkpoints/{checkpoint_id}", status_code=204, responses=PROBLEMS)
async def drop_checkpoint(
    session_id: str, checkpoint_id: str, token: Caller, request: Request
) -> Response:
    session = await sessions_of(request).get(token, session_id)
    await asyncio.to_thread(session.drop_checkpoint, checkpoint_id)
    return Response(status_code=204)


@router.post("/{session_id}/fork", status_code=201, response_model=ForkInfo, responses=PROBLEMS)
async def fork(session_id: str, body: ForkRequest, token: Caller, request: Request) -> ForkInfo:
    """``n`` new sessions, each a box of its own, from the session's files and variables."""
    held = sessions_of(request)
    session = await held.get(token, session_id)
    async with slots_of(request).hold(token):
        forks = await asyncio.to_thread(session.fork, body.n)
    for forked in forks:
        await held.adopt(token, forked)
    return ForkInfo(sessions=[info(f) for f in forks], not_carried=forks.not_carried)
