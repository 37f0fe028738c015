"""The byte channel: a frame's ``blob`` crosses every hop raw (``framing``), file chunks cross
Redis as parcels (``farm.stores.parcels``), and neither lets a peer send past its limits: an
oversized or malformed blob is a clear error, and the kernel and the farm keep serving."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from farm.celeryconf import TASK_FILE
from farm.client import Farm, Session
from farm.client.broker import Watch
from farm.errors import FileOperationError
from farm.kernel.wire.client import KernelClient, KernelRequestError
from farm.kernel.wire.framing import (
    HEADER,
    FrameError,
    FrameTooLarge,
    discard,
    encode,
    read_frame,
    recv_frame,
    recv_frame_fds,
    send_frame,
)
from farm.kernel.wire.protocol import FILE_CHUNK
from farm.models import FileRequest, frames
from farm.sandbox.process import ProcessSandbox
from farm.stores.parcels import PREFIX, Parcels

EVERY_BYTE = bytes(range(256)) * 4096  # 1 MiB with every byte value, newlines and NULs too
SENT = [("x", EVERY_BYTE), ("y", b"")]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    yield a, b
    a.close()
    b.close()


def _raw(message: dict[str, object]) -> bytes:
    """A frame's header and JSON as a peer could write them by hand (its ``blob`` says what
    it likes, and nothing follows)."""
    body = json.dumps(message).encode()
    return HEADER.pack(len(body)) + body


def test_a_blob_crosses_raw_and_whole(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = encode({"type": "file", "path": "x", "blob": EVERY_BYTE})
    assert frame.endswith(EVERY_BYTE) and len(frame) < len(EVERY_BYTE) + 100  # no base64
    sender = threading.Thread(  # a socket pair's buffer holds less than the frame
        target=lambda: [send_frame(a, {"type": "file", "path": p, "blob": d}) for p, d in SENT]
    )
    sender.start()
    assert [recv_frame(b), recv_frame(b)] == [
        {"type": "file", "path": p, "blob": d} for p, d in SENT
    ]
    sender.join(10)

    async def read_two() -> list[object]:
        reader = asyncio.StreamReader()
        reader.feed_data(frame + encode({"type": "ack"}))
        reader.feed_eof()
        return [await read_frame(reader), await read_frame(reader), await read_frame(reader)]

    got = asyncio.run(read_two())
    assert got == [{"type": "file", "path": "x", "blob": EVERY_BYTE}, {"type": "ack"}, None]


def test_a_blob_past_the_limit_is_refused_unread_and_can_be_skipped(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(_raw({"type": "file", "blob": 1 << 40}))  # 1 TiB announced, nothing sent
    with pytest.raises(FrameTooLarge) as refused:
        recv_frame(b, max_frame=1 << 20)
    assert refused.value.length == 1 << 40 and "exceeds the limit" in str(refused.value)

    async def skip_then_read() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(encode({"type": "file", "blob": b"x" * 5000}) + encode({"type": "ping"}))
        reader.feed_eof()
        with pytest.raises(FrameTooLarge) as too_large:
            await read_frame(reader, max_frame=1000)
        await discard(reader, too_large.value.length)  # what the kernel's server does
        return await read_frame(reader, max_frame=1000)

    assert asyncio.run(skip_then_read()) == {"type": "ping"}


@pytest.mark.parametrize("blob", ['"many"', "-1", "true", "1.5"])
def test_a_blob_that_is_not_a_count_is_a_frame_error(
    pair: tuple[socket.socket, socket.socket], blob: str
) -> None:
    a, b = pair
    body = f'{{"type": "file", "blob": {blob}}}'.encode()
    a.sendall(HEADER.pack(len(body)) + body)
    with pytest.raises(FrameError, match="byte count"):
        recv_frame(b)


def test_a_frame_with_fds_carries_no_blob(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(encode({"type": "egress_box", "blob": b"abc"}))
    with pytest.raises(FrameError, match="no blob"):
        recv_frame_fds(b)
    with pytest.raises(TypeError):
        encode({"type": "file", "blob": "text is not bytes"})


def test_file_chunks_cross_the_kernel_raw(client: KernelClient) -> None:
    opened = client.open_session()
    session = opened["session_id"]
    try:
        written = client.file(session, "write", "bytes.bin", blob=EVERY_BYTE, offset=0)
        assert written["error"] is None and written["result"]["size"] == len(EVERY_BYTE)
        more = client.file(session, "write", "bytes.bin", blob=b"tail", offset=len(EVERY_BYTE))
        assert more["result"]["size"] == len(EVERY_BYTE) + 4
        read = client.file(session, "read", "bytes.bin", offset=0, length=len(EVERY_BYTE))
        frames.validate(read)  # the host's check of the one protocol passes a blob
        assert read["blob"] == EVERY_BYTE and read["result"] == {
            "size": len(EVERY_BYTE) + 4,
            "eof": False,
        }
        last = client.file(session, "read", "bytes.bin", offset=len(EVERY_BYTE))
        assert (last["blob"], last["result"]["eof"]) == (b"tail", True)
        over = client.file(session, "write", "big.bin", blob=b"\0" * (FILE_CHUNK + 1))
        assert over["error"] is not None and "send smaller ones" in over["error"]["evalue"]
        outside = client.file(session, "write", "../escape.bin", blob=b"x")
        assert outside["error"] is not None and outside["error"]["ename"] == "WorkspaceError"
    finally:
        client.close_session(session)


def test_a_blob_past_the_kernels_frame_is_refused_and_the_connection_lives(
    client: KernelClient,
) -> None:
    limit = client.ping()["max_frame"]
    opened = client.open_session()
    try:
        with pytest.raises(KernelRequestError) as refused:
            client.file(opened["session_id"], "write", "f", blob=b"\0" * (limit + 1))
        assert refused.value.code == "too_large"  # its body skipped, unread into memory
        assert client.ping()["type"] == "pong"
    finally:
        client.close_session(opened["session_id"])


# The session's own code replaces the function its loop answers with: its next file_done is a
# forged header announcing a blob it never sends (or one that is no byte count).
FORGE = (
    "import json, struct, sys\n"
    "loop = next(m for n, m in sys.modules.items() if n.endswith('repl.session_loop'))\n"
    "def forged(sock, frame, _real=loop.send_frame):\n"
    "    if frame.get('type') != 'file_done':\n"
    "        return _real(sock, frame)\n"
    "    body = json.dumps({'type': 'file_done', 'result': {}, 'blob': BLOB}).encode()\n"
    "    sock.sendall(struct.pack('>I', len(body)) + body)\n"
    "loop.send_frame = forged\n"
    "secret = 42\n"
)


@pytest.mark.parametrize("blob", ["1 << 40", "'many'"])
def test_a_forged_blob_from_the_box_is_named_and_the_kernel_serves_on(
    kernel: ProcessSandbox, blob: str
) -> None:
    with kernel.kernel() as client:
        victim = client.open_session()
        other = client.open_session()
        session, epoch = victim["session_id"], victim["epoch"]
        done = client.execute(session, FORGE.replace("BLOB", blob), epoch=epoch, timeout_s=10)
        assert done["status"] == "ok", done
        with pytest.raises(KernelRequestError) as refused:
            client.file(session, "read", "anything")
        assert refused.value.code == "unavailable" and "replaced" in str(refused.value)
        assert "exceeds the limit" in str(refused.value) or "byte count" in str(refused.value)
        lost = client.execute(session, "secret", epoch=epoch, timeout_s=10)
        assert lost["status"] != "ok" and lost["state_lost"]  # told, never a silent reset
        fresh = client.execute(session, "'serving'", epoch=lost["epoch"], timeout_s=10)
        assert fresh["status"] == "ok"
        ok = client.file(other["session_id"], "write", "f", blob=b"still here")
        assert ok["error"] is None and client.ping()["sessions"] == 2


def _parcels(farm: Farm) -> list[bytes]:
    keys = redis.Redis.from_url(farm.settings.redis_url).keys(PREFIX + "*")
    return list(keys)  # type: ignore[arg-type]


def test_session_files_move_raw_through_redis_and_leave_nothing(inproc_farm: Farm) -> None:
    data = os.urandom(2 * FILE_CHUNK + 12345)  # three chunks, the last a short one
    with inproc_farm.session() as s:
        assert s.files.write("sub/big.bin", data) == len(data)
        assert s.files.read("sub/big.bin") == data
        assert b"".join(s.files.read_chunks("sub/big.bin")) == data
        assert s.files.write_part("part.bin", data[:100], 0) == 100
        assert s.files.read("part.bin") == data[:100]
        with pytest.raises(FileOperationError) as refused:
            s.files.read("sub/big.bin", max_bytes=1000)
        assert refused.value.ename == "FileTooLarge"
        assert _parcels(inproc_farm) == []  # every parcel taken or dropped
        assert s.run("len(open('sub/big.bin', 'rb').read())").value.text == str(len(data))


def _write_naming(farm: Farm, s: Session, parcel: str) -> dict[str, Any]:
    request = FileRequest(
        op="write", path="f", offset=0, parcel=parcel, session_id=s.id, generation=s.generation
    )
    pending = farm.app.send_task(TASK_FILE, args=[request.model_dump(mode="json")], queue=s.queue)
    reply: dict[str, Any] = farm.broker.wait(
        pending, time.monotonic() + 60, Watch(worker=(s.worker, s.generation))
    )
    return reply


def test_a_write_whose_parcel_is_gone_or_too_big_is_a_clear_error(inproc_farm: Farm) -> None:
    parcels = Parcels(redis.Redis.from_url(inproc_farm.settings.redis_url))
    with inproc_farm.session() as s:
        gone = _write_naming(inproc_farm, s, "0" * 32)  # never put
        assert gone["error"]["ename"] == "ParcelLost" and "expired" in gone["error"]["evalue"]
        big = parcels.put(b"\0" * (FILE_CHUNK + 1))
        over = _write_naming(inproc_farm, s, big)
        assert over["error"]["ename"] == "ParcelTooLarge", over
        parcels.drop(big)
        with pytest.raises(FileOperationError):
            s.files.read("f")  # nothing was written
        assert s.run("'serving'").ok
