"""The wire: framing, authentication, abuse, and the kernel/model schema agreement."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from farm.kernel.wire import auth, framing
from farm.kernel.wire.client import (
    KernelAuthError,
    KernelClient,
    connect_socket,
)
from farm.sandbox.process import ProcessSandbox
from tests.raw_sockets import authed, raw


def closed_after(sock: socket.socket) -> bool:
    sock.settimeout(5.0)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.fixture
def sandbox(shared_kernel: ProcessSandbox) -> Iterator[ProcessSandbox]:
    yield shared_kernel
    with shared_kernel.kernel() as client:  # whatever the test did, the kernel still serves
        assert client.ping()["type"] == "pong"


def test_wrong_token_is_refused_and_can_run_nothing(sandbox: ProcessSandbox) -> None:
    with pytest.raises(KernelAuthError):
        KernelClient.at(sandbox.address, "f" * 64).connect()
    sock, _ = raw(sandbox)
    framing.send_frame(sock, {"type": "open_session"})  # skipping the handshake
    reply = framing.recv_frame(sock)
    assert reply is not None and reply["code"] == "auth_failed"
    assert closed_after(sock)


def test_a_replayed_handshake_is_refused(sandbox: ProcessSandbox) -> None:
    first, first_nonce = raw(sandbox)
    nonce = auth.new_nonce()
    recorded = {
        "type": "auth",
        "nonce": nonce,
        "mac": auth.mac(sandbox.token, "client", first_nonce, nonce),
    }
    framing.send_frame(first, recorded)
    assert framing.recv_frame(first)["type"] == "welcome"  # type: ignore[index]
    replay, _ = raw(sandbox)
    framing.send_frame(replay, recorded)
    reply = framing.recv_frame(replay)
    assert reply is not None and reply["code"] == "auth_failed"
    first.close()


def test_the_client_detects_a_server_without_the_token(sandbox: ProcessSandbox) -> None:
    impostor = socket.create_server(("127.0.0.1", 0))
    port = impostor.getsockname()[1]
    import threading

    def serve() -> None:
        conn, _ = impostor.accept()
        framing.send_frame(
            conn, {"type": "hello", "kernel": "farm", "version": "x", "nonce": auth.new_nonce()}
        )
        framing.recv_frame(conn)
        framing.send_frame(conn, {"type": "welcome", "mac": "0" * 64, "version": "x"})
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    with pytest.raises(KernelAuthError):
        KernelClient("127.0.0.1", port, sandbox.token).connect()
    thread.join()
    impostor.close()


def test_frames_split_byte_by_byte_and_batched_both_work(sandbox: ProcessSandbox) -> None:
    sock = authed(sandbox)
    data = framing.encode({"type": "ping"})
    for byte in data:
        sock.send(bytes([byte]))
        time.sleep(0.001)
    assert framing.recv_frame(sock)["type"] == "pong"  # type: ignore[index]
    sock.sendall(data * 5)
    assert [framing.recv_frame(sock)["type"] for _ in range(5)] == ["pong"] * 5  # type: ignore[index]
    sock.close()


def test_a_large_payload_with_newlines_round_trips(cells: object) -> None:
    from tests.conftest import Cells

    assert isinstance(cells, Cells)
    text = "line\n" * 200_000
    cells.run(f"big = {text!r}")
    assert cells.value("len(big)") == str(len(text))


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">I", 0xFFFFFFFF),  # a 4 GB length prefix
        struct.pack(">I", 5) + b"\xff\xfe\x00\x01\x02",  # not UTF-8
        struct.pack(">I", 5) + b"nope!",  # not JSON
        framing.encode({"no": "type"}),  # JSON without a type
        framing.encode({"type": "format_disk"}),  # unknown type
        framing.encode({"type": "execute", "session_id": 3}),  # a malformed request
    ],
    ids=["4GB-length", "bad-utf8", "not-json", "no-type", "unknown-type", "bad-request"],
)
def test_malformed_input_gets_an_error_and_a_closed_connection(
    sandbox: ProcessSandbox, payload: bytes
) -> None:
    sock = authed(sandbox)
    sock.sendall(payload)
    reply = framing.recv_frame(sock)
    assert reply is not None and reply["type"] == "error"
    assert reply["code"] in {"bad_frame", "unknown_type", "bad_request"}
    assert closed_after(sock)


@pytest.mark.slow
def test_an_idle_unauthenticated_connection_is_dropped(kernel: ProcessSandbox) -> None:
    sock, _ = raw(kernel)
    t0 = time.monotonic()
    sock.settimeout(20)
    assert sock.recv(100) == b""
    assert time.monotonic() - t0 < 15


def test_hundreds_of_idle_connections_do_not_stop_service(kernel: ProcessSandbox) -> None:
    idle = [connect_socket(kernel.address, 5.0) for _ in range(300)]
    try:
        with kernel.kernel() as client:
            session = client.open_session()
            result = client.execute(session["session_id"], "6 * 7", epoch=1, timeout_s=10)
            assert result["value"]["text"] == "42"
    finally:
        for sock in idle:
            sock.close()


def test_the_token_is_invisible_to_user_code(kernel: ProcessSandbox, client: object) -> None:
    with kernel.kernel() as c:
        session = c.open_session()
        code = (
            "import os, glob\n"
            "found = [os.environ.get('FARM_KERNEL_TOKEN')]\n"
            "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
            "    try:\n        found.append(open(path, 'rb').read().decode('latin-1'))\n"
            "    except OSError:\n        pass\n"
            "'\\n'.join(str(f) for f in found)"
        )
        result = c.execute(session["session_id"], code, epoch=1, timeout_s=20)
    assert result["status"] == "ok"
    assert kernel.token not in json.dumps(result)
    assert kernel.token not in result["value"]["data"]["text/plain"]
