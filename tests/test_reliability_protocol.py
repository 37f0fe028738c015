"""Protocol abuse against the real kernel in a Docker sandbox, through its Unix socket.

No token, a wrong token, a replayed handshake, garbage bytes, a 4 GB length prefix, slow-loris
clients and a thousand concurrent connections: the kernel refuses each, keeps answering an
honest client while it happens, closes what it refused (no leaked file descriptors) and does
not grow its memory. The supervisor's RSS and fds are read from the host's ``/proc``.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.kernel.supervisor.server import HANDSHAKE_TIMEOUT_S
from farm.kernel.wire import auth, framing
from farm.kernel.wire.client import KernelAuthError, KernelClient
from farm.sandbox.docker import DockerSandbox
from tests.conftest import Cells, make_docker_sandbox
from tests.raw_sockets import auth_frame, authed, raw
from tests.waiting import stays, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.reliability]

CUT_OFF_S = HANDSHAKE_TIMEOUT_S + 3.0  # when a refused or silent connection must be closed
RESPONSIVE_S = 3.0  # an honest ping while the kernel is under abuse (a loaded CI machine)
RSS_SLACK_KB = 8 * 1024


# --- the kernel as the host sees it ---------------------------------------------------------


class KernelProcess:
    """The sandbox's kernel supervisor, by host pid (docker-init's child)."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        assert sandbox.container is not None
        sandbox.container.reload()
        init = int(sandbox.container.attrs["State"]["Pid"])
        children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        assert children, "docker-init has no child: the kernel is not running"
        self.pid = int(children[0])

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def settled_fds(self) -> int:
        """The fd count once it holds still for a second: the supervisor refills its spare
        session processes (three fds each) in the background after an open."""
        seen: list[int] = []

        def settled() -> bool:
            seen.append(self.fds())
            return stays(lambda: self.fds() == seen[-1], 1.0)

        wait_for(settled, 30)
        return seen[-1]


@pytest.fixture(scope="module")
def sandbox(docker_env: Any, tmp_path_factory: Any) -> Iterator[DockerSandbox]:
    with make_docker_sandbox(docker_env, tmp_path_factory) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def supervisor(sandbox: DockerSandbox) -> KernelProcess:
    with sandbox.kernel() as client:  # warm up: one session, one call
        cells = Cells(client)
        cells.run("1")
        client.close_session(cells.id)
    return KernelProcess(sandbox)


@pytest.fixture
def honest(sandbox: DockerSandbox) -> Iterator[KernelClient]:
    """A client connected before the abuse starts; the test ends by checking it still works."""
    with sandbox.kernel() as client:
        yield client
        cells = Cells(client)
        assert cells.value("6 * 7") == "42"
        client.close_session(cells.id)


def reply_then_closed(sock: socket.socket, timeout_s: float = CUT_OFF_S) -> tuple[str, bool]:
    """The error code the kernel sent (or '-') and whether it closed the connection."""
    sock.settimeout(timeout_s)
    code = "-"
    try:
        reply = framing.recv_frame(sock, 1 << 20)
        if reply is None:
            return code, True
        code = str(reply.get("code", reply.get("type")))
        while sock.recv(65536):
            pass
        return code, True
    except (ConnectionResetError, BrokenPipeError, framing.FrameError):
        return code, True
    except TimeoutError:
        return code, False


def ping_s(client: KernelClient) -> float:
    t0 = time.perf_counter()
    assert client.ping(10)["type"] == "pong"
    return time.perf_counter() - t0


def record(record_property: Callable[[str, object], None], expected: str, observed: str) -> None:
    record_property("expected", expected)
    record_property("observed", observed)


# --- the cases ------------------------------------------------------------------------------


def test_no_token_gets_nothing(
    sandbox: DockerSandbox, honest: KernelClient, record_property: Any
) -> None:
    sock, _ = raw(sandbox)
    framing.send_frame(sock, {"type": "open_session"})  # skipping the handshake
    code, closed = reply_then_closed(sock)
    observed = f"reply {code}, closed={closed}, honest ping {ping_s(honest) * 1000:.1f} ms"
    record(record_property, "auth_failed, connection closed, kernel answers", observed)
    assert (code, closed) == ("auth_failed", True), observed


