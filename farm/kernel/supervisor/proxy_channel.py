"""The host proxy's connection (``egress_attach``): boxes' proxy endpoints are sent on it.

Each endpoint goes as an ``egress_box`` frame with the socket as ancillary data (SCM_RIGHTS);
one proxy is attached at a time, and a box that asks for egress with none attached is refused.
A short write detaches the connection (a torn frame would garble every later one).
"""

from __future__ import annotations

import logging
import os
import socket

from ..wire.framing import encode
from .links import RequestError

log = logging.getLogger("farm.kernel")


class ProxyChannel:
    """The connection the host's proxy attached (``egress_attach``): each box's endpoint goes
    to it as a frame (``egress_box``: session id, port) with the socket as ancillary data. One
    proxy at a time; a box asking for egress with none attached is refused."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None

    def attach(self, sock: socket.socket) -> None:
        if sock.family != socket.AF_UNIX:
            raise RequestError("bad_request", "egress needs a Unix socket connection (fds)")
        if self.sock is not None:
            log.warning("an egress proxy attached in place of the one attached before")
        self.detach()
        self.sock = socket.socket(fileno=os.dup(sock.fileno()))

    def detach(self, sock: socket.socket | None = None) -> None:
        """Forget the attached connection (only if it is ``sock``'s, when given)."""
        mine = self.sock
        if mine is None or (sock is not None and not _same(mine, sock)):
            return
        self.sock = None
        mine.close()

    def hand_over(self, session_id: str, port: int, endpoint: socket.socket) -> None:
        if self.sock is None:
            raise RequestError("unavailable", "no egress proxy is attached to this kernel")
        frame = encode({"type": "egress_box", "session_id": session_id, "port": port})
        try:
            sent = socket.send_fds(self.sock, [frame], [endpoint.fileno()])
        except OSError as exc:
            sent, why = -1, str(exc)
        if sent != len(frame):  # a torn frame would garble every later one: let it go
            self.detach()
            why = why if sent < 0 else "the proxy is not reading"
            raise RequestError("unavailable", f"the egress proxy took no endpoint: {why}")


def _same(a: socket.socket, b: socket.socket) -> bool:
    """Two fds of one socket (the attached copy and its connection's own)."""
    try:
        return os.fstat(a.fileno()).st_ino == os.fstat(b.fileno()).st_ino
    except (OSError, ValueError):  # its connection's fd is closed already: not knowable
        return False
