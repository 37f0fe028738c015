"""Length-prefixed JSON frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

A frame is complete only when all its bytes arrived, however the stream splits them, so
large payloads with newlines (the reference server's failure) or many frames in one read are
both fine. Every read is bounded by ``max_frame`` *before* allocating, so a hostile 4 GB length
prefix costs nothing.
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


def encode(message: Mapping[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"frame is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise FrameError("frame must be a JSON object with a string 'type'")
    return message


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
    return decode_body(body)


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
        return decode_body(body), fds
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
    except asyncio.IncompleteReadError:
        raise FrameError("connection closed in the middle of a frame") from None
    return decode_body(body)
