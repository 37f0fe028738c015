"""Egress on purpose: boxes reach exactly what their policy allows, through the worker's proxy.

Real Docker workers (``LocalFarm``), a real HTTP server on this host's loopback and the package
index this machine's pip uses. This machine reaches the index through a TLS-inspecting gateway
(its names resolve to an address Python counts as private, its certificates come from a CA in
the host's bundle): the farms here are configured as an operator behind such a gateway would,
with what is found at test time (``index_access``), never a name or address written here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from farm.client import Farm, Session
from farm.errors import InvalidRequest
from farm.local.embedded import LocalFarm
from tests.http_servers import http_server
from tests.test_reliability_adversarial import record

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]

BIG = 4 << 20  # what /big serves: over the byte budget the farms here give a box
BUDGET = 2 << 20
PACKAGE = "six"  # small and pure Python: one wheel, no dependencies


# --- what this machine has ----------------------------------------------------------------


@dataclass
class IndexAccess:
    index: str  # the index URL pip uses
    hosts: list[str]  # the index's host and the host its files come from
    networks: list[str]  # the addresses they resolve to (/32), when not public
    ca_bundle: str  # the host's CA bundle (the gateway's CA is in it)


def pip_index_url() -> str:
    """The index this machine's pip uses: its configuration's, else the default."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.split(".")[-1] == "index-url":
            return value.strip().strip("'\"")
    return "https://pypi.org/simple"


@pytest.fixture(scope="module")
def index_access() -> IndexAccess:
    index = pip_index_url().rstrip("/") + "/"
    cafile = ssl.get_default_verify_paths().openssl_cafile
    context = ssl.create_default_context(cafile=cafile)
    page = urllib.request.urlopen(urljoin(index, f"{PACKAGE}/"), timeout=30, context=context)
    links = re.findall(r'href="([^"]+\.whl[^"]*)"', page.read().decode())
    assert links, f"no wheel of {PACKAGE} on {index}"
    files = urlsplit(urljoin(page.geturl(), links[-1])).hostname
    hosts = list(dict.fromkeys(h for h in (urlsplit(index).hostname, files) if h))
    networks = []
    for host in hosts:
        for info in socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM):
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                networks.append(f"{address}/{address.max_prefixlen}")
    return IndexAccess(index, hosts, sorted(set(networks)), str(Path(cafile).resolve()))


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """An HTTP server on this host's loopback: its port."""

    def answer(path: str) -> bytes:
        return b"x" * BIG if path == "/big" else f"served {path}".encode()

    with http_server(answer) as port:
        yield port


@contextlib.contextmanager
def _farm(workers: int | dict[str, int] = 1, **env: str) -> Iterator[Farm]:
    local = LocalFarm(workers, env=env).start()
    with Farm(local.settings(), owned=local) as farm:
        yield farm


def open_env(index_access: IndexAccess, server: int) -> dict[str, str]:
    """A ceiling with the index and the loopback server, their ranges opened, the host's CA."""
    return {
        "FARM_EGRESS_ALLOW": ",".join(
            [*index_access.hosts, f"127.0.0.1:{server}", f"localhost:{server}"]
        ),
        "FARM_EGRESS_ALLOW_PRIVATE": ",".join(["127.0.0.0/8", *index_access.networks]),
        "FARM_EGRESS_CA_BUNDLE": index_access.ca_bundle,
        "FARM_EGRESS_MAX_BYTES": str(BUDGET),
    }


@pytest.fixture(scope="module")
def open_farm(index_access: IndexAccess, server: int) -> Iterator[Farm]:
    with _farm(**open_env(index_access, server)) as farm:
        yield farm


@pytest.fixture(scope="module")
def closed_farm(server: int) -> Iterator[Farm]:
    """The same loopback server under the ceiling, but no private range opened."""
    with _farm(FARM_EGRESS_ALLOW=f"127.0.0.1:{server},localhost:{server}") as farm:
        yield farm


# --- in a box -----------------------------------------------------------------------------

