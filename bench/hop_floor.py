"""How far the kernel's round trip can go: the floor of each design, against the socket echo.

Run with the project venv: ``.venv/bin/python bench/hop_floor.py [--quick] [--json]``.

The kernel goal (issue 35) is a warm ``execute("1")`` within 5x a raw socket echo. This bench
measures, in one run and in alternating blocks, the least each shape of the path can cost:
every shape does only what any kernel must (farm's framing and JSON both ways, at farm's frame
sizes; the session side compiles and runs the cell and builds a result of farm's fields) and
none of farm's rules (epochs, caps, timeouts, output pipes, records):

- ``echo``: the baseline, raw bytes (``bench/kernel.py``'s);
- ``direct``: the host talks to the session process itself, blocking sockets;
- ``asyncio``: the same work in one asyncio streams server (the supervisor running the cell);
- ``relay, blocking`` / ``relay, asyncio`` / ``relay, protocols``: a relay between host and
  session process, as the supervisor is, with blocking sockets, with asyncio streams (today's
  shape) or with bare ``asyncio.Protocol`` callbacks;
- ``farm``: the real kernel (a ``ProcessSandbox``), for reference.

Every loop stops at ``BUDGET_S``; every process started here is stopped on exit.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from benchlib import Latency, emit, machine, parse_args
from kernel import EchoBaseline

from farm.kernel.wire.client import KernelClient
from farm.kernel.wire.framing import decode_body, encode, read_frame, recv_frame
from farm.models import frames
from farm.sandbox.process import ProcessSandbox

BUDGET_S = 60.0
BLOCK = 100  # calls per shape per block; the shapes take turns
GOAL = 5.0
CALLS = {"full": 2000, "quick": 400}
SID, EXEC_ID = uuid.uuid4().hex, uuid.uuid4().hex
REQUEST = {"type": "execute", "session_id": SID, "epoch": 0, "code": "1", "timeout_s": 10.0}
REQUEST["exec_id"] = EXEC_ID


def run_cell(message: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Any]:
    """What a session process must do for a cell at the least: compile, run, render."""
    started = time.perf_counter()
    value = eval(compile(message["code"], "<cell>", "eval"), namespace)
    result = {
        "exec_id": message["exec_id"],
        "session_id": message["session_id"],
        "epoch": message["epoch"],
        "status": "ok",
        "stdout": "",
        "stderr": "",
        "value": {"text": repr(value), "data": {"text/plain": repr(value)}},
        "error": None,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_s": time.perf_counter() - started,
        "cpu_s": time.process_time(),
        "max_rss_kb": 0,
        "state_lost": False,
    }
    return {"type": "exec_result", "result": result}


def serve_session(conn: socket.socket) -> None:
    """A session process: answer cells on ``conn`` until it closes (blocking)."""
    namespace: dict[str, Any] = {}
    with conn:
        while (message := recv_frame(conn)) is not None:
            conn.sendall(encode(run_cell(message, namespace)))


def serve_direct(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    serve_session(conn)


def serve_blocking_relay(listener: socket.socket, session: socket.socket) -> None:
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn, session:
        while (message := recv_frame(conn)) is not None:
            session.sendall(encode(message))
            reply = recv_frame(session)
            if reply is None:
                return
            conn.sendall(encode(reply))


def serve_asyncio(listener: socket.socket, session: socket.socket | None) -> None:
    """One asyncio streams server: the cell run in place, or relayed to ``session``."""

    async def main() -> None:
        done = asyncio.Event()
        namespace: dict[str, Any] = {}
        cell: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if session is not None:
            cell = await asyncio.open_unix_connection(sock=session)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (message := await read_frame(reader)) is not None:
                if cell is None:
                    reply = run_cell(message, namespace)
                else:
                    cell[1].write(encode(message))
                    reply = await read_frame(cell[0]) or {}
                writer.write(encode(reply))
            writer.close()
            done.set()

        server = await asyncio.start_server(handle, sock=listener)
        async with server:
            await done.wait()

    asyncio.run(main())


class Frames(asyncio.Protocol):
    """Length-prefixed JSON frames off a transport, each handed to ``on_frame`` (no streams)."""

    def __init__(self, on_frame: Callable[[dict[str, Any]], None]) -> None:
        self.on_frame = on_frame
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            size = int.from_bytes(self.buffer[:4], "big")
            if len(self.buffer) < 4 + size:
                return
            body, self.buffer = bytes(self.buffer[4 : 4 + size]), self.buffer[4 + size :]
            self.on_frame(decode_body(body))


def serve_protocol_relay(listener: socket.socket, session: socket.socket) -> None:
    """The relay as two ``asyncio.Protocol``s: each frame forwarded from its callback."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        host = Frames(lambda reply: None)
        cell = Frames(lambda reply: host.transport.write(encode(reply)))  # type: ignore[union-attr]
        await loop.connect_accepted_socket(lambda: cell, session)
        conn, _ = await loop.sock_accept(listener)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host.on_frame = lambda message: cell.transport.write(encode(message))  # type: ignore[union-attr]
        host.connection_lost = lambda exc: done.set_result(None)  # type: ignore[method-assign]
        await loop.connect_accepted_socket(lambda: host, conn)
        await done

    listener.setblocking(False)
    asyncio.run(main())


