"""The supervisor <-> zygote datagrams (``box_protocol``), over a real SOCK_SEQPACKET pair: a
request of any size arrives whole (past one datagram it travels in a memfd), the end of the
supervisor is ``None``, and a datagram the zygote cannot read is refused without harm."""

from __future__ import annotations

import socket

import pytest

from farm.kernel.boxes.box_protocol import (
    INLINE_MAX,
    BoxInfo,
    StartCommand,
    UnreadableRequest,
    read_request,
    refusal,
    send_request,
)


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


BOX: BoxInfo = {
    "number": 3,
    "uid": 20003,
    "gid": 20003,
    "workspace": "/workspace",
    "tmp": "/tmp",
    "limits": {"pids": 64},
    "env": {},
}


def command(argv: list[str]) -> StartCommand:
    return {
        "op": "command",
        "box": BOX,
        "argv": argv,
        "cwd": None,
        "env": None,
        "stdin_path": None,
        "judge": None,
    }


@pytest.mark.parametrize("size", [10, INLINE_MAX * 4])
def test_a_request_of_any_size_arrives_whole(size: int) -> None:
    supervisor, zygote = pair()
    with supervisor, zygote:
        sent = command(["echo", "x" * size])
        send_request(supervisor, sent)
        assert read_request(zygote) == sent


def test_the_supervisors_end_reads_as_none() -> None:
    supervisor, zygote = pair()
    with zygote:
        supervisor.close()
        assert read_request(zygote) is None


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b"x" * (INLINE_MAX * 4)])
def test_a_datagram_the_zygote_cannot_read_is_refused(data: bytes) -> None:
    supervisor, zygote = pair()
    with supervisor, zygote:
        supervisor.send(data)
        with pytest.raises(UnreadableRequest):
            read_request(zygote)
        send_request(supervisor, {"op": "listen", "id": 7})  # and the next one is read
        assert read_request(zygote) == {"op": "listen", "id": 7}


def test_a_refused_request_is_answered_as_its_op_expects() -> None:
    assert refusal({"op": "recycle", "id": 4, "box": BOX}, "no pids") == {
        "op": "reset_done",
        "id": 4,
        "ok": False,
    }
    assert refusal({"op": "listen", "id": 5}, "no pids") == {
        "op": "listening",
        "id": 5,
        "error": "no pids",
    }
    assert refusal(command(["true"]), "no pids") == {"op": "spawned", "pid": -1, "error": "no pids"}
