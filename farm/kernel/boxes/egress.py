"""A box's way out: its proxy endpoint and the environment that names it.

The endpoint is a socket listening on the box's own loopback, made by the box's pid 1 (so it
lives in the box's network namespace) and handed to the host, whose proxy applies the box's
policy (docs/design/egress.md). Nothing in the sandbox decides what a box may reach: a box
without egress has no endpoint, and with one its only route out is that socket.
"""

from __future__ import annotations

import socket

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
