"""``session.files``: put files into a session's box and get them back, of any size.

Each operation is done by the session's own process, as its box's uid, between its cells
(``farm.kernel.tools.fileops``), in chunks of ``CHUNK`` bytes that travel raw (parcels in
Redis, blobs in the kernel's frames: never base64, never one oversized message).
``scope="workspace"`` (``session.files``) confines every path to the session's workspace,
symlinks included; ``scope="box"`` (integrations that need ``/tmp`` and absolute paths, like
the Inspect provider) lets the OS decide, which refuses another session's files all the same.
Refusals raise ``FileOperationError`` with the errno and the path.
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FileOperationError
from farm.kernel.wire.protocol import FILE_CHUNK
from farm.models import FileOperation
from farm.models.worker_requests import FileScope

if TYPE_CHECKING:
    from farm.client.exec_call import FileChannel
    from farm.kernel.wire.protocol import FileOp

CHUNK = FILE_CHUNK


class SessionFiles:
    """``session.files``: the session's workspace (``/workspace/box-N`` in a docker sandbox)."""

    def __init__(self, session: FileChannel, scope: FileScope = "workspace") -> None:
        self.session = session
        self.scope = scope

    def _op(self, op: FileOp, path: str, blob: bytes | None = None, **fields: Any) -> Any:
        """The operation's result; a read's gets its bytes as ``data``."""
        operation = FileOperation(op=op, path=str(path), scope=self.scope, **fields)
        reply = self.session.file_operation(operation, blob)
        error = reply.get("error")
        if error:
            raise FileOperationError(
                f"{op} {path!r}: {error['ename']}: {error['evalue']}",
                errno=int(error.get("errno") or 0),
                path=str(path),
                ename=str(error["ename"]),
            )
        if "blob" in reply:
            return {**reply["result"], "data": reply["blob"]}
        return reply.get("result")

    def write(self, path: str, data: bytes | str) -> int:
        """Create or replace ``path`` (and its parent directories) with ``data``."""
        raw = data.encode() if isinstance(data, str) else data
        size = 0
        for offset in range(0, max(len(raw), 1), CHUNK):
            chunk = raw[offset : offset + CHUNK]
            size = int(self._op("write", path, chunk, offset=offset)["size"])
        return size

    def write_part(self, path: str, data: bytes, offset: int) -> int:
        """Write one piece (at most ``CHUNK`` bytes) of a file at ``offset``; offset 0 creates or
        truncates it. A stream of any size is written piece by piece this way (the HTTP API's
        PUT) without ever holding the whole file; returns the file's size so far."""
        return int(self._op("write", path, data, offset=offset)["size"])

    def read_chunks(self, path: str) -> Iterator[bytes]:
        """The file's bytes, ``CHUNK`` at a time (the first read is checked before any yield, so
        a missing file raises ``FileOperationError`` before anything is sent on)."""
        reply = self._op("read", path, offset=0, length=CHUNK)
        return self._chunks(path, reply)

    def _chunks(self, path: str, reply: dict[str, Any]) -> Iterator[bytes]:
        offset = 0
        while True:
            data: bytes = reply["data"]
            offset += len(data)
            if data:
                yield data
            if reply["eof"] or not data:
                return
            reply = self._op("read", path, offset=offset, length=CHUNK)

    def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The file's bytes; over ``max_bytes`` raises ``FileOperationError`` before any
        more of it travels."""
        parts: list[bytes] = []
        offset = 0
        while True:
            reply = self._op("read", path, offset=offset, length=CHUNK)
            if max_bytes is not None and reply["size"] > max_bytes:
                raise FileOperationError(
                    f"read {path!r}: {reply['size']} bytes is over the limit of {max_bytes}",
                    errno=27,  # EFBIG
                    path=str(path),
                    ename="FileTooLarge",
                )
            parts.append(reply["data"])
            offset += len(parts[-1])
            if reply["eof"] or not parts[-1]:
                return b"".join(parts)

    def stat(self, path: str) -> dict[str, Any]:
        """``{"path", "type": "file"|"dir"|"link", "size", "mode"}``."""
        result: dict[str, Any] = self._op("stat", path)
        return result

    def list(self, path: str = ".") -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self._op("list", path)
        return entries

    def remove(self, path: str) -> None:
        self._op("remove", path)

    def upload(self, source: str | os.PathLike[str], dest: str = ".") -> int:
        """Upload a local directory (or a .tar/.tar.gz file) into the workspace."""
        source = Path(source)
        if source.is_dir():
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                tar.add(source, arcname=".")
            blob = buffer.getvalue()
        else:
            blob = source.read_bytes()
        staged = f".farm-upload-{uuid.uuid4().hex}.tar"
        SessionFiles(self.session).write(staged, blob)
        return int(self._op("extract", dest, source=staged)["files"])
