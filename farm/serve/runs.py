"""``/v1/run`` (one-shot), ``/v1/map`` (NDJSON in, NDJSON records out), ``/v1/workers`` and
``/v1/images``.

``/v1/map`` is ``Farm.map`` over HTTP, one engine: the body's lines are read as the map takes
items (a body of a million lines keeps memory flat), each record is written the moment the map
yields it, and a client that goes away cancels the map (``MapRun.close``: nothing more is sent,
running items stop). A line that is not JSON becomes a record of kind ``input``, as a malformed
item does in Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from farm.client import Farm
from farm.client.mapping import MapRun
from farm.errors import FarmError
from farm.models import ExecResult
from farm.serve.access import Slots, caller, idempotent_id
from farm.serve.problem_documents import for_farm_error, problem, problem_json
from farm.serve.schemas import ImageInfo, OneShotRequest
from farm.serve.session_routes import PROBLEMS, IdempotencyKey, slots_of
from farm.serve.tokens import Token

router = APIRouter(prefix="/v1", tags=["runs"])
Runner = Annotated[Token, Depends(caller("run"))]
Admin = Annotated[Token, Depends(caller("admin"))]
NDJSON = "application/x-ndjson"
ITEMS_AHEAD = 64  # batches of body lines between the request and the map's thread
POLL_S = 0.2  # how often the map's thread, waiting for lines, looks whether it was cancelled


class DuplexResponse(StreamingResponse):
    """A streamed response written while its request's body is still read: the map's own
    body reader also notices the client leaving, so Starlette's disconnect listener (which
    would take body messages from it) is left out."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.stream_response(send)


def farm_of(request: Request) -> Farm:
    farm: Farm = request.app.state.farm
    return farm


@router.post("/run", response_model=ExecResult, responses=PROBLEMS)
async def run_once(
    body: OneShotRequest, token: Runner, request: Request, idempotency_key: IdempotencyKey = None
) -> ExecResult:
    """Run code once in a fresh session (a box of its own), closed afterwards."""
    farm = farm_of(request)
    async with slots_of(request).hold(token):
        return await asyncio.to_thread(
            farm.run,
            body.code,
            image=body.image,
            timeout_s=body.timeout_s or 30.0,
            retries=body.retries,
            max_output_bytes=body.max_output_bytes,
            limits=body.limits.model_dump(exclude_none=True) if body.limits else None,
            exec_id=idempotent_id(token, "run", idempotency_key),
            egress=body.egress,
        )


@router.post(
    "/map",
    response_model=None,
    responses={
        **PROBLEMS,
        200: {"content": {NDJSON: {"schema": {"type": "string"}}}, "description": "records"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {NDJSON: {"schema": {"type": "string"}}},
            "description": "one item a line: a code string, or {id, code|cells|cmd, setup, "
            "files, timeout_s, limits, image}",
        }
    },
)
async def map_items(
    token: Runner,
    request: Request,
    image: str = "default",
    ordered: bool = True,
    timeout_s: Annotated[float, Query(gt=0, le=86400)] = 30.0,
    retries: Annotated[int, Query(ge=0, le=5)] = 0,
    concurrency: Annotated[int | None, Query(ge=1)] = None,
) -> DuplexResponse:
    """``Farm.map`` over HTTP: NDJSON items in, one NDJSON ``BatchRecord`` per item out as they
    finish (``ordered=false``) or in order. Disconnecting cancels the map."""
    farm = farm_of(request)
    slots = slots_of(request)
    slots.check(token)
    limit = request.app.state.settings.api_max_body_bytes
    items: queue.Queue[list[Any] | None] = queue.Queue(ITEMS_AHEAD)
    stop = threading.Event()

    def start(width: int | None) -> MapRun:
        return farm.map(
            _lines(items, stop),
            image=image,
            ordered=ordered,
            timeout_s=timeout_s,
            retries=retries,
            concurrency=width,
        )

    run = await asyncio.to_thread(start, concurrency)
    if run.concurrency > slots.free(token):  # the map's window, within the token's cap
        run = await asyncio.to_thread(start, slots.free(token))  # (the first sent nothing)
    width = run.concurrency
    return DuplexResponse(
        _records(request, slots, token, width, run, items, stop, limit), media_type=NDJSON
    )


def _lines(items: queue.Queue[list[Any] | None], stop: threading.Event) -> Iterator[Any]:
    """The items the body's reader hands over, in batches; ends with the body or a cancel."""
    while not stop.is_set():
        try:
            batch = items.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if batch is None:
            return
        yield from batch


