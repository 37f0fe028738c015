"""Kernel benchmark: execute round trip against a raw TCP echo, open_session, idle memory.

Run with the project venv: ``.venv/bin/python bench/kernel.py [--quick] [--json]``.

Figures, all measured in this one run against a local ``ProcessSandbox`` kernel:

1. ``execute("1")`` on a warm session, p50/p99, against a baseline measured alongside it: a
   plain Python TCP server in its own process on the same loopback, with the kernel's framing
   (4-byte big-endian length, then the body), blocking sockets and TCP_NODELAY, answering
   each frame of farm's request size with a frame of farm's reply size. ``ping`` (answered by
   the supervisor alone, no session hop) is shown for reference. All three are sampled in
   alternating blocks, so drift in machine load hits them alike. Goal: farm/echo <= 2.
2. ``open_session`` latency (each session closed again, outside the timed part). Goal: 20 ms.
3. Idle session memory after ``x = 1``: RSS, PSS and USS from ``/proc``. Goal: 10 MB, read
   against USS (the memory one more session adds, since forked sessions share the zygote's
   pages) with PSS shown as well; RSS counts shared pages in full and is for reference only.

Goals are reported, never asserted: the program exits 0 when a goal is missed. Every loop
stops at ``BUDGET_S`` whatever its count, and every process started here is stopped on exit.
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from benchlib import Latency, emit, machine, parse_args

from farm.kernel.wire.client import KernelClient
from farm.kernel.wire.framing import encode
from farm.sandbox.process import ProcessSandbox

BUDGET_S = 50.0  # every loop stops here, so a run stays well under a minute
HEADER = struct.Struct(">I")
EXEC_TIMEOUT_S = 10.0
RTT_BLOCK = 100  # farm and echo samples alternate in blocks of this many calls
RTT_GOAL_RATIO = 2.0
OPEN_GOAL_MS = 20.0
MEMORY_GOAL_MB = 10.0


@dataclass(frozen=True)
class Plan:
    rtt_calls: int
    rtt_warmup: int
    opens: int
    open_warmup: int
    idle_sessions: int


FULL = Plan(rtt_calls=2000, rtt_warmup=200, opens=200, open_warmup=5, idle_sessions=20)
QUICK = Plan(rtt_calls=300, rtt_warmup=50, opens=40, open_warmup=3, idle_sessions=5)


@dataclass
class Memory:
    pid: int
    rss_kb: int | None
    pss_kb: int | None
    uss_kb: int | None


class Deadline:
    """One budget shared by every loop: a slow machine gets fewer samples, never a hang."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.end


# --- machine line -------------------------------------------------------------------------


# --- the echo baseline --------------------------------------------------------------------


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> bytes:
    (length,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    return _recv_exactly(sock, length)


def _frame(size: int) -> bytes:
    return HEADER.pack(size) + b"x" * size


def echo_server(listener: socket.socket, reply_size: int) -> None:
    """Serve one connection: answer every frame with a ``reply_size`` frame until EOF."""
    reply = _frame(reply_size)
    conn, _ = listener.accept()
    listener.close()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            try:
                _recv_frame(conn)
            except ConnectionError:
                return
            conn.sendall(reply)


class EchoBaseline:
    """The echo server in its own process and a connected client; both closed on exit."""

    def __init__(self, request_size: int, reply_size: int) -> None:
        self.request = _frame(request_size)
        self.reply_size = reply_size
        self.listener = socket.create_server(("127.0.0.1", 0))
        # fork: the child inherits the listening socket, so there is no port to race for
        self.process = multiprocessing.get_context("fork").Process(
            target=echo_server, args=(self.listener, reply_size), daemon=True
        )
        self.sock: socket.socket | None = None

    def __enter__(self) -> EchoBaseline:
        self.process.start()
        try:
            self.sock = socket.create_connection(self.listener.getsockname(), timeout=5.0)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            self.close()
            raise
        finally:
            self.listener.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self) -> None:
        assert self.sock is not None
        self.sock.sendall(self.request)
        _recv_frame(self.sock)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.process.join(2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)


# --- measurements -------------------------------------------------------------------------


def timed(call: Callable[[], object], out: Latency, n: int, deadline: Deadline) -> None:
    for _ in range(n):
        if deadline.passed():
            return
        t0 = time.perf_counter_ns()
        call()
        out.samples_ns.append(time.perf_counter_ns() - t0)


