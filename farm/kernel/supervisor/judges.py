"""The supervisor's side of judge steps: the runner (``judging``) started in an item's box,
its one JSON answer read like a command's stdout, and stopped when the host closes the item.

A judge item with no files to write gets a box and no session process (one would be forked
and ended for nothing); the host's ``close_session`` with the item's id still stops it. A
runner that answers nothing parsable is ``IE``: farm's failure, which the host retries.
"""

from __future__ import annotations

import json

from ..boxes.pool import Box
from ..boxes.trees import kill_tree
from ..wire.protocol import ItemOutcome, JudgeOutcome
from .commands import CommandRun
from .requests import ItemCall
from .spawner import Spawner


class Judges:
    """The judge steps running in this kernel, by item (session) id."""

    def __init__(self, spawner: Spawner) -> None:
        self.spawner = spawner
        self.running: dict[str, CommandRun] = {}

    async def alone(self, request: ItemCall, box: Box, item_id: str, queue_s: float) -> ItemOutcome:
        """An item that is a judge step only: the runner in ``box`` (admitted for it after
        ``queue_s``), then the box's end."""
        try:
            judged = await self.run(box, request, item_id)
        finally:
            self.spawner.end_box(box, None)
            self.spawner.admission.release()
        return {
            "session_id": item_id,
            "cells": [],
            "command": None,
            "file_error": None,
            "judge": judged,
            "queue_s": queue_s,
        }

    async def run(self, box: Box, request: ItemCall, item_id: str) -> JudgeOutcome:
        """The judge step of ``request`` in ``box``: the runner's outcome (``JudgeOutcome``)."""
        judge = request["judge"]
        assert judge is not None
        run = await self.spawner.command(box, ["farm-judge"], request["room"] // 2, judge=judge)
        self.running[item_id] = run
        try:
            done = await run.run(b"", request["timeout_s"])
        finally:
            self.running.pop(item_id, None)
        try:
            result: JudgeOutcome = json.loads(done["stdout"])  # the runner's (``judging``)
        except ValueError:
            why = "timed out" if done["timed_out"] else f"ended with {done['returncode']}"
            message = f"the judge's runner {why}: {done['stderr'][-2000:]}"
            return {"verdict": "IE", "message": message, "tests": [], "compile": None}
        return result

    def stop(self, item_id: str) -> bool:
        """Kill the runner of ``item_id`` and all it started; whether one ran."""
        run = self.running.pop(item_id, None)
        if run is not None:
            kill_tree(run.pid)
        return run is not None
