"""Boxes benchmark: what a box with namespaces costs against a uid box, in one run.

Run with the project venv: ``.venv/bin/python bench/boxes.py [--quick] [--json]``.

Both kinds are measured here, one after the other in alternating rounds, on this machine:
``namespaces`` (the default: mount, pid, network, IPC and UTS namespaces per box) and ``uids``
(``FARM_SANDBOX_ISOLATION=uids``: what boxes were before, and what a host that forbids
namespaces falls back to).

1. ``open_session`` from a spare (a Docker sandbox's kernel, directly): p50/p99, each session
   closed and the spares given time to be made again outside the timed part. Goal: p50 <= 1 ms
   with namespaces.
2. One-shot items at the kernel (``item`` requests of ``1+1`` from ``THREADS`` threads, each
   a box opened, run and closed): items/s.
3. ``Farm.map`` of trivial items on ``Farm.local(workers=2)``: items/s. Goal: namespaces >=
   0.9x uids.

Goals are reported, never asserted: the program exits 0 when a goal is missed. Every sandbox,
farm and container started here is stopped on exit, also on errors.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import Latency, emit, machine, parse_args

from farm.client import Farm
from farm.kernel.wire.client import KernelClient
from farm.sandbox.docker import DockerSandbox
from farm.settings import SandboxLimits

KINDS = ("uids", "namespaces")
THREADS = 8
OPEN_GOAL_MS = 1.0
MAP_GOAL_RATIO = 0.9
SPARE_WAIT_S = 10.0


@dataclass(frozen=True)
class Plan:
    rounds: int
    opens: int
    items: int
    map_items: int


FULL = Plan(rounds=3, opens=100, items=600, map_items=2000)
QUICK = Plan(rounds=2, opens=30, items=150, map_items=400)


@contextmanager
def sandbox(kind: str) -> Iterator[DockerSandbox]:
    box = DockerSandbox(
        owner=f"bench-boxes-{os.getpid()}",
        limits=SandboxLimits(isolation=kind),
        socket_dir=Path("/tmp/farm-sockets"),
    )
    with box:
        yield box


def spares_ready(client: KernelClient) -> None:
    """Wait (polling the kernel, with a deadline) until its two spares are made again."""
    deadline = time.monotonic() + SPARE_WAIT_S
    while client.ping()["spares"] < 2 and time.monotonic() < deadline:
        time.sleep(0.002)  # poll interval of the deadline above


def opens(client: KernelClient, n: int, out: Latency) -> None:
    for _ in range(n):
        spares_ready(client)
        t0 = time.perf_counter()
        opened = client.open_session()
        out.samples_ns.append(int(1e9 * (time.perf_counter() - t0)))
        client.close_session(opened["session_id"])


def items(box: DockerSandbox, n: int) -> float:
    """Items/s of ``n`` one-shot boxes from ``THREADS`` threads, each with its own client."""
    left = list(range(n))
    lock = threading.Lock()

    def loop() -> None:
        with box.kernel() as client:
            while True:
                with lock:
                    if not left:
                        return
                    left.pop()
                client.item(uuid.uuid4().hex, ["1+1"], timeout_s=30)

    threads = [threading.Thread(target=loop) for _ in range(THREADS)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return n / (time.perf_counter() - t0)


def farm_map(kind: str, n: int) -> float:
    os.environ["FARM_SANDBOX_ISOLATION"] = kind  # the local farm's workers read it
    try:
        with Farm.local(workers=2) as farm:
            for _ in farm.map(["x = 1"] * 50):  # warm-up: spares made, connections open
                pass
            t0 = time.perf_counter()
            done = sum(1 for record in farm.map(["1+1"] * n) if record.status == "ok")
            per_s = done / (time.perf_counter() - t0)
    finally:
        del os.environ["FARM_SANDBOX_ISOLATION"]
    return per_s


def measure(plan: Plan) -> dict[str, Any]:
    opened = {kind: Latency(kind) for kind in KINDS}
    item_rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    map_rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with sandbox("uids") as uids, sandbox("namespaces") as spaces:
        boxes = {"uids": uids, "namespaces": spaces}
        for kind in KINDS:
            assert boxes[kind].isolation == kind, (kind, boxes[kind].isolation)
        for _ in range(plan.rounds):
            for kind, box in boxes.items():
                with box.kernel() as client:
                    opens(client, plan.opens // plan.rounds, opened[kind])
                item_rates[kind].append(items(box, plan.items // plan.rounds))
    for _ in range(max(1, plan.rounds - 1)):
        for kind in KINDS:
            map_rates[kind].append(farm_map(kind, plan.map_items))
    return {
        kind: {
            "open_p50_ms": opened[kind].p(50) / 1e6,
            "open_p99_ms": opened[kind].p(99) / 1e6,
            "items_per_s": max(item_rates[kind]),
            "map_items_per_s": max(map_rates[kind]),
        }
        for kind in KINDS
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    plan = QUICK if args.quick else FULL
    info = machine()
    measured = measure(plan)
    ns, uids = measured["namespaces"], measured["uids"]
    ratios = {
        "open p50, namespaces / uids": ns["open_p50_ms"] / uids["open_p50_ms"],
        "kernel items/s, namespaces / uids": ns["items_per_s"] / uids["items_per_s"],
        "Farm.map items/s, namespaces / uids": ns["map_items_per_s"] / uids["map_items_per_s"],
    }
    goals = {
        f"open p50 <= {OPEN_GOAL_MS:g} ms": ns["open_p50_ms"] <= OPEN_GOAL_MS,
        f"Farm.map >= {MAP_GOAL_RATIO:g}x uids": ratios["Farm.map items/s, namespaces / uids"]
        >= MAP_GOAL_RATIO,
    }
    data = {"machine": info, "plan": plan.__dict__, "measured": measured, "ratios": ratios}
    data["goals"] = goals
    lines = [f"bench/boxes.py ({'quick' if args.quick else 'full'}) on {info}"]
    lines.append(f"{'':38} {'uids':>12} {'namespaces':>12}")
    for key in ("open_p50_ms", "open_p99_ms", "items_per_s", "map_items_per_s"):
        lines.append(f"{key:38} {uids[key]:12.2f} {ns[key]:12.2f}")
    lines += [f"{name:38} {value:12.2f}x" for name, value in ratios.items()]
    lines += [f"goal {name}: {'met' if ok else 'MISSED'}" for name, ok in goals.items()]
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
