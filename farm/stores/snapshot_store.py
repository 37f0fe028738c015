"""Session snapshots as bytes, and where the farm keeps them.

A snapshot travels as one blob: ``MAGIC``, the length of its header, the header (a
``SnapshotInfo`` as JSON), the pickled namespace, the workspace's tar. The blob is the same in
the farm's store and in a caller's hands, so either can be restored. ``SnapshotStore`` is the
one interface the worker and the client use (``RedisSnapshotStore``: a key with a TTL); an
object store could implement it. The host never unpickles: it only reads the header.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import redis

from farm.errors import SnapshotError
from farm.models.snapshot_info import SnapshotInfo

if TYPE_CHECKING:
    from farm.settings import FarmSettings

MAGIC = b"FARMSNAP1\n"
LENGTH_BYTES = 8
MAX_HEADER = 16 << 20
PREFIX = "farm:snapshot:"


def pack(info: SnapshotInfo, namespace: bytes, workspace: bytes) -> bytes:
    header = info.model_dump_json().encode()
    length = len(header).to_bytes(LENGTH_BYTES, "big")
    return b"".join((MAGIC, length, header, namespace, workspace))


def header(blob: bytes) -> tuple[SnapshotInfo, int]:
    """The blob's ``SnapshotInfo`` and where its namespace starts; a blob that is not a whole
    farm snapshot is a ``SnapshotError``."""
    return read_header(lambda start, end: blob[start:end], len(blob))


def read_header(read: Callable[[int, int], bytes], total: int) -> tuple[SnapshotInfo, int]:
    """``header`` of a blob of ``total`` bytes whose parts ``read(start, end)`` gives."""
    start = len(MAGIC) + LENGTH_BYTES
    first = read(0, start)
    if not first.startswith(MAGIC) or len(first) < start:
        raise SnapshotError("these bytes are not a farm session snapshot")
    length = int.from_bytes(first[len(MAGIC) :], "big")
    if length > MAX_HEADER or start + length > total:
        raise SnapshotError("the snapshot is cut short (its header is not whole)")
    try:
        info = SnapshotInfo.model_validate_json(read(start, start + length))
    except ValueError as exc:
        raise SnapshotError(f"the snapshot's header is not valid: {exc}") from None
    if start + length + info.size != total:
        raise SnapshotError(
            f"the snapshot is {total} bytes, its header says {start + length + info.size}"
        )
    return info, start + length


def unpack(blob: bytes) -> tuple[SnapshotInfo, bytes, bytes]:
    """The header, the pickled namespace and the workspace's tar of a blob."""
    info, at = header(blob)
    middle = at + info.namespace_bytes
    return info, blob[at:middle], blob[middle:]


class SnapshotStore(Protocol):
    """Where the farm keeps snapshots: bytes under an id, for a while."""

    def put(self, snapshot_id: str, blob: bytes, ttl_s: float) -> None: ...

    def get(self, snapshot_id: str) -> bytes | None: ...

    def delete(self, snapshot_id: str) -> None: ...

    def info(self, snapshot_id: str) -> SnapshotInfo | None:
        """The header of a kept snapshot, without its bytes."""
        ...


class RedisSnapshotStore:
    """Snapshots in the broker's Redis, each a key that expires ``ttl_s`` after it was kept."""

    def __init__(self, settings: FarmSettings) -> None:
        # Its own client: the registry's decodes every reply as text, a snapshot is bytes.
        self.redis = redis.Redis.from_url(
            settings.redis_url, socket_timeout=120, **(settings.redis_tls or {})
        )

    def put(self, snapshot_id: str, blob: bytes, ttl_s: float) -> None:
        self.redis.set(PREFIX + snapshot_id, blob, px=max(int(ttl_s * 1000), 1))

    def get(self, snapshot_id: str) -> bytes | None:
        found = self.redis.get(PREFIX + snapshot_id)
        return bytes(found) if found is not None else None  # type: ignore[arg-type]

    def delete(self, snapshot_id: str) -> None:
        self.redis.delete(PREFIX + snapshot_id)

    def info(self, snapshot_id: str) -> SnapshotInfo | None:
        key = PREFIX + snapshot_id
        total = int(self.redis.strlen(key))
        if not total:
            return None

        def read(start: int, end: int) -> bytes:
            return bytes(self.redis.getrange(key, start, end - 1))  # type: ignore[arg-type]

        return read_header(read, total)[0]

    def close(self) -> None:
        self.redis.close()
        self.redis.connection_pool.disconnect()


def paused_id(session_id: str) -> str:
    """The id a paused session's snapshot is kept under (its resume finds it by session)."""
    return f"paused-{session_id}"