class Shape:
    """A server (and a session process behind it) in processes of their own, and a client."""

    def __init__(self, name: str, target: Callable[..., None], relay: bool = False) -> None:
        self.name = name
        self.listener = socket.create_server(("127.0.0.1", 0))
        ctx = multiprocessing.get_context("fork")
        args: tuple[Any, ...] = (self.listener,)
        self.procs = []
        if relay:
            near, far = socket.socketpair()
            self.procs.append(ctx.Process(target=serve_session, args=(far,), daemon=True))
            args += (near,)
        elif target is serve_asyncio:
            args += (None,)
        self.procs.append(ctx.Process(target=target, args=args, daemon=True))
        for proc in self.procs:
            proc.start()
        if relay:
            near.close()
            far.close()
        self.sock = socket.create_connection(self.listener.getsockname(), timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.listener.close()
        self.request = encode(REQUEST)

    def call(self) -> None:
        self.sock.sendall(self.request)
        if recv_frame(self.sock) is None:
            raise ConnectionError(f"{self.name}: the server closed")

    def close(self) -> None:
        self.sock.close()
        for proc in self.procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)


@contextmanager
def farm_kernel() -> Iterator[Callable[[], object]]:
    """The real kernel's ``execute("1")`` on a warm session, as ``bench/kernel.py`` calls it."""
    with ProcessSandbox() as sandbox:
        client = KernelClient.at(sandbox.address, sandbox.token, check=frames.validate)
        with client:
            opened = client.open_session()
            sid, epoch = opened["session_id"], opened["epoch"]
            yield lambda: client.execute(sid, "1", epoch=epoch, timeout_s=10.0)


def measure(calls: int) -> dict[str, Latency]:
    with ExitStack() as stack:
        echo = stack.enter_context(EchoBaseline(len(encode(REQUEST)) - 4, 374))
        shapes: dict[str, Callable[[], object]] = {"echo": echo.call}
        for name, target, relay in (
            ("direct", serve_direct, False),
            ("asyncio", serve_asyncio, False),
            ("relay, blocking", serve_blocking_relay, True),
            ("relay, asyncio", serve_asyncio, True),
            ("relay, protocols", serve_protocol_relay, True),
        ):
            shape = Shape(name, target, relay)
            stack.callback(shape.close)
            shapes[name] = shape.call
        shapes["farm"] = stack.enter_context(farm_kernel())
        out = {name: Latency(name) for name in shapes}
        for call in shapes.values():  # warm-up
            for _ in range(BLOCK):
                call()
        end = time.monotonic() + BUDGET_S
        while time.monotonic() < end and len(out["echo"].samples_ns) < calls:
            for name, call in shapes.items():
                for _ in range(BLOCK):
                    t0 = time.perf_counter_ns()
                    call()
                    out[name].samples_ns.append(time.perf_counter_ns() - t0)
        return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    out = measure(CALLS["quick" if args.quick else "full"])
    echo = out["echo"].p(50)
    head = machine()
    lines = [
        f"kernel hop floors  {head['date']}  host {head['host']}  {head['cpu']}  "
        f"{head['cores']} cores  Python {head['python']}",
        "",
        f"{'shape':<18}{'n':>6}{'p50':>10}{'p99':>10}{'p50/echo':>10}  within {GOAL:g}x",
    ]
    data: dict[str, Any] = {"machine": head, "goal_ratio": GOAL, "shapes": {}}
    for name, lat in out.items():
        ratio = lat.p(50) / echo
        lines.append(
            f"{name:<18}{len(lat.samples_ns):>6}{lat.p(50) / 1e3:>8.0f}us{lat.p(99) / 1e3:>8.0f}us"
            f"{ratio:>9.1f}x  {'yes' if ratio <= GOAL else 'no'}"
        )
        data["shapes"][name] = {"p50_us": lat.p(50) / 1e3, "p99_us": lat.p(99) / 1e3}
    lines.append(f"\nframes: request {len(encode(REQUEST))} B, reply ~374 B; blocks of {BLOCK}")
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