def test_a_wrong_token_is_refused(
    sandbox: DockerSandbox, honest: KernelClient, record_property: Any
) -> None:
    with pytest.raises(KernelAuthError):
        KernelClient.at(sandbox.address, auth.new_token()).connect()
    sock, server_nonce = raw(sandbox)
    framing.send_frame(sock, auth_frame(auth.new_token(), server_nonce))
    code, closed = reply_then_closed(sock)
    observed = f"KernelAuthError; raw reply {code}, closed={closed}"
    record(record_property, "KernelAuthError / auth_failed, connection closed", observed)
    assert (code, closed) == ("auth_failed", True), observed
    assert ping_s(honest) < RESPONSIVE_S


def test_a_replayed_handshake_is_refused(
    sandbox: DockerSandbox, honest: KernelClient, record_property: Any
) -> None:
    first, server_nonce = raw(sandbox)
    recorded = auth_frame(sandbox.token, server_nonce)
    framing.send_frame(first, recorded)
    welcome = framing.recv_frame(first, 4096)
    assert welcome is not None and welcome["type"] == "welcome"
    replay, _ = raw(sandbox)
    framing.send_frame(replay, recorded)  # a fresh server nonce makes the recording worthless
    code, closed = reply_then_closed(replay)
    observed = f"replay got {code}, closed={closed}"
    record(record_property, "auth_failed, connection closed", observed)
    assert (code, closed) == ("auth_failed", True), observed


@pytest.mark.parametrize("when", ["before-auth", "after-auth"])
def test_garbage_bytes_are_refused(
    sandbox: DockerSandbox,
    honest: KernelClient,
    supervisor: KernelProcess,
    when: str,
    record_property: Any,
) -> None:
    outcomes = []
    for seed in range(20):
        sock = raw(sandbox)[0] if when == "before-auth" else authed(sandbox)
        noise = os.urandom(64 + seed * 97)
        if seed % 2:  # a length prefix that fits, then bytes that are not UTF-8 JSON
            sock.sendall(struct.pack(">I", len(noise)) + b"\xff" + noise[1:])
        else:  # noise from the first byte (which makes the length absurd, not a wait)
            sock.sendall(b"\xff" + noise)
        outcomes.append(reply_then_closed(sock))
        sock.close()
    codes = sorted({code for code, _ in outcomes})
    all_closed = all(closed for _, closed in outcomes)
    observed = (
        f"replies {codes}, all closed={all_closed}, honest ping {ping_s(honest) * 1e3:.1f} ms"
    )
    record(record_property, "bad_frame (or auth_failed), every connection closed", observed)
    assert all_closed, observed
    assert set(codes) <= {"bad_frame", "auth_failed"}, observed


@pytest.mark.parametrize("when", ["before-auth", "after-auth"])
def test_a_4gb_length_prefix_allocates_nothing(
    sandbox: DockerSandbox,
    honest: KernelClient,
    supervisor: KernelProcess,
    when: str,
    record_property: Any,
) -> None:
    before = supervisor.rss_kb()
    outcomes = []
    for _ in range(20):
        sock = raw(sandbox)[0] if when == "before-auth" else authed(sandbox)
        sock.sendall(struct.pack(">I", 0xFFFFFFFF) + b"x" * 1024)
        outcomes.append(reply_then_closed(sock))
        sock.close()
    grew = supervisor.rss_kb() - before
    codes = sorted({code for code, _ in outcomes})
    all_closed = all(closed for _, closed in outcomes)
    observed = f"replies {codes}, all closed={all_closed}, kernel RSS {grew:+d} kB"
    record(record_property, "bad_frame, connection closed, RSS flat", observed)
    assert codes == ["bad_frame"] and all_closed, observed
    assert grew < 1024, observed


