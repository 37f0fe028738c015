"""A small HTTP server on this host for tests: each GET answered by a function of its path;
and an address of this host's, not loopback, for it to listen on."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

SIOCGIFADDR = 0x8915


def bridge_address(network: dict[str, Any]) -> str:
    """This host's address on the Docker bridge ``network`` (its ``attrs``), as its interface
    holds it: an address of this host alone that is not loopback (which Chromium reaches past
    its proxy). Read from the interface, not from the network's IPAM config, whose
    ``Gateway`` a newer dockerd leaves out (``{"Subnet": "172.17.0.0/16"}`` only)."""
    name = (network.get("Options") or {}).get("com.docker.network.bridge.name", "docker0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        answer = fcntl.ioctl(sock, SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    return socket.inet_ntoa(answer[20:24])  # the ifreq's sockaddr_in: family, port, address


@contextlib.contextmanager
def http_server(
    answer: Callable[[str], bytes], host: str = "127.0.0.1", content_type: str = "text/plain"
) -> Iterator[int]:
    """Serve ``answer(path)`` for every GET on ``host`` until the block ends: its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answer(self.path)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
