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
from farm.kernel.wire.session_frames import MalformedFrame, from_session


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


GOOD_DONE = {
    "type": "cell_done",
    "value": {"text": "1", "data": {"text/plain": "1"}},
    "error": None,
    "duration_s": 0.1,
    "cpu_s": 0.0,
    "max_rss_kb": 10,
}


@pytest.mark.parametrize(
    "frame",
    [
        {**GOOD_DONE, "value": {"text": "1", "data": {}, "more": 1}},
        {**GOOD_DONE, "error": {"ename": "E", "evalue": "", "traceback": []}},
        {**GOOD_DONE, "error": {"ename": "E", "evalue": "", "traceback": [], "kind": "bogus"}},
        {**GOOD_DONE, "cpu_s": "fast"},
        {"type": "display", "value": "text"},
        {"type": "call", "name": "f", "args": {}, "kwargs": {}},
        {"type": "file_done", "error": {"ename": "E"}},
    ],
)
def test_a_session_frame_the_host_would_refuse_is_malformed(frame: dict[str, object]) -> None:
    """What user code could write on its control socket: what the supervisor would pass on to
    the host is checked first (``from_session``); the supervisor then replaces the process."""
    with pytest.raises(MalformedFrame):
        from_session(frame)


def test_the_frames_a_session_sends_pass() -> None:
    error = {"ename": "E", "evalue": "v", "traceback": ["t"], "kind": "user"}
    for frame in (
        GOOD_DONE,
        {**GOOD_DONE, "value": None, "error": error},
        {"type": "ready"},
        {"type": "display", "value": {"text": "x", "data": {}}},
        {"type": "call", "name": "f", "args": [1], "kwargs": {}, "batch": True},
        {"type": "file_done", "result": {"size": 1}},
        {"type": "something-new"},  # unknown: logged and skipped by the supervisor
    ):
        assert from_session(frame) == frame
