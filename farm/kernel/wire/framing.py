"""Length-prefixed JSON frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON,
then, when the JSON says ``"blob": n``, n raw bytes (the frame's ``blob``, as ``bytes``).

A frame is complete only when all its bytes arrived, however the stream splits them, so
large payloads with newlines (the reference server's failure) or many frames in one read are
both fine. Every read is bounded by ``max_frame`` *before* allocating (the JSON and its blob
together), so a hostile 4 GB length prefix costs nothing. Bytes ride in ``blob``, never as
base64 in the JSON: docs/design/kernel.md "The byte channel".
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 64 * 1024 * 1024  # a result with two 16 MiB outputs, a 32 MiB stdin


class FrameError(Exception):
    """The peer sent something that is not a valid frame; the connection must be closed."""


class FrameTooLarge(FrameError):
    """A length prefix over the limit. Its body has not been read: a trusted peer's stream can
    be kept by discarding ``length`` bytes (``discard``); anyone else's is closed."""

    def __init__(self, length: int, max_frame: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds the limit of {max_frame} bytes")
        self.length = length
        self.max_frame = max_frame


BLOB = "blob"  # the one field whose bytes follow the JSON raw


def encode(message: Mapping[str, Any]) -> bytes:
    blob = message.get(BLOB)
    if blob is None:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return HEADER.pack(len(body)) + body
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"a frame's {BLOB!r} must be bytes, not {type(blob).__name__}")
    head = {**message, BLOB: len(blob)}
    body = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return b"".join((HEADER.pack(len(body)), body, blob))


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"frame is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise FrameError("frame must be a JSON object with a string 'type'")
    return message


def blob_length(message: dict[str, Any], length: int, max_frame: int) -> int:
    """How many raw bytes follow a frame whose JSON was ``length`` bytes (0: none); a blob
    that is not a count is refused, one that takes the frame past ``max_frame`` too, unread
    (``FrameTooLarge`` then counts the blob's bytes alone: what is left to ``discard``)."""
    if BLOB not in message:
        return 0
    size = message[BLOB]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FrameError(f"a frame's {BLOB!r} must be a byte count")
    if length + size > max_frame:
        raise FrameTooLarge(size, max(max_frame - length, 0))
    return size


def check_length(length: int, max_frame: int) -> None:
    if length > max_frame:
        raise FrameTooLarge(length, max_frame)


async def discard(reader: asyncio.StreamReader, length: int, chunk: int = 1 << 20) -> None:
    """Read and drop ``length`` bytes (an oversized frame's body), in bounded chunks."""
    while length > 0:
        got = await reader.read(min(chunk, length))
        if not got:
            raise FrameError("connection closed in the middle of a frame")
        length -= len(got)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return None
            raise FrameError("connection closed in the middle of a frame")
        got += n
    return bytes(buf)


def recv_frame(sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME) -> dict[str, Any] | None:
    """Read one frame from a blocking socket; ``None`` on a clean end of stream."""
    header = _recv_exactly(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    check_length(length, max_frame)
    body = _recv_exactly(sock, length)
    if body is None:
        raise FrameError("connection closed in the middle of a frame")
    message = decode_body(body)
    size = blob_length(message, length, max_frame)
    if size:
        blob = _recv_exactly(sock, size)
        if blob is None:
            raise FrameError("connection closed in the middle of a frame")
        message[BLOB] = blob
    elif BLOB in message:
        message[BLOB] = b""
    return message


def recv_frame_fds(
    sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME
) -> tuple[dict[str, Any], list[int]] | None:
    """Read one frame from a blocking Unix socket with the fds sent along with its first byte
    (``socket.send_fds``); ``None`` on a clean end of stream. The caller owns the fds."""
    first, fds, _, _ = socket.recv_fds(sock, HEADER.size, 4)
    try:
        if not first:
            if fds:
                raise FrameError("fds without a frame")
            return None
        header = first + (_recv_exactly(sock, HEADER.size - len(first)) or b"")
        if len(header) < HEADER.size:
            raise FrameError("connection closed in the middle of a frame")
        (length,) = HEADER.unpack(header)
        check_length(length, max_frame)
        body = _recv_exactly(sock, length)
        if body is None:
            raise FrameError("connection closed in the middle of a frame")
        message = decode_body(body)
        if BLOB in message:
            raise FrameError("a frame with fds carries no blob")
        return message, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def send_frame(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall(encode(message))


async def read_frame(
    reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME
) -> dict[str, Any] | None:
    """Read one frame from an asyncio stream; ``None`` on a clean end of stream."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("connection closed in the middle of a frame") from None
    (length,) = HEADER.unpack(header)
    check_length(length, max_frame)
    try:
        body = await reader.readexactly(length)
        message = decode_body(body)
        size = blob_length(message, length, max_frame)
        if BLOB in message:
            message[BLOB] = await reader.readexactly(size) if size else b""
    except asyncio.IncompleteReadError:
        raise FrameError("connection closed in the middle of a frame") from None
    return message
