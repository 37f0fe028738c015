"""Drain and snapshot benchmark: a worker holding many sessions drained onto another while
clients keep calling, and the snapshot and restore of a session holding 100 MB.

Run with the project venv: ``.venv/bin/python bench/drain.py [--quick] [--json]``.

Figures, all measured in this one run against one local farm (a redis-server and Celery worker
processes with Docker sandboxes; the first worker alone while the sessions open, so it holds
them all, then a second one):

1. ``farm.drain(first)`` of a worker holding ``SESSIONS`` sessions (50) while ``CALLERS``
   threads keep running ``c += 1`` in them: how many sessions keep their variables
   (goal: all of them), how many runs were lost or ran twice (each session's ``c`` against the
   runs its callers saw succeed; goal: none), the drain's time, and each run's latency during
   the drain against before it.
2. ``session.snapshot()`` (bytes to the client) and ``farm.restore`` of a session holding
   ``BIG_MB`` MB (100) of random bytes, against moving the same bytes as a workspace file
   (``session.files.read`` and ``write``): the baseline of carrying that much data in and out
   of a box. Also a kept snapshot (``keep=True``: it stays in the farm's store).

Goals are reported, never asserted. The farm is stopped on exit, also on errors and Ctrl-C.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchlib import Latency, emit, machine, parse_args

from farm.client import Farm, Session
from farm.local.embedded import LocalFarm

READY_S = 180.0
ENV = {"FARM_MAX_SESSIONS": "64", "FARM_BOX_DISK_MB": "64"}  # room for 50 sessions on one
BIG_LIMITS = {"disk_mb": 512, "memory_mb": 512}  # the big session stages its snapshot on disk


@dataclass(frozen=True)
class Plan:
    sessions: int
    callers: int
    big_mb: int


FULL = Plan(sessions=50, callers=8, big_mb=100)
QUICK = Plan(sessions=10, callers=4, big_mb=20)


def wait_ready(farm: Farm, worker_id: str) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if any(w["id"] == worker_id and w.get("ready") for w in farm.workers()):
            return
        time.sleep(0.2)  # poll interval of the deadline-bounded readiness wait
    raise RuntimeError(f"worker {worker_id} never became ready")


class Callers:
    """Threads running ``c += 1`` round robin over the sessions, counting what succeeded."""

    def __init__(self, sessions: list[Session], threads: int) -> None:
        self.sessions = sessions
        self.ok = [0] * len(sessions)
        self.failed: list[str] = []
        self.latency = {"before": Latency("before"), "during": Latency("during")}
        self.phase = "before"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._loop, args=(i, threads), daemon=True)
            for i in range(threads)
        ]

    def _loop(self, first: int, step: int) -> None:
        i = first
        while not self.stop.is_set():
            k = i % len(self.sessions)
            t0 = time.perf_counter()
            try:
                result = self.sessions[k].run("c += 1")
            except Exception as exc:
                with self.lock:
                    self.failed.append(f"{type(exc).__name__}: {exc}")
            else:
                with self.lock:
                    if result.ok:
                        self.ok[k] += 1
                        took = time.perf_counter() - t0
                        self.latency[self.phase].samples_ns.append(int(took * 1e9))
                    else:
                        self.failed.append(repr(result.error))
            i += step

    def __enter__(self) -> Callers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


def percentiles(latency: Latency) -> dict[str, float]:
    return {"p50_ms": latency.p(50) / 1e6, "p99_ms": latency.p(99) / 1e6}


def drain_case(farm: Farm, plan: Plan) -> dict[str, Any]:
    sessions = [farm.session(timeout_s=60) for _ in range(plan.sessions)]
    for i, s in enumerate(sessions):
        s.run(f"v = {i}\nc = 0\ndata = list(range(1000))").raise_for_error()
    first = sessions[0].worker
    assert all(s.worker == first for s in sessions)
    second = str(farm.local_farm.add_worker())
    wait_ready(farm, second)
    # disjoint sessions per caller thread: one call at a time per session, as a client makes
    with Callers(sessions, min(plan.callers, plan.sessions)) as callers:
        time.sleep(2.0)  # traffic before the drain: the latency baseline
        callers.phase = "during"
        t0 = time.perf_counter()
        report = farm.drain(first)
        drain_s = time.perf_counter() - t0
        time.sleep(1.0)  # a little traffic after it, on the new owner
    kept, counted = 0, 0
    for i, s in enumerate(sessions):
        result = s.run("v, c, len(data)")
        if result.ok and result.value is not None:
            v, c, n = eval(result.value.text)  # a tuple of ints the session printed
            kept += v == i and n == 1000 and s.worker == second
            counted += c == callers.ok[i]
    return {
        "sessions": plan.sessions,
        "moved": len(report.moved),
        "kept_variables": kept,
        "runs_counted_exactly": counted,
        "runs_ok": sum(callers.ok),
        "runs_failed": len(callers.failed),
        "failures": callers.failed[:5],
        "drain_s": drain_s,
        "drain_worker_s": report.duration_s,
        "latency_before": percentiles(callers.latency["before"]),
        "latency_during": percentiles(callers.latency["during"]),
    }


def big_case(farm: Farm, plan: Plan) -> dict[str, Any]:
    size = plan.big_mb << 20
    with farm.session(timeout_s=300, limits=BIG_LIMITS) as s:
        s.run(
            f"import os, hashlib\nbig = os.urandom({size})\n"
            "open('big.bin', 'wb').write(big)\ndigest = hashlib.sha256(big).hexdigest()"
        ).raise_for_error()
        digest = s.run("digest").value.text
        t0 = time.perf_counter()
        s.files.read("big.bin")
        read_s = time.perf_counter() - t0
        s.run("os.remove('big.bin')").raise_for_error()
        t0 = time.perf_counter()
        snap = s.snapshot()
        snapshot_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        kept = s.snapshot(keep=True)
        kept_s = time.perf_counter() - t0
    with farm.session(timeout_s=300, limits=BIG_LIMITS) as w:
        t0 = time.perf_counter()
        w.files.write("big.bin", b"\0" * size)
        write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    restored = farm.restore(snap, timeout_s=300)
    restore_s = time.perf_counter() - t0
    same = restored.run("hashlib.sha256(big).hexdigest()").value.text == digest
    restored.close()
    t0 = time.perf_counter()
    again = farm.restore(kept.id or "", timeout_s=300)
    restore_kept_s = time.perf_counter() - t0
    again.close()
    return {
        "mb": plan.big_mb,
        "snapshot_bytes": snap.info.size,
        "snapshot_s": snapshot_s,
        "snapshot_kept_s": kept_s,
        "restore_s": restore_s,
        "restore_kept_s": restore_kept_s,
        "file_read_s": read_s,
        "file_write_s": write_s,
        "restored_intact": same,
    }


def render(info: dict[str, Any], quick: bool, d: dict[str, Any], b: dict[str, Any]) -> str:
    before, during = d["latency_before"], d["latency_during"]
    return "\n".join(
        [
            f"drain bench  {info['date']}  host {info['host']}  {info['cpu']}  "
            f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
            + ("  (--quick)" if quick else ""),
            "",
            f"drain of a worker holding {d['sessions']} sessions, callers running throughout:",
            f"  moved {d['moved']}/{d['sessions']}, kept their variables "
            f"{d['kept_variables']}/{d['sessions']} (goal: all)",
            f"  runs: {d['runs_ok']} ok, {d['runs_failed']} failed; sessions whose count equals "
            f"their callers' successes {d['runs_counted_exactly']}/{d['sessions']} "
            "(goal: all: no run lost, none twice)",
            f"  drain {d['drain_s']:.2f} s ({d['drain_s'] / max(d['moved'], 1) * 1000:.0f} ms a "
            f"session); run p50/p99 {before['p50_ms']:.1f}/{before['p99_ms']:.1f} ms before, "
            f"{during['p50_ms']:.1f}/{during['p99_ms']:.1f} ms during (p99 during/before "
            f"{during['p99_ms'] / max(before['p99_ms'], 1e-9):.1f}x)",
            "",
            f"a session holding {b['mb']} MB (snapshot {b['snapshot_bytes'] / 2**20:.1f} MiB):",
            f"  snapshot to bytes {b['snapshot_s']:.2f} s, kept {b['snapshot_kept_s']:.2f} s; "
            f"file read baseline {b['file_read_s']:.2f} s "
            f"(ratio {b['snapshot_s'] / b['file_read_s']:.2f})",
            f"  restore from bytes {b['restore_s']:.2f} s, from kept {b['restore_kept_s']:.2f} s;"
            f" file write baseline {b['file_write_s']:.2f} s "
            f"(ratio {b['restore_s'] / b['file_write_s']:.2f}); intact: {b['restored_intact']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    plan = QUICK if args.quick else FULL
    info = machine()
    local = LocalFarm(1, env=ENV).start()
    with Farm(local.settings(), owned=local) as farm:
        drained = drain_case(farm, plan)
        big = big_case(farm, plan)
    table = render(info, args.quick, drained, big)
    data = {"machine": info, "plan": asdict(plan), "drain": drained, "big": big}
    return emit(table, data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
