"""The egress policy and proxy on their own (no Docker): rules, the ceiling, refused addresses,
and the proxy serving an endpoint (a listening socket, as a box's would be) against a real
server on this host's loopback. The whole path through a sandbox is tests/test_egress.py."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from farm.egress.policy import PolicyError, Rule, box_policy
from farm.egress.proxy import EgressProxy, Limits, Record
from tests.http_servers import http_server

# --- rules and the ceiling ----------------------------------------------------------------


def test_rules_name_hosts_subdomains_and_ports() -> None:
    rule = Rule.parse("*.Example.org:443,8443")
    assert rule.matches("api.example.org", 443) and rule.matches("a.b.example.org", 8443)
    assert not rule.matches("example.org", 443)  # the domain itself is not under "*."
    assert not rule.matches("api.example.org", 80)
    assert Rule.parse("pypi.org").ports == {80, 443}
    for bad in ("pypi.org:http", "pypi.org:0", "*example.org", "a*b.org", "", "x/y"):
        with pytest.raises(PolicyError):
            Rule.parse(bad) if bad else box_policy([":"], ["*"], [])


def test_a_box_gets_what_it_asked_only_within_the_ceiling() -> None:
    policy = box_policy(["api.example.org:443"], ["*.example.org"], [])
    assert policy.allows("api.example.org", 443) and not policy.allows("www.example.org", 443)
    with pytest.raises(PolicyError, match="beyond this farm's ceiling"):
        box_policy(["api.example.org:22"], ["*.example.org"], [])
    with pytest.raises(PolicyError, match="FARM_EGRESS_ALLOW is empty"):
        box_policy(["example.org"], [], [])
    assert box_policy(["*"], ["*"], []).allows("anything.test", 80)
    assert not box_policy(["*"], ["*"], []).allows("anything.test", 22)
    assert box_policy(["a.test:*"], ["*:*"], []).allows("a.test", 22)
    with pytest.raises(PolicyError, match="ceiling"):
        box_policy(["a.test:*"], ["*:443"], [])


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fd00::1",
     "::ffff:10.0.0.1", "0.0.0.0", "224.0.0.1", "100.64.0.1", "fe80::1%eth0",
     "64:ff9b::a9fe:a9fe", "64:ff9b:1::a00:1", "2002:a9fe:a9fe::1", "::a9fe:a9fe"],
)  # fmt: skip
def test_non_public_addresses_are_refused_unless_their_range_is_opened(address: str) -> None:
    assert box_policy([], ["*"], []).address_refused(address) is not None
    opened = box_policy([], ["*"], ["0.0.0.0/0", "::/0"])
    assert opened.address_refused(address) is None
    assert box_policy([], ["*"], []).address_refused("93.184.216.34") is None


# --- the proxy ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    def answer(path: str) -> bytes:
        return b"y" * 300_000 if path == "/big" else f"got {path}".encode()

    with http_server(answer) as port:
        yield port


@pytest.fixture
def proxy() -> Iterator[tuple[EgressProxy, queue.Queue[Record]]]:
    records: queue.Queue[Record] = queue.Queue()
    egress = EgressProxy(Limits(100_000, 2, 5.0), lambda _, record: records.put(record))
    yield egress, records
    egress.close()


def endpoint(egress: EgressProxy, rules: list[str], private: list[str]) -> int:
    """A listening socket served with a policy (a box's endpoint, here on this host)."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    egress.serve("s1", sock, box_policy(rules, ["*:*"], private))
    return port


def ask(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        chunks = []
        while data := conn.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_plain_http_is_forwarded_and_recorded(
    proxy: tuple[EgressProxy, queue.Queue[Record]], upstream: int
) -> None:
    egress, records = proxy
    port = endpoint(egress, [f"127.0.0.1:{upstream}"], ["127.0.0.0/8"])
    reply = ask(port, f"GET http://127.0.0.1:{upstream}/a HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"got /a")
    record = records.get(timeout=5)
    assert (record.host, record.port, record.allowed, record.address) == (
        "127.0.0.1", upstream, True, "127.0.0.1",
    )  # fmt: skip
    assert record.bytes_in == len(reply) and record.bytes_out > 0


def test_connect_tunnels_and_refusals_say_why(
    proxy: tuple[EgressProxy, queue.Queue[Record]], upstream: int
) -> None:
    egress, records = proxy
    port = endpoint(egress, [f"127.0.0.1:{upstream}", f"localhost:{upstream}"], [])
    # allowed by name, but every address it resolves to is loopback: refused, no connection
    refused = ask(
        port,
        f"CONNECT localhost:{upstream} HTTP/1.1\r\nHost: localhost:{upstream}\r\n\r\n".encode(),
    )
    assert refused.startswith(b"HTTP/1.1 403 Forbidden (farm egress: localhost resolves only")
    not_listed = ask(port, b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
    assert (
        b"403" in not_listed.split(b"\r\n")[0] and b"not in this box's egress policy" in not_listed
    )
    garbage = ask(port, b"\x16\x03\x01 not http\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400")
    got = [records.get(timeout=5) for _ in range(3)]
    assert [r.allowed for r in got] == [False, False, False]


def test_a_box_is_cut_off_past_its_byte_budget_and_its_connection_limit(
    proxy: tuple[EgressProxy, queue.Queue[Record]], upstream: int
) -> None:
    egress, records = proxy
    port = endpoint(egress, [f"127.0.0.1:{upstream}"], ["127.0.0.0/8"])
    reply = ask(port, f"GET http://127.0.0.1:{upstream}/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert len(reply) < 300_000
    cut = records.get(timeout=5)
    assert "budget" in cut.reason and cut.bytes_in <= 100_000
    again = ask(port, f"GET http://127.0.0.1:{upstream}/a HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert again.startswith(b"HTTP/1.1 403") and b"budget" in again  # spent for the whole box
    # two connections open at once at most: the third is refused as it is accepted, before
    # anything is read (idle connections hold no fd of the worker beyond the box's budget)
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
            assert third.recv(4096).startswith(b"HTTP/1.1 429 Too Many Requests")
    finally:
        for conn in held:
            conn.close()
    reasons = [records.get(timeout=5).reason for _ in range(2)]  # "again"'s, then the third's
    assert "over 2 open connections" in reasons[1], reasons


def test_a_connection_is_cut_at_its_time_limit(upstream: int) -> None:
    """A tunnel that stays open (a server that never answers) is closed at the box's time
    limit per connection, and its record says so."""
    records: queue.Queue[Record] = queue.Queue()
    egress = EgressProxy(Limits(10**9, 4, 0.5), lambda _, record: records.put(record))
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        port = endpoint(egress, [f"127.0.0.1:{silent.getsockname()[1]}"], ["127.0.0.0/8"])
        request = f"CONNECT 127.0.0.1:{silent.getsockname()[1]} HTTP/1.1\r\nHost: x\r\n\r\n"
        reply = ask(port, request.encode())
        assert reply.startswith(b"HTTP/1.1 200 Connection established")
        record = records.get(timeout=10)
        assert record.allowed and "time limit" in record.reason
        assert 0.5 <= record.duration_s < 5
    finally:
        silent.close()
        egress.close()


def test_doctor_says_what_boxes_may_reach(tmp_path: Any) -> None:
    from farm.cli.diagnose import egress_check
    from farm.settings import EgressSettings, FarmSettings

    def check(**egress: Any) -> Any:
        return egress_check(FarmSettings(egress=EgressSettings(**egress)))

    assert "no box reaches anything" in check().detail
    named = check(allow=["pypi.org"], allow_private=["203.0.113.80/32"])
    assert (named.ok, named.warn) == (True, False) and "203.0.113.80/32" in named.detail
    anything = check(allow=["*:*"])
    assert anything.ok and anything.warn and "any host and port" in anything.fix
    assert not check(allow=["pypi.org:x"]).ok
    assert not check(allow=["pypi.org"], ca_bundle=tmp_path / "missing.pem").ok


def test_plain_http_is_one_request_to_the_target_it_names(
    proxy: tuple[EgressProxy, queue.Queue[Record]],
) -> None:
    """The client's Host never reaches the upstream (a shared front end would route by it),
    and a second request pipelined on the connection goes nowhere."""
    upstream = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve_once() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.settimeout(5)
            data = b""
            while not data.endswith(b"body") and (chunk := conn.recv(65536)):
                data += chunk
            got.append(data)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    thread = threading.Thread(target=serve_once)
    thread.start()
    egress, _ = proxy
    target = f"127.0.0.1:{upstream.getsockname()[1]}"
    port = endpoint(egress, [target], ["127.0.0.0/8"])
    request = (
        f"POST http://{target}/a HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 4\r\n\r\n"
        "body"
        "GET /b HTTP/1.1\r\nHost: other.example\r\n\r\n"
    )
    reply = ask(port, request.encode())
    thread.join(10)
    upstream.close()
    assert reply.endswith(b"ok")
    (sent,) = got
    assert sent.startswith(b"POST /a HTTP/1.1\r\nHost: " + target.encode() + b"\r\n")
    assert b"evil.example" not in sent and b"other.example" not in sent and b"GET /b" not in sent


def test_an_endpoint_revoked_or_stopped_before_it_is_served_is_closed(
    proxy: tuple[EgressProxy, queue.Queue[Record]],
) -> None:
    """Listening again on a socket the kernel shut down would open a fresh port of the box with
    the old policy: such an endpoint, or one whose session stopped first, is closed unserved."""
    egress, _ = proxy
    revoked = socket.create_server(("127.0.0.1", 0))
    revoked.shutdown(socket.SHUT_RDWR)
    egress.serve("gone", revoked, box_policy([], ["*"], []))
    egress.stop("late", wait_s=1.0)
    late = socket.create_server(("127.0.0.1", 0))
    egress.serve("late", late, box_policy([], ["*"], []))
    egress.stop("nothing", wait_s=1.0)  # runs after both serves on the proxy's loop
    assert revoked.fileno() == -1 and late.fileno() == -1
    assert "gone" not in egress.boxes and "late" not in egress.boxes


def test_a_port_out_of_range_is_a_bad_request(
    proxy: tuple[EgressProxy, queue.Queue[Record]],
) -> None:
    egress, _ = proxy
    port = endpoint(egress, ["*:*"], [])
    reply = ask(port, b"CONNECT example.org:99999 HTTP/1.1\r\nHost: example.org\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400") and b"not a port" in reply