def measure_rtt(
    client: KernelClient, plan: Plan, deadline: Deadline
) -> tuple[Latency, Latency, Latency, dict[str, int]]:
    """``execute("1")``, ``ping`` and the echo, warmed up, then sampled in alternating blocks.

    ``ping`` is answered by the supervisor alone: it splits farm's cost into the client to
    supervisor hop and the supervisor to session hop.
    """
    opened = client.open_session()
    sid, epoch = opened["session_id"], opened["epoch"]
    try:

        def execute() -> dict[str, Any]:
            return client.execute(sid, "1", epoch=epoch, timeout_s=EXEC_TIMEOUT_S)

        result = execute()
        if result["status"] != "ok":
            raise RuntimeError(f"execute('1') failed: {result['error']}")
        # the same message the client builds, to size the baseline's frames like farm's
        request = {
            "type": "execute",
            "session_id": sid,
            "epoch": epoch,
            "code": "1",
            "timeout_s": EXEC_TIMEOUT_S,
            "exec_id": uuid.uuid4().hex,
        }
        sizes = {
            "request_bytes": len(encode(request)) - HEADER.size,
            "reply_bytes": len(encode({"type": "exec_result", "result": result})) - HEADER.size,
        }
        farm, ping, echo = Latency('execute("1")'), Latency("ping"), Latency("raw TCP echo")
        with EchoBaseline(sizes["request_bytes"], sizes["reply_bytes"]) as baseline:
            timed(execute, Latency("warm-up"), plan.rtt_warmup, deadline)
            timed(client.ping, Latency("warm-up"), plan.rtt_warmup, deadline)
            timed(baseline.call, Latency("warm-up"), plan.rtt_warmup, deadline)
            while len(farm.samples_ns) < plan.rtt_calls and not deadline.passed():
                block = min(RTT_BLOCK, plan.rtt_calls - len(farm.samples_ns))
                timed(execute, farm, block, deadline)
                timed(client.ping, ping, block, deadline)
                timed(baseline.call, echo, block, deadline)
        return farm, ping, echo, sizes
    finally:
        client.close_session(sid)


def measure_open(client: KernelClient, plan: Plan, deadline: Deadline) -> Latency:
    """Time ``open_session`` alone; each session is closed again outside the timed part."""
    opens = Latency("open_session")
    warmup = Latency("warm-up")
    for n, out in ((plan.open_warmup, warmup), (plan.opens, opens)):
        for _ in range(n):
            if deadline.passed():
                break
            t0 = time.perf_counter_ns()
            opened = client.open_session()
            out.samples_ns.append(time.perf_counter_ns() - t0)
            client.close_session(opened["session_id"])
    return opens