def test_slow_loris_clients_are_cut_off_and_others_served(
    sandbox: DockerSandbox, honest: KernelClient, supervisor: KernelProcess, record_property: Any
) -> None:
    """Fifty clients trickle a valid-looking auth frame a byte at a time: the handshake
    deadline is for the whole handshake, so they are all closed after it."""
    lorises = [raw(sandbox) for _ in range(50)]
    stop = threading.Event()
    closed_after: dict[int, float] = {}
    t0 = time.monotonic()

    def trickle(i: int, sock: socket.socket, nonce: str) -> None:
        data = framing.encode(auth_frame(sandbox.token, nonce))
        for byte in data:
            if stop.is_set():
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                closed_after[i] = time.monotonic() - t0
                return
            if stop.wait(0.5):
                return

    threads = [
        threading.Thread(target=trickle, args=(i, sock, nonce), daemon=True)
        for i, (sock, nonce) in enumerate(lorises)
    ]
    for thread in threads:
        thread.start()
    pings = []
    while time.monotonic() - t0 < CUT_OFF_S:
        pings.append(ping_s(honest))
        time.sleep(0.2)  # sampling interval of the honest client's latency
    fresh_ok = False
    with sandbox.kernel(connect_timeout_s=5) as newcomer:
        fresh_ok = newcomer.ping()["type"] == "pong"
    for i, (sock, _) in enumerate(lorises):
        _, closed = reply_then_closed(sock, 1.0)
        if closed:
            closed_after.setdefault(i, time.monotonic() - t0)
    stop.set()
    for thread in threads:
        thread.join(5)
    latest = max(closed_after.values(), default=float("inf"))
    observed = (
        f"{len(closed_after)}/50 cut off, last after {latest:.1f}s; honest ping max "
        f"{max(pings) * 1e3:.0f} ms; a new client connected: {fresh_ok}"
    )
    record(
        record_property,
        f"every slow client closed within {CUT_OFF_S:g}s; honest pings < {RESPONSIVE_S:g}s",
        observed,
    )
    assert len(closed_after) == 50 and latest < CUT_OFF_S + 1.0, observed
    assert max(pings) < RESPONSIVE_S and fresh_ok, observed


def _abuse_round(sandbox: DockerSandbox, n: int) -> list[socket.socket]:
    """``n`` concurrent connections: idle, garbage, wrong token, 4 GB prefix, in turn."""
    socks = []
    for i in range(n):
        sock, nonce = raw(sandbox)
        style = i % 4
        if style == 1:
            sock.sendall(b"\xff" + os.urandom(63))
        elif style == 2:
            sock.sendall(framing.encode(auth_frame(auth.new_token(), nonce)))
        elif style == 3:
            sock.sendall(struct.pack(">I", 0xFFFFFFFF))
        socks.append(sock)
    return socks


def _all_closed(socks: list[socket.socket], deadline: float) -> int:
    """How many of ``socks`` the kernel closed before ``deadline``."""
    closed = 0
    for sock in socks:
        _, done = reply_then_closed(sock, max(0.05, deadline - time.monotonic()))
        closed += done
        sock.close()
    return closed


def test_a_thousand_concurrent_connections_are_refused_without_growth(
    sandbox: DockerSandbox, honest: KernelClient, supervisor: KernelProcess, record_property: Any
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    fds_before, rss_before = supervisor.settled_fds(), supervisor.rss_kb()
    figures = []
    for _ in range(2):  # the second round shows whether anything accumulates
        t0 = time.monotonic()
        socks = _abuse_round(sandbox, 1000)
        opened_s = time.monotonic() - t0
        during = ping_s(honest)
        with sandbox.kernel(connect_timeout_s=CUT_OFF_S) as newcomer:
            cells = Cells(newcomer)
            newcomer_ok = cells.value("sum(range(10))") == "45"
            newcomer.close_session(cells.id)
        closed = _all_closed(socks, time.monotonic() + CUT_OFF_S)
        figures.append(
            (opened_s, during, newcomer_ok, closed, supervisor.settled_fds(), supervisor.rss_kb())
        )
    observed = "; ".join(
        f"round {i + 1}: 1000 open in {o:.1f}s, honest ping {d * 1e3:.0f} ms, new client "
        f"{'ok' if ok else 'FAILED'}, {c}/1000 closed by the kernel, kernel fds {f} "
        f"(before {fds_before}), RSS {r - rss_before:+d} kB"
        for i, (o, d, ok, c, f, r) in enumerate(figures)
    )
    record(
        record_property,
        "all refused and closed; honest client served during; fds back to baseline; RSS flat",
        observed,
    )
    for _, during, newcomer_ok, closed, fds, _ in figures:
        assert closed == 1000 and newcomer_ok and during < RESPONSIVE_S, observed
        assert fds <= fds_before + 2, observed
    assert figures[1][5] - figures[0][5] < 2048, observed  # no growth from round to round
    assert figures[1][5] - rss_before < RSS_SLACK_KB, observed
