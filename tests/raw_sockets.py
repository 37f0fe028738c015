"""Bare sockets for tests that speak a protocol by hand, below farm's clients: the kernel's
(a connection that got its hello, one that also authenticated) and Redis' (a PING sent without
credentials, as any process on the host could). Kernel sockets opened here are closed after
each test (``close_opened``, run by an autouse fixture in ``conftest.py``)."""

from __future__ import annotations

import socket
from typing import Any

from farm.kernel.wire import auth, framing
from farm.kernel.wire.client import connect_socket

_OPEN: list[socket.socket] = []


def close_opened() -> None:
    """Close every socket ``raw`` opened."""
    while _OPEN:
        _OPEN.pop().close()


def raw(sandbox: Any, timeout_s: float = 10.0) -> tuple[socket.socket, str]:
    """A socket connected to ``sandbox``'s kernel that received its hello; returns it with the
    server nonce."""
    sock = connect_socket(sandbox.address, timeout_s)
    _OPEN.append(sock)
    hello = framing.recv_frame(sock, 4096)
    assert hello is not None and hello["type"] == "hello"
    return sock, str(hello["nonce"])


def auth_frame(token: str, server_nonce: str) -> dict[str, str]:
    """A client's auth frame answering ``server_nonce`` with ``token``."""
    nonce = auth.new_nonce()
    return {"type": "auth", "nonce": nonce, "mac": auth.mac(token, "client", server_nonce, nonce)}


def authed(sandbox: Any) -> socket.socket:
    """A socket that passed the kernel's handshake (its welcome received)."""
    sock, server_nonce = raw(sandbox)
    framing.send_frame(sock, auth_frame(sandbox.token, server_nonce))
    welcome = framing.recv_frame(sock, 4096)
    assert welcome is not None and welcome["type"] == "welcome"
    return sock


def raw_ping(port: int) -> bytes:
    """A PING on a bare TCP connection to 127.0.0.1:``port``: its reply, or nothing when the
    server hangs up (as a TLS-only port does)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        try:
            return conn.recv(256)
        except ConnectionResetError:
            return b""