# Every proxy variable is set in a box with egress; 127.0.0.1 is in NO_PROXY (the box's own
# loopback is its own), so code that means this host's loopback server clears NO_PROXY first.
FETCH = r"""
import os, re, time, urllib.request, urllib.error
os.environ['NO_PROXY'] = os.environ['no_proxy'] = ''
def fetch(url):
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            out = (r.status, r.read())
    except urllib.error.HTTPError as e:
        out = (e.code, e.read())
    except Exception as e:  # a CONNECT refused: the status line is all urllib shows
        refused = re.search(r'Tunnel connection failed: (\d+)', str(e))
        out = (int(refused.group(1)) if refused else type(e).__name__, str(e).encode())
    return out[0], out[1][:300].decode(errors='replace'), len(out[1]), time.monotonic() - t0
"""


def fetch(session: Session, url: str) -> tuple[Any, str, int, float]:
    result = session.run(FETCH + f"fetch({url!r})")
    assert result.ok and result.value is not None, result.error
    status, text, size, took = eval(result.value.text)
    return status, text, size, took


def test_the_index_is_reached_only_by_a_box_allowed_it(
    open_farm: Farm, index_access: IndexAccess, server: int, record_property: Any
) -> None:
    page = urljoin(index_access.index, f"{PACKAGE}/")
    with open_farm.session(egress=index_access.hosts) as allowed:
        status, text, _, _ = fetch(allowed, page)
        assert status == 200 and PACKAGE in text.lower(), text
    with open_farm.session(egress=[f"127.0.0.1:{server}"]) as other:
        denied, reason, _, took = fetch(other, page)
    record(
        record_property,
        "the allowed box reads the index page; another box gets 403 with the policy at once",
        f"allowed: {status}; other: {denied} in {took:.2f}s: {reason.strip()}",
    )
    # HTTPS: a CONNECT refused; urllib shows its status line, which carries the reason
    assert denied == 403 and "not in this box's egress policy" in reason, reason
    assert took < 5


def test_a_program_that_ignores_the_proxy_has_no_route(
    open_farm: Farm, server: int, record_property: Any
) -> None:
    with open_farm.session(egress=[f"127.0.0.1:{server}"]) as session:
        probe = "import socket\ntry:\n  socket.create_connection(('1.1.1.1', 80), 3)\n"
        probe += "except OSError as e:\n  r = e.errno\nr"
        result = session.run(probe)
    record(
        record_property,
        "a box with egress that connects directly: ENETUNREACH (101), no route",
        f"errno {result.value.text if result.value else result.error}",
    )
    assert result.ok and result.value is not None and result.value.text == "101"  # ENETUNREACH


def test_a_loopback_server_needs_its_private_range_opened(
    open_farm: Farm, closed_farm: Farm, server: int, record_property: Any
) -> None:
    url = f"http://127.0.0.1:{server}/hello"
    with closed_farm.session(egress=[f"127.0.0.1:{server}"]) as closed:
        refused, why, _, _ = fetch(closed, url)
    with closed_farm.session(egress=[f"localhost:{server}"]) as named:
        by_name, why_name, _, _ = fetch(named, f"http://localhost:{server}/hello")
    with open_farm.session(egress=[f"127.0.0.1:{server}"]) as opened:
        status, text, _, _ = fetch(opened, url)
    record(
        record_property,
        "refused by address (and by a name resolving to it) until the range is opened",
        f"closed: {refused} {why.strip()}; by name: {by_name}; opened: {status} {text}",
    )
    assert refused == 403 and "non-public address" in why
    assert by_name == 403 and "non-public address" in why_name
    assert (status, text) == (200, "served /hello")


