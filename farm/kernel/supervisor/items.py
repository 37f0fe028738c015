"""One-shot boxes (``protocol.Item``): open, write files, run cells, then a command or a judge
step, close: a batch item's requests in one round trip, so that its cost is its box.

Invariants: each step keeps the rules of the request it stands for (each cell's timeout, caps,
kinds); a file that cannot be written, or the first cell that fails, ends the item (a later
step would run on a broken premise); the box is closed at the end, whatever happened.
Details: docs/design/kernel.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import uuid
from collections.abc import Callable
from typing import Any

from ..wire.protocol import Execute, FileRequest, ItemOutcome, SessionOpened
from .cell import fit
from .manager import SessionManager
from .requests import CommandCall, ItemCall
from .streaming import Emit

FILE_CHUNK_CHARS = 4 << 20  # base64 of 3 MiB: an item's files are written in chunks this size


async def run_item(
    manager: SessionManager,
    request: ItemCall,
    emit_for: Callable[[str], Emit | None],
    gone: asyncio.Future[Any] | None = None,
) -> ItemOutcome:
    """Take the steps of ``request`` (a parsed ``protocol.Item``) in a box of its own; a judge
    step with nothing before it gets a box and no session process (``judges``). Its box waits
    for room until the host's connection is ``gone``, at most its ``wait_s``."""
    alone = not request["files"] and not request["cells"] and not request["egress"]
    if request["judge"] is not None and alone:
        item_id = request["session_id"] or uuid.uuid4().hex
        limits = manager.check_open(item_id, request["limits"])
        asked = manager.loop.time()
        box = await manager.admit(item_id, limits, request["wait_s"], gone)
        queue_s = manager.loop.time() - asked
        return await manager.judges.alone(request, box, item_id, queue_s)
    opened = await manager.open(
        request["tools"],
        request["limits"],
        request["session_id"],
        request["egress"],
        request["wait_s"],
        gone,
    )
    session_id = opened["session_id"]
    manager.sessions[session_id].one_shot = True
    outcome: ItemOutcome = {
        "session_id": session_id,
        "cells": [],
        "command": None,
        "file_error": None,
        "judge": None,
        "queue_s": opened["queue_s"],
    }
    try:
        if not await _write_files(manager, request, session_id, outcome):
            return outcome
        if not await _run_cells(manager, request, opened, emit_for, outcome):
            return outcome
        if request["judge"] is not None:
            box = manager.session(session_id).box
            outcome["judge"] = await manager.judges.run(box, request, session_id)
        elif request["argv"] is not None:
            command = _command(request, request["argv"], session_id)
            outcome["command"] = fit((await manager.command(command))["result"], request["room"])
        return outcome
    finally:
        if session_id in manager.sessions:  # a host's close_session may have ended it
            manager.close(session_id)


async def _write_files(
    manager: SessionManager, request: ItemCall, session_id: str, outcome: ItemOutcome
) -> bool:
    """Write the item's files, each in chunks (a file of any size); ``False`` at the first
    that fails (``file_error`` says why)."""
    for path, data in request["files"].items():
        for start in range(0, max(len(data), 1), FILE_CHUNK_CHARS):
            try:
                part = base64.b64decode(data[start : start + FILE_CHUNK_CHARS])
            except (binascii.Error, ValueError) as exc:
                why = f"not base64: {exc}"
                outcome["file_error"] = {
                    "ename": "ValueError",
                    "evalue": why,
                    "errno": errno.EINVAL,
                    "path": path,
                }
                return False
            write: FileRequest = {
                "type": "file",
                "session_id": session_id,
                "op": "write",
                "path": path,
                "blob": part,
                "offset": start // 4 * 3,
            }
            reply = await manager.file(write)
            if reply["error"] is not None:
                outcome["file_error"] = reply["error"]
                return False
    return True


async def _run_cells(
    manager: SessionManager,
    request: ItemCall,
    opened: SessionOpened,
    emit_for: Callable[[str], Emit | None],
    outcome: ItemOutcome,
) -> bool:
    """Run the item's cells in order, each result fitted to the frame; ``False`` at the first
    that does not end ``ok``."""
    epoch = opened["epoch"]
    for number, code in enumerate(request["cells"]):
        run: Execute = {
            "type": "execute",
            "session_id": opened["session_id"],
            "epoch": epoch,
            "code": code,
            "timeout_s": request["timeout_s"],
            "exec_id": f"{request['exec_id']}-{number}",
            "max_output_bytes": request["max_output_bytes"],
        }
        emit = emit_for(run["exec_id"])
        result = fit(await manager.execute(run, emit), request["room"])
        if emit is not None:
            emit({"type": "done", "result": result})
        outcome["cells"].append(result)
        epoch = result["epoch"]
        if result["status"] != "ok":
            return False
    return True


def _command(request: ItemCall, argv: list[str], session_id: str) -> CommandCall:
    """The item's command as a ``command`` request (parsed): no env, cwd or stdin of its own."""
    return {
        "timeout_s": request["timeout_s"],
        "max_output_bytes": request["max_output_bytes"],
        "session_id": session_id,
        "exec_id": f"{request['exec_id']}-cmd",
        "argv": argv,
        "env": {},
        "cwd": None,
        "stdin": b"",
        "stdin_path": None,
    }
