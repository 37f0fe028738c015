"""``/v1/sessions/{id}/files``: put, get, list and delete a session's files, of any size.

Bodies stream both ways: a PUT's body is written as it arrives (``SessionFiles.write_part``) and
a GET's comes from ``read_chunks``, one 8 MiB chunk at a time, so a file of gigabytes never sits in
the server's memory. Paths are the workspace's (``session.files``): the kernel refuses any that
leaves it (a 400 problem of kind ``file`` with the OS's reason; 404 for a missing file).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from farm.client.session_files import CHUNK
from farm.serve.access import caller
from farm.serve.schemas import FileEntry, FileWritten
from farm.serve.session_routes import PROBLEMS, sessions_of
from farm.serve.tokens import Token

router = APIRouter(prefix="/v1/sessions/{session_id}/files", tags=["files"])
Caller = Annotated[Token, Depends(caller("run"))]


@router.get("", response_model=list[FileEntry], responses=PROBLEMS)
async def list_files(
    session_id: str, token: Caller, request: Request, path: Annotated[str, Query()] = "."
) -> list[FileEntry]:
    """The entries of a workspace directory."""
    session = await sessions_of(request).get(token, session_id)
    entries = await asyncio.to_thread(session.files.list, path)
    return [
        FileEntry.model_validate({k: v for k, v in e.items() if k in FileEntry.model_fields})
        for e in entries
    ]


@router.put("/{path:path}", response_model=FileWritten, status_code=201, responses=PROBLEMS)
async def put_file(session_id: str, path: str, token: Caller, request: Request) -> FileWritten:
    """Create or replace a file with the request's body (streamed: any size)."""
    session = await sessions_of(request).get(token, session_id)
    buffer, offset = bytearray(), 0
    async for piece in request.stream():
        buffer += piece
        while len(buffer) >= CHUNK:
            part = bytes(buffer[:CHUNK])
            del buffer[:CHUNK]
            await asyncio.to_thread(session.files.write_part, path, part, offset)
            offset += len(part)
    if buffer or not offset:  # the rest, or an empty file
        await asyncio.to_thread(session.files.write_part, path, bytes(buffer), offset)
        offset += len(buffer)
    return FileWritten(path=path, size=offset)


@router.get(
    "/{path:path}",
    responses={**PROBLEMS, 200: {"content": {"application/octet-stream": {}}}},
    response_class=Response,
)
async def get_file(session_id: str, path: str, token: Caller, request: Request) -> Response:
    """The file's bytes, streamed."""
    session = await sessions_of(request).get(token, session_id)
    chunks = await asyncio.to_thread(session.files.read_chunks, path)  # a missing file: 404
    return StreamingResponse(_stream(chunks), media_type="application/octet-stream")


async def _stream(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    done: Any = object()
    while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
        yield chunk


@router.delete("/{path:path}", status_code=204, responses=PROBLEMS)
async def delete_file(session_id: str, path: str, token: Caller, request: Request) -> Response:
    session = await sessions_of(request).get(token, session_id)
    await asyncio.to_thread(session.files.remove, path)
    return Response(status_code=204)
