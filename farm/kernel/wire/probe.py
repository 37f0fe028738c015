"""Health probe: exit 0 when a kernel at ADDRESS greets like a farm kernel.

``python3 -m farm.kernel.wire.probe /run/farm/kernel.sock`` (or ``HOST:PORT``). It needs no
token: it only checks that the server accepts and sends its ``hello`` frame, which proves the
event loop is alive. Used by the image's HEALTHCHECK.
"""

from __future__ import annotations

import sys

from .client import connect_socket
from .framing import recv_frame


def probe(address: str, timeout_s: float = 3.0) -> bool:
    try:
        with connect_socket(address, timeout_s) as sock:
            hello = recv_frame(sock, 4096)
    except (OSError, ValueError):
        return False
    return bool(hello and hello.get("type") == "hello" and hello.get("kernel") == "farm")


if __name__ == "__main__":
    sys.exit(0 if len(sys.argv) == 2 and probe(sys.argv[1]) else 1)
