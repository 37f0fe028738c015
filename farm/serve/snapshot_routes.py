"""``/v1/sessions/{id}/snapshot``, ``/pause``, ``/resume`` and ``/v1/restore``: session snapshots
over HTTP, thin fronts over ``Session.snapshot/pause/resume`` and ``Farm.restore``.

A snapshot is kept by the farm (``keep``, the default: its id and what it could not carry) or
returned as its bytes (``application/vnd.farm.snapshot``); a restore takes a kept one's id
(JSON) or such bytes (the body, within ``api_max_body_bytes``). A kept snapshot's id is a
random capability: whoever holds it may restore it. Design: docs/design/snapshots.md.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from farm.models.snapshot_info import SnapshotInfo
from farm.serve.access import caller
from farm.serve.problem_documents import ProblemError
from farm.serve.schemas import SessionInfo
from farm.serve.session_routes import PROBLEMS, info, sessions_of
from farm.serve.tokens import Token

router = APIRouter(tags=["snapshots"])
Caller = Annotated[Token, Depends(caller("run"))]
MEDIA = "application/vnd.farm.snapshot"
KEPT_ID = "[0-9a-f]{32}"  # what keep=True hands out; a paused session's is its owner's only


@router.post("/v1/sessions/{session_id}/snapshot", responses=PROBLEMS)
async def snapshot(
    session_id: str,
    token: Caller,
    request: Request,
    keep: Annotated[bool, Query(description="kept by the farm (an id), else its bytes")] = True,
) -> Any:
    """Snapshot the session: its variables (those it cannot carry are named, with why), its
    workspace's files and its image's identity."""
    session = await sessions_of(request).get(token, session_id)
    snap = await asyncio.to_thread(session.snapshot, keep=keep)
    if keep:
        return {"id": snap.id, "snapshot": snap.info.model_dump(mode="json")}
    return Response(bytes(snap), media_type=MEDIA)


@router.post("/v1/sessions/{session_id}/pause", responses=PROBLEMS)
async def pause(session_id: str, token: Caller, request: Request) -> SnapshotInfo:
    """Free the session's box, its snapshot kept by the farm: ``/resume`` brings it back."""
    session = await sessions_of(request).get(token, session_id)
    return (await asyncio.to_thread(session.pause)).info


@router.post("/v1/sessions/{session_id}/resume", response_model=SessionInfo, responses=PROBLEMS)
async def resume(session_id: str, token: Caller, request: Request) -> SessionInfo:
    """Bring a paused session back on any worker of its image, with its id."""
    session = await sessions_of(request).get(token, session_id)
    await asyncio.to_thread(session.resume)
    return info(session)


@router.post("/v1/restore", status_code=201, response_model=SessionInfo, responses=PROBLEMS)
async def restore(
    token: Caller,
    request: Request,
    snapshot_id: Annotated[str | None, Query(description="a kept snapshot's id")] = None,
    image: Annotated[str | None, Query(description="another image of the same Python")] = None,
) -> SessionInfo:
    """A new session holding a snapshot: a kept one's ``snapshot_id``, or the body's bytes."""
    farm = sessions_of(request).farm
    if snapshot_id is not None and not re.fullmatch(KEPT_ID, snapshot_id):
        raise ProblemError(404, "snapshot_not_found", f"no snapshot is kept as {snapshot_id}")
    source: str | bytes = snapshot_id if snapshot_id is not None else await request.body()
    session = await asyncio.to_thread(farm.restore, source, image=image)
    await sessions_of(request).adopt(token, session)
    return info(session, image)
