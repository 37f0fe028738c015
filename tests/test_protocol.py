"""One protocol: the kernel's ``TypedDict``s (``farm.kernel.wire.protocol``) are what the host
checks frames with (``farm.models.frames``). What a real kernel sends passes that check, and a
frame with a field missing, unknown or of the wrong type is refused."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Literal, get_type_hints

import pytest
from pydantic import ValidationError

from farm import kernel, models
from farm.kernel.wire import auth, protocol
from farm.kernel.wire.client import KernelClient, KernelProtocolError, KernelRequestError
from farm.kernel.wire.framing import recv_frame, send_frame
from farm.models import frames

PONG = {  # a pong as the protocol has it (``protocol.Pong``)
    "type": "pong",
    "version": "0",
    "python": "3.11",
    "pid": 1,
    "sessions": 0,
    "max_sessions": 1,
    "uptime_s": 0.0,
    "grace_s": 2.0,
    "max_frame": 1 << 20,
    "isolation": "namespaces",
    "isolation_fallback": None,
    "box_limits": {},
    "opens": 0,
    "spare_opens": 0,
    "spares": 0,
    "quarantined": 0,
    "capacity": {
        "boxes": 1,
        "free": 1,
        "binding": "sessions",
        "admitted": 0,
        "waiting": 0,
        "ending": 0,
        "refused": 0,
    },
    "preload": {"modules": [], "failed": {}, "seconds": 0.0},
}


def test_every_frame_is_named_by_its_type() -> None:
    for name, frame in protocol.HOST_FRAMES.items():
        assert get_type_hints(frame)["type"] == Literal[name]  # type: ignore[valid-type]
        frames.adapter(frame)  # pydantic can read it


def test_cell_results_and_exec_results_have_the_same_fields() -> None:
    host_only = models.ExecResult.HOST_FIELDS
    names = set(models.ExecResult.model_fields) - host_only
    assert set(get_type_hints(protocol.CellResult)) == names


def test_error_kinds_are_written_once_in_the_kernel() -> None:
    assert [kind.value for kind in models.ErrorKind] == list(kernel.KINDS)


def test_what_a_real_kernel_sends_validates_on_the_host(client: KernelClient) -> None:
    pong = frames.validate(client.ping())
    assert pong["max_frame"] > 0
    opened = frames.validate(client.request({"type": "open_session"}))
    message = {
        "type": "execute",
        "session_id": opened["session_id"],
        "epoch": opened["epoch"],
        "code": "print(1)\ndisplay(2)\nimport time; time.sleep(0.2)\nraise ValueError('v')",
        "timeout_s": 5.0,
        "exec_id": "e1",
        "events": True,
    }
    frames.validate(message)
    events: list[dict[str, Any]] = []
    reply = frames.validate(client.request(message, 30, lambda frame: events.append(frame)))
    assert reply["result"]["error"] is not None and reply["result"]["error"]["kind"] == "user"
    kinds = [frames.validate(frame)["event"]["type"] for frame in events]
    assert {"started", "running", "stream", "display"} <= set(kinds)
    command = {"type": "command", "session_id": opened["session_id"], "exec_id": "c1"}
    ran = client.request({**command, "argv": ["echo", "hi"], "timeout_s": 5.0})
    assert frames.validate(ran)["result"]["stdout"] == "hi\n"
    read = {"type": "file", "session_id": opened["session_id"], "op": "stat", "path": "none"}
    assert frames.validate(client.request(read))["error"] is not None
    closed = client.request({"type": "close_session", "session_id": opened["session_id"]})
    frames.validate(closed)
    with pytest.raises(KernelRequestError) as refused:
        client.request({"type": "close_session", "session_id": "missing"})
    frames.validate({"type": "error", "code": refused.value.code, "message": str(refused.value)})


def test_a_real_items_outcome_becomes_public_results(client: KernelClient) -> None:
    reply = client.item("p-1", ["6 * 7"], timeout_s=10, argv=["true"], files={"a": b"x"})
    frames.adapter(protocol.ItemOutcome).validate_python(reply)
    done = frames.ItemResults.from_kernel(reply, "w1", 10)
    assert [(c.worker, c.value and c.value.text) for c in done.cells] == [("w1", "42")]
    assert done.command is not None and done.command.ok and done.command.worker == "w1"
    assert done.file_error is None and done.judge is None


def test_a_malformed_frame_is_refused(client: KernelClient) -> None:
    pong = frames.validate(client.ping())
    malformed = [
        {**pong, "pid": str(pong["pid"])},  # a type changed
        {**pong, "surprise": 1},  # a field the protocol does not know
        {k: v for k, v in pong.items() if k != "version"},  # a required field left out
        {**pong, "isolation": "vm"},  # a value outside its Literal
        {**pong, "box_limits": {"memory_mb": "lots"}},  # at depth
    ]
    for frame in malformed:
        with pytest.raises(ValidationError):
            frames.validate(frame)
    with pytest.raises(ValueError, match="not a frame"):
        frames.validate({**pong, "type": "pongg"})


def test_an_items_cell_with_an_unknown_kind_is_refused(client: KernelClient) -> None:
    reply = client.item("p-2", ["1 / 0"], timeout_s=10)
    cell = reply["cells"][0]
    bad = {**reply, "cells": [{**cell, "error": {**cell["error"], "kind": "bogus"}}]}
    with pytest.raises(ValidationError):
        frames.ItemResults.from_kernel(bad, "w1", 10)


def test_the_hosts_client_refuses_a_frame_outside_the_protocol(tmp_path: Path) -> None:
    """A peer that holds the token and answers ``ping`` with a pong of one field too many (a
    kernel that drifted): the host's client (``check=frames.validate``, as every sandbox's
    ``kernel()`` makes it) raises ``KernelProtocolError`` and drops the connection."""
    frames.validate(PONG)  # one field more is all that is wrong with what the peer sends
    token = auth.new_token()
    address = str(tmp_path / "drifted.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)
    listener.settimeout(30)

    def drifted_kernel() -> None:
        conn, _ = listener.accept()
        with conn:
            nonce = auth.new_nonce()
            send_frame(conn, {"type": "hello", "kernel": "farm", "version": "0", "nonce": nonce})
            answer = recv_frame(conn, 4096)
            assert answer is not None
            proof = auth.mac(token, "server", nonce, answer["nonce"])
            send_frame(conn, {"type": "welcome", "mac": proof, "version": "0"})
            assert recv_frame(conn, 4096) == {"type": "ping"}
            send_frame(conn, {**PONG, "surprise": 1})
            recv_frame(conn, 4096)  # until the client hangs up

    peer = threading.Thread(target=drifted_kernel)
    peer.start()
    try:
        client = KernelClient.at(address, token, check=frames.validate)
        with pytest.raises(KernelProtocolError, match="outside the protocol"):
            client.ping()
        assert client._sock is None  # closed: nothing more is read from that peer
    finally:
        peer.join(30)
        listener.close()
    assert not peer.is_alive()
