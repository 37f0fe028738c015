"""A box's way out: its proxy endpoint and the environment that names it.

The endpoint is a socket listening on the box's own loopback, made by the box's pid 1 (so it
lives in the box's network namespace) and handed to the host, whose proxy applies the box's
policy (docs/design/egress.md). Nothing in the sandbox decides what a box may reach: a box
without egress has no endpoint, and with one its only route out is that socket.
"""

from __future__ import annotations

import logging
import os
import socket

from .framing import encode
from .links import RequestError

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
)
NO_PROXY = "localhost,127.0.0.1,::1"

log = logging.getLogger("farm.kernel")


def listen() -> socket.socket:
    """A listening socket on this network namespace's 127.0.0.1, on a port the kernel picks
    (a port no earlier tenant's endpoint can still hold)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def proxy_env(port: int, ca_bundle: str | None) -> dict[str, str]:
    """What a box's processes see: every common proxy variable (both spellings) naming its
    endpoint, and, when the operator gave one, the CA bundle under the names tools read."""
    url = f"http://127.0.0.1:{port}"
    env = {name: url for name in PROXY_VARIABLES}
    env["NO_PROXY"] = NO_PROXY
    env.update({name.lower(): value for name, value in env.items()})
    for name in CA_VARIABLES if ca_bundle else ():
        env[name] = str(ca_bundle)
    return env


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
