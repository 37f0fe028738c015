"""Opening a session: the request waits in its image's list of opens until a worker has room.

An open (``OpenRequest``) is queued on ``farm.<image>.opens`` and answered on a list of its
own. The worker that takes it claims its ``open_id`` first, so a client that gives up at its
deadline abandons the id (claims it for nobody: a worker that takes the request later opens
nothing) and takes its request back out of the list; one whose worker dies after claiming it
is an open that will never be answered: asked again. Waiting costs the farm nothing but a
blocked pop. Design: docs/design/admission.md.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from farm.client.broker import Broker
from farm.errors import BrokerLost
from farm.models import Busy, Opened, OpenRequest, Refused
from farm.registry import Registry, answer_key, opens_key

ANSWER_SLICE_S = 1.0  # between two looks at the open's claim and the broker's mark
ANSWER_GRACE_S = 60.0  # a worker that claimed an open answers within this of its deadline


def open_once(
    broker: Broker,
    registry: Registry,
    queue: str,
    fields: dict[str, Any],
    deadline: float,
) -> Opened | Busy | Refused:
    """Queue one open on ``queue``'s list (``fields``: its tools, limits and egress) and
    wait for its answer until ``deadline`` (monotonic); busy when no worker took it by then
    (it is abandoned and taken back), or when the worker that took it died."""
    open_id = uuid.uuid4().hex
    left = max(deadline - time.monotonic(), 0.0)
    request = OpenRequest(
        open_id=open_id,
        reply=answer_key(open_id),
        sent_at=time.time(),
        deadline=time.time() + left,
        **fields,
    )
    body, key = request.model_dump_json(), opens_key(queue)
    mark = broker.call(registry.broker_mark, sent=False)
    broker.call(lambda: registry.push_open(key, body), sent=False)
    while True:
        raw = broker.call(lambda: registry.wait_answer(request.reply, ANSWER_SLICE_S), sent=True)
        if raw is not None:
            return _answer(raw)
        why = broker.call(lambda: _unanswerable(broker, registry, request, mark), sent=True)
        if why is not None:
            return Busy(reason=why)
        if time.monotonic() > deadline:
            if broker.call(lambda: registry.abandon(open_id), sent=True):
                broker.quietly(lambda: registry.take_back(key, body))
                return Busy(reason=f"no worker had room for it within {left:.0f} s")
            if time.monotonic() > deadline + ANSWER_GRACE_S:  # claimed, never answered
                return Busy(reason="the worker that took it did not answer")


def _unanswerable(
    broker: Broker, registry: Registry, request: OpenRequest, mark: str
) -> str | None:
    """Why ``request`` will never be answered: the broker lost its data, or the worker that
    claimed it is gone; ``None`` while it may be."""
    if registry.broker_mark() != mark:
        raise BrokerLost("the broker lost its data while a session open waited")
    record = registry.exec_record(request.open_id)
    if record is None or record.get("state") != "running":
        return None
    owner = (str(record["worker"]), int(record["generation"]))
    if broker.after_outage(lambda: registry.worker_alive(*owner), bool):
        return None
    return f"worker {owner[0]} (generation {owner[1]}) died while it opened the session"


def _answer(raw: str) -> Opened | Busy | Refused:
    data = json.loads(raw)
    if data.get("refused"):
        return Refused.model_validate(data)
    return Busy.model_validate(data) if data.get("busy") else Opened.model_validate(data)
