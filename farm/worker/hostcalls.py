"""The worker's part of host callbacks: ask the client, wait for its answer, record the call.

A call arrives as an event of the running cell, goes out as a ``HostCall`` on the run's live
stream, and its answer is waited for, never past the cell's own deadline. Invariants: a name
the client did not send, or a call of a run nobody streams, is refused without asking anyone;
every call is recorded in ``ExecResult.sub_calls``. The path: docs/design/host-callbacks.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from farm.events.journal import answer_key
from farm.events.run_events import Event, HostCall
from farm.kernel.repl.hostcall_stubs import MAX_ANSWER_BYTES
from farm.kernel.wire.protocol import CallEvent
from farm.models import CallAnswer, ExecRequest, SubCall

log = logging.getLogger(__name__)

BLOCK_S = 5  # one BLPOP at most this long (below the Redis client's socket timeout)
SLACK_S = 2.0  # past the cell's timeout, the kernel has answered the call itself


class HostCalls:
    def __init__(self, client: redis.Redis, request: ExecRequest, live: bool) -> None:
        self.redis = client
        self.request = request
        self.allowed = set(request.calls or [])
        self.live = live
        self.deadline = time.monotonic() + request.timeout_s + SLACK_S
        self.records: list[SubCall] = []

    def answer(
        self,
        event: CallEvent,
        publish: Callable[[list[Event]], None],
        common: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        """The answer to one ``call`` event of the kernel (``{"ok": ..., ...}``)."""
        t0 = time.monotonic()
        name, call_id = str(event["name"]), int(event["id"])
        args, kwargs = list(event.get("args") or []), dict(event.get("kwargs") or {})
        batch = bool(event.get("batch"))
        if name not in self.allowed:
            answer = _refusal(f"no callback named {name!r} is registered for this session")
        elif not self.live:
            answer = _refusal("nobody listens for this run's callbacks")
        else:
            call = HostCall(
                **common(), call_id=call_id, name=name, args=args, kwargs=kwargs, batch=batch
            )
            publish([call])
            answer = self._wait(call_id)
        self.records.append(
            SubCall(
                name=name,
                args=args,
                kwargs=kwargs,
                batch=batch,
                ok=answer.ok,
                response=answer.value if answer.ok else None,
                error=None
                if answer.ok
                else f"{(answer.error or {}).get('ename')}: {(answer.error or {}).get('evalue')}",
                duration_s=time.monotonic() - t0,
                depth=answer.depth,
            )
        )
        return answer.model_dump(include={"ok", "value", "error"}, exclude_none=True)

    def _wait(self, call_id: int) -> CallAnswer:
        key = answer_key(self.request.exec_id, call_id)
        while (left := self.deadline - time.monotonic()) > 0:
            reply = self.redis.blpop([key], timeout=max(1, min(BLOCK_S, int(left))))
            if reply is not None:
                if len(reply[1]) > MAX_ANSWER_BYTES:
                    why = f"the answer of {len(reply[1])} bytes exceeds {MAX_ANSWER_BYTES} bytes"
                    return _refusal(why)
                try:
                    return CallAnswer.model_validate(json.loads(reply[1]))
                except ValueError as exc:
                    log.warning("exec %s: a bad answer to call %d: %s", key, call_id, exc)
                    return _refusal("the client's answer was malformed")
        return _refusal("the client did not answer before the cell's deadline", "TimeoutError")


def _refusal(why: str, ename: str = "CallbackError") -> CallAnswer:
    return CallAnswer(ok=False, error={"ename": ename, "evalue": why})