def _proc_kb(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    found[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return found


def read_memory(pid: int) -> Memory:
    status = _proc_kb(f"/proc/{pid}/status", ("VmRSS",))
    rollup = _proc_kb(f"/proc/{pid}/smaps_rollup", ("Pss", "Private_Clean", "Private_Dirty"))
    private = (
        rollup["Private_Clean"] + rollup["Private_Dirty"]
        if "Private_Clean" in rollup and "Private_Dirty" in rollup
        else None
    )
    return Memory(pid, status.get("VmRSS"), rollup.get("Pss"), private)


def measure_memory(client: KernelClient, plan: Plan, deadline: Deadline) -> list[Memory]:
    """Open idle sessions, run ``x = 1`` in each, then read every session process's memory."""
    sessions: list[tuple[str, int, int]] = []
    try:
        for _ in range(plan.idle_sessions):
            if deadline.passed():
                break
            opened = client.open_session()
            sid, epoch = opened["session_id"], opened["epoch"]
            sessions.append((sid, epoch, 0))
            got = client.execute(sid, "__import__('os').getpid()", epoch=epoch, timeout_s=5.0)
            pid = int(got["value"]["data"]["text/plain"])
            client.execute(sid, "x = 1", epoch=epoch, timeout_s=5.0)
            sessions[-1] = (sid, epoch, pid)
        return [read_memory(pid) for _, _, pid in sessions]
    finally:
        for sid, _, _ in sessions:
            client.close_session(sid)


# --- report -------------------------------------------------------------------------------


def fmt_ns(ns: float) -> str:
    if ns != ns:  # nan
        return "n/a"
    return f"{ns / 1e3:.0f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


def yes_no(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "NO")


def mean_mb(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) / 1024 if known else None


def summarise(
    farm: Latency,
    ping: Latency,
    echo: Latency,
    sizes: dict[str, int],
    opens: Latency,
    memory: list[Memory],
) -> dict[str, Any]:
    ratio = {q: farm.p(q) / echo.p(q) if echo.samples_ns else float("nan") for q in (50, 99)}
    open_ms = {q: opens.p(q) / 1e6 for q in (50, 99)}
    mem = {
        "rss_mb": mean_mb([m.rss_kb for m in memory]),
        "pss_mb": mean_mb([m.pss_kb for m in memory]),
        "uss_mb": mean_mb([m.uss_kb for m in memory]),
    }
    return {
        "rtt": {
            "calls": len(farm.samples_ns),
            "farm_p50_us": farm.p(50) / 1e3,
            "farm_p99_us": farm.p(99) / 1e3,
            "ping_p50_us": ping.p(50) / 1e3,
            "ping_p99_us": ping.p(99) / 1e3,
            "echo_p50_us": echo.p(50) / 1e3,
            "echo_p99_us": echo.p(99) / 1e3,
            "ratio_p50": ratio[50],
            "ratio_p99": ratio[99],
            "goal_ratio": RTT_GOAL_RATIO,
            "met_p50": ratio[50] <= RTT_GOAL_RATIO,
            "met_p99": ratio[99] <= RTT_GOAL_RATIO,
            **sizes,
        },
        "open_session": {
            "opens": len(opens.samples_ns),
            "p50_ms": open_ms[50],
            "p99_ms": open_ms[99],
            "goal_ms": OPEN_GOAL_MS,
            "met_p50": open_ms[50] <= OPEN_GOAL_MS,
            "met_p99": open_ms[99] <= OPEN_GOAL_MS,
        },
        "idle_memory": {
            "sessions": len(memory),
            **mem,
            "goal_mb": MEMORY_GOAL_MB,
            "goal_measure": "uss_mb",
            "met_pss": None if mem["pss_mb"] is None else mem["pss_mb"] <= MEMORY_GOAL_MB,
            "met_uss": None if mem["uss_mb"] is None else mem["uss_mb"] <= MEMORY_GOAL_MB,
            "per_session": [asdict(m) for m in memory],
        },
    }


def render(
    info: dict[str, Any], report: dict[str, Any], farm: Latency, ping: Latency, echo: Latency
) -> str:
    rtt, opn, mem = report["rtt"], report["open_session"], report["idle_memory"]

    def mbs(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f} MB"

    both = "{}/{}".format
    latency = [
        ("latency", "n", "p50", "p99", "goal", "met p50/p99"),
        ('farm execute("1") round trip', rtt["calls"], fmt_ns(farm.p(50)), fmt_ns(farm.p(99))),
        (
            "ping (supervisor only; info)",
            len(ping.samples_ns),
            fmt_ns(ping.p(50)),
            fmt_ns(ping.p(99)),
        ),
        (
            "raw TCP echo (same loopback)",
            len(echo.samples_ns),
            fmt_ns(echo.p(50)),
            fmt_ns(echo.p(99)),
        ),
        (
            "ratio farm/echo",
            "",
            f"{rtt['ratio_p50']:.1f}x",
            f"{rtt['ratio_p99']:.1f}x",
            f"<= {RTT_GOAL_RATIO:g}x",
            both(yes_no(rtt["met_p50"]), yes_no(rtt["met_p99"])),
        ),
        (
            "open_session",
            opn["opens"],
            f"{opn['p50_ms']:.2f} ms",
            f"{opn['p99_ms']:.2f} ms",
            f"<= {OPEN_GOAL_MS:g} ms",
            both(yes_no(opn["met_p50"]), yes_no(opn["met_p99"])),
        ),
    ]
    goal = f"<= {MEMORY_GOAL_MB:g} MB"
    memory = [
        (f"idle memory ({mem['sessions']} sessions)", "", "mean", "goal", "met"),
        ("RSS (counts shared pages)", "", mbs(mem["rss_mb"]), "info only", "-"),
        ("PSS (shared pages split)", "", mbs(mem["pss_mb"]), goal, yes_no(mem["met_pss"])),
        ("USS (private; goal read here)", "", mbs(mem["uss_mb"]), goal, yes_no(mem["met_uss"])),
    ]
    lines = [
        f"farm kernel bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}",
        "",
    ]
    for table in (latency, memory):
        for cells in table:
            padded = [*cells, "", "", "", "", ""][:6]
            lines.append("{:<30} {:>5} {:>10} {:>10} {:>10} {:>11}".format(*padded).rstrip())
        lines.append("")
    lines.append(
        f"frames: execute request {rtt['request_bytes']} B, reply {rtt['reply_bytes']} B "
        f"(the echo uses the same sizes); farm and echo alternate in blocks of {RTT_BLOCK} calls"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    plan = QUICK if args.quick else FULL
    deadline = Deadline(BUDGET_S)
    info = machine()
    with (
        ProcessSandbox(extra_args=["--log-level", "WARNING"]) as sandbox,
        sandbox.kernel() as client,
    ):
        farm, ping, echo, sizes = measure_rtt(client, plan, deadline)
        opens = measure_open(client, plan, deadline)
        memory = measure_memory(client, plan, deadline)
    report = summarise(farm, ping, echo, sizes, opens, memory)
    if deadline.passed():
        report["note"] = f"the {BUDGET_S:g}s budget ran out; some loops took fewer samples"
    table = render(info, report, farm, ping, echo)
    if "note" in report:
        table += "\n" + report["note"]
    return emit(table, {"machine": info, "plan": asdict(plan), **report}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