def test_two_boxes_on_one_worker_each_get_exactly_their_own_policy(
    open_farm: Farm, server: int, index_access: IndexAccess, record_property: Any
) -> None:
    page = urljoin(index_access.index, f"{PACKAGE}/")
    a = open_farm.session(egress=[f"127.0.0.1:{server}"])
    b = open_farm.session(egress=index_access.hosts)
    try:
        assert a.worker == b.worker
        assert fetch(a, f"http://127.0.0.1:{server}/a")[:2] == (200, "served /a")
        assert fetch(a, page)[0] == 403
        assert fetch(b, page)[0] == 200
        assert fetch(b, f"http://127.0.0.1:{server}/b")[0] == 403
        # B names A's endpoint: that port is on A's loopback, not B's (nothing listens there
        # in B's, unless B's own endpoint drew the same number: then it is B's policy again)
        ports = [
            int(str(eval(s.run("import os; os.environ['HTTP_PROXY']").value.text)).rsplit(":")[2])
            for s in (a, b)
        ]
        widened = b.run(
            "import urllib.request\n"
            f"proxy = urllib.request.ProxyHandler({{'http': 'http://127.0.0.1:{ports[0]}'}})\n"
            "try:\n"
            f"    urllib.request.build_opener(proxy).open('http://127.0.0.1:{server}/b', None, 5)\n"
            "except Exception as e:\n"
            "    r = str(e)\n"
            "r"
        )
        assert widened.value is not None
        expected = "403" if ports[0] == ports[1] else "Connection refused"
        record(
            record_property,
            "A and B on one worker each reach only their own hosts; B naming A's endpoint "
            "reaches nothing",
            f"endpoints {ports}; B through A's port: {widened.value.text}",
        )
        assert expected in widened.value.text, widened.value.text
    finally:
        a.close()
        b.close()


def test_a_box_over_its_byte_budget_is_cut_off_and_the_worker_serves_on(
    open_farm: Farm, server: int, record_property: Any
) -> None:
    with open_farm.session(egress=[f"127.0.0.1:{server}"]) as session:
        got = fetch(session, f"http://127.0.0.1:{server}/big")
        events = [e for e in open_farm.replay(session.id) if getattr(e, "type", "") == "egress"]
    cut = [e for e in events if "budget" in e.reason]
    record(
        record_property,
        f"a {BIG}-byte download stops near the box's {BUDGET}-byte budget; its event says so",
        f"client got {got[0]} {got[2]} bytes; events: {[(e.bytes_in, e.reason) for e in events]}",
    )
    assert got[2] < BIG
    assert cut and cut[0].bytes_in <= BUDGET
    after = open_farm.run(
        FETCH + f"fetch('http://127.0.0.1:{server}/after')[:2]", egress=[f"127.0.0.1:{server}"]
    )
    assert after.value is not None and after.value.text == "(200, 'served /after')"


def test_connections_are_recorded_in_the_run_the_journal_metrics_and_manifest(
    open_farm: Farm, server: int, record_property: Any
) -> None:
    with open_farm.session(egress=[f"127.0.0.1:{server}"]) as session:
        run = session.stream(
            FETCH
            + f"fetch('http://127.0.0.1:{server}/seen')\n"
            + "fetch('http://example.invalid/')"
        )
        live = [e for e in run if getattr(e, "type", "") == "egress"]
        journaled = [e for e in open_farm.replay(session.id) if getattr(e, "type", "") == "egress"]
    # each connection's event comes as it ends: the first may end after the second's refusal
    assert sorted((e.host, e.allowed) for e in live) == [
        ("127.0.0.1", True),
        ("example.invalid", False),
    ]
    (fetched,) = [e for e in live if e.allowed]
    assert fetched.bytes_in > 0 and fetched.address == "127.0.0.1"
    assert sorted((e.host, e.allowed) for e in journaled) == sorted(
        (e.host, e.allowed) for e in live
    )
    (item,) = open_farm.map(
        [{"id": "m", "code": FETCH + f"fetch('http://127.0.0.1:{server}/m')[0]"}],
        egress=[f"127.0.0.1:{server}"],
    )
    record(
        record_property,
        "each connection an Egress event (live and journaled), counted, in the item's manifest",
        f"live {[(e.host, e.allowed, e.bytes_in) for e in live]}; manifest "
        f"{item.manifest.get('egress')}",
    )
    assert item.ok, item.message
    assert item.manifest["egress"] == [
        {"host": "127.0.0.1", "port": server, "allowed": True, "connections": 1}
    ]
    (worker,) = open_farm.workers()
    metrics = urllib.request.urlopen(worker["metrics"] + "/metrics", timeout=5).read().decode()
    allowed = re.search(r'farm_egress_connections_total\{decision="allowed"\} (\S+)', metrics)
    assert allowed and float(allowed.group(1)) >= 2
    assert re.search(r'farm_egress_bytes_total\{direction="in"\} [1-9]', metrics)