async def _read_body(
    request: Request, items: queue.Queue[list[Any] | None], stop: threading.Event, limit: int
) -> None:
    """Parse the body's lines into items for the map, then wait for the client to leave."""
    tail, count = b"", 0
    try:
        async for piece in request.stream():
            lines = (tail + piece).split(b"\n")
            tail = lines.pop()
            if len(tail) > limit:
                lines.append(tail)
                tail = b""
            batch = []
            for line in lines:
                if line.strip():
                    batch.append(_item(line, count, limit))
                    count += 1
            if batch:
                await _put(items, batch, stop)
        if tail.strip():
            await _put(items, [_item(tail, count, limit)], stop)
        await _put(items, None, stop)
        while (await request.receive())["type"] != "http.disconnect":
            pass
    finally:
        stop.set()  # the client left (or the response ended): the map is cancelled


async def _put(
    items: queue.Queue[list[Any] | None], batch: list[Any] | None, stop: threading.Event
) -> None:
    """Hand ``batch`` to the map's thread once its queue has room, waiting on the loop: a
    reader that took a thread to wait would deadlock the server once the maps' own threads
    held them all (each map's thread waits for its reader's items)."""
    while not stop.is_set():
        try:
            items.put_nowait(batch)
            return
        except queue.Full:
            await asyncio.sleep(POLL_S)  # the poll interval of a queue.Queue from the loop


def _item(line: bytes, key: int, limit: int) -> Any:
    """A body line as an item; one that is not JSON (or too long) as a malformed item, which
    the map turns into a record of kind ``input``."""
    if len(line) > limit:
        return {"id": key, "line": f"the line is over the limit of {limit} bytes"}
    try:
        return json.loads(line)
    except ValueError as exc:
        return {"id": key, "line": f"not JSON: {exc}"}


async def _records(
    request: Request,
    slots: Slots,
    token: Token,
    width: int,
    run: MapRun,
    items: queue.Queue[list[Any] | None],
    stop: threading.Event,
    limit: int,
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    out: asyncio.Queue[Any] = asyncio.Queue()
    end: Any = object()

    def drive() -> None:
        try:
            for record in run:
                loop.call_soon_threadsafe(out.put_nowait, record)
        except BaseException as exc:  # a broker outage: the last line says so
            loop.call_soon_threadsafe(out.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(out.put_nowait, end)

    async with slots.hold(token, width):
        reader = asyncio.create_task(_read_body(request, items, stop, limit))
        driver = asyncio.create_task(asyncio.to_thread(drive))
        watcher = asyncio.create_task(_cancel_when(stop, run, out, end))
        try:
            finished = False
            while not finished:
                lines = []
                batch = [await out.get()]
                while not out.empty():  # what came meanwhile goes in one write
                    batch.append(out.get_nowait())
                for record in batch:
                    if record is end:
                        finished = True
                    elif isinstance(record, BaseException):
                        lines.append(_problem_line(record))
                    else:
                        lines.append(record.model_dump_json().encode() + b"\n")
                if lines:
                    yield b"".join(lines)
        finally:
            stop.set()
            await asyncio.to_thread(run.close)
            reader.cancel()
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(driver), timeout=30)


async def _cancel_when(
    stop: threading.Event, run: MapRun, out: asyncio.Queue[Any], end: Any
) -> None:
    """Close the map once the client left, and end the response."""
    while not stop.is_set():
        await asyncio.sleep(POLL_S)  # the poll interval of a threading.Event from the loop
    await asyncio.to_thread(run.close)
    out.put_nowait(end)


def _problem_line(exc: BaseException) -> bytes:
    failed = for_farm_error(exc) if isinstance(exc, FarmError) else problem(500, "infra", str(exc))
    body = problem_json(failed)
    return json.dumps({"problem": body}).encode() + b"\n"


@router.get("/workers", responses=PROBLEMS)
async def workers(token: Admin, request: Request) -> list[dict[str, Any]]:
    """The live workers, as the registry holds them (admin scope)."""
    return await asyncio.to_thread(farm_of(request).workers)


@router.get("/images", response_model=list[ImageInfo], responses=PROBLEMS)
async def images(token: Runner, request: Request) -> list[ImageInfo]:
    """The farm images live workers serve, with their workers and capacity."""
    found: dict[str, ImageInfo] = {}
    for worker in await asyncio.to_thread(farm_of(request).workers):
        name = str(worker.get("image"))
        entry = found.setdefault(name, ImageInfo(name=name, workers=0, capacity=0))
        entry.workers += 1
        entry.capacity += int(worker.get("capacity") or 0)
    return sorted(found.values(), key=lambda i: i.name)
