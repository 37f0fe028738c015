"""Bytes that travel beside a Celery message, as one raw Redis value each (a parcel).

Celery's messages are JSON, so a file chunk in one would cross as base64 and be parsed by
every hop; instead its sender puts the bytes under ``farm:parcel:<id>`` (a TTL: an abandoned
parcel goes by itself) and names the id in the message. A read's parcel is taken by the client
(read and deleted at once); a write's is read by the worker and dropped by the client once
answered, so a chunk written twice (a redelivery) writes the same bytes. A receiver builds the
key from an id of 32 hex digits: a request cannot name another key. Design:
docs/design/kernel.md "The byte channel".
"""

from __future__ import annotations

import re
import uuid

import redis

PREFIX = "farm:parcel:"
TTL_S = 300.0  # a parcel waits this long for its receiver (a queued call, a slow client)
ID = re.compile(r"[0-9a-f]{32}")


class Parcels:
    """Parcels in a Redis that answers bytes (``decode_responses`` off)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def put(self, data: bytes, ttl_s: float = TTL_S) -> str:
        parcel_id = uuid.uuid4().hex
        self.redis.set(PREFIX + parcel_id, data, px=max(int(ttl_s * 1000), 1))
        return parcel_id

    def get(self, parcel_id: str, max_bytes: int) -> bytes | None:
        """The parcel's bytes; ``None`` when there is none (expired, taken, or an id that is
        not one); one past ``max_bytes`` is a ``ValueError``, read no further than that."""
        if not ID.fullmatch(parcel_id):
            return None
        pipe = self.redis.pipeline(transaction=True)
        pipe.exists(PREFIX + parcel_id)
        pipe.getrange(PREFIX + parcel_id, 0, max_bytes)  # at most max_bytes + 1 bytes
        exists, found = pipe.execute()
        if not exists:
            return None
        if len(found) > max_bytes:
            raise ValueError(f"a parcel of over {max_bytes} bytes: send smaller chunks")
        return bytes(found)

    def take(self, parcel_id: str) -> bytes | None:
        """``get``, and the parcel deleted in the same transaction."""
        if not ID.fullmatch(parcel_id):
            return None
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(PREFIX + parcel_id)
        pipe.delete(PREFIX + parcel_id)
        found, _ = pipe.execute()
        return bytes(found) if found is not None else None

    def drop(self, parcel_id: str) -> None:
        if ID.fullmatch(parcel_id):
            self.redis.delete(PREFIX + parcel_id)