def test_asking_beyond_the_ceiling_is_refused_as_input(
    closed_farm: Farm, record_property: Any
) -> None:
    with pytest.raises(InvalidRequest, match="beyond this farm's ceiling") as refused:
        closed_farm.session(egress=["example.org"])
    record(record_property, "InvalidRequest (kind input) naming the ceiling", str(refused.value))
    result = closed_farm.run("1", egress=["*"])
    assert result.kind == "input" and "ceiling" in (result.error.evalue if result.error else "")
    (item,) = closed_farm.map([{"id": 1, "code": "1", "egress": ["example.org:22"]}])
    assert item.kind == "input" and "ceiling" in (item.message or "")
    with pytest.raises(InvalidRequest, match="ports must be"):
        closed_farm.session(egress=["example.org:http"])


def test_a_box_without_egress_has_no_endpoint_and_no_variables(
    open_farm: Farm, record_property: Any
) -> None:
    with open_farm.session() as session:
        env = session.run("import os; sorted(k for k in os.environ if 'proxy' in k.lower())")
    record(record_property, "no proxy variables", str(env.value and env.value.text))
    assert env.value is not None and env.value.text == "[]"


def test_pip_installs_a_package_through_the_proxy(
    pip_image: str, index_access: IndexAccess, server: int, record_property: Any
) -> None:
    """In an image with pip whose spec allows the index: ``pip install --target``, then import
    it; the image's own egress is its sessions' (they ask for none)."""
    argv = ["python3", "-m", "pip", "install", "--quiet", "--no-cache-dir"]
    argv += ["--target", "/workspace/lib", PACKAGE]
    with (
        _farm({pip_image: 1}, **open_env(index_access, server)) as farm,
        farm.session(image=pip_image) as session,
    ):
        install = session.exec(argv, timeout_s=120)
        assert install.returncode == 0, install.stderr
        imported = session.run(
            "import sys\nsys.path.insert(0, '/workspace/lib')\n"
            f"import {PACKAGE}\n{PACKAGE}.__file__"
        )
    record(
        record_property,
        f"pip install --target {PACKAGE} through the proxy, then import it",
        f"exit {install.returncode}; imported from {imported.value and imported.value.text}",
    )
    assert imported.value is not None and "/workspace/lib/" in imported.value.text


@pytest.fixture(scope="module")
def pip_image(docker_env: Any, index_access: IndexAccess) -> Iterator[str]:
    """An environment with Debian's pip whose spec allows the index's hosts."""
    from farm.sandbox.catalog import build_image
    from farm.sandbox.envspec import make_spec
    from tests.test_environments import _forget

    name = f"pytest-pip-{time.monotonic_ns() % 10**8}"
    spec = make_spec(name=name, apt=["python3-pip"], egress=index_access.hosts)
    try:
        assert build_image(name, spec, client=docker_env).built
        yield name
    finally:
        _forget(docker_env, name)


def test_an_endpoint_is_revoked_for_every_holder_when_its_session_ends(
    docker_sandbox: Any, record_property: Any
) -> None:
    """The kernel shuts the endpoint down as the session closes: the copy a proxy holds
    listens no more, so no later tenant of the box number reaches this session's policy."""
    from farm.kernel.wire.framing import recv_frame_fds

    with docker_sandbox.kernel() as attached, docker_sandbox.kernel() as client:
        channel = attached.attach_egress()
        try:
            opened = client.open_session(egress=True, session_id="revoked-1")
            got = recv_frame_fds(channel, 4096)
            assert got is not None
            frame, fds = got
            endpoint = socket.socket(fileno=fds[0])
            assert frame == {"type": "egress_box", "session_id": "revoked-1", "port": frame["port"]}
            assert endpoint.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            client.close_session(opened["session_id"])
            listening = endpoint.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            record(record_property, "the proxy's copy listens no more", f"listening={listening}")
            assert listening == 0
            endpoint.close()
        finally:
            channel.close()
