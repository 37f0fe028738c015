"""Soak: many execs through a local farm; do its resources stay flat?

A local farm (redis-server, ``--workers`` Celery workers, their Docker sandboxes) serves
``--sessions`` sessions; ``--threads`` client threads take sessions in turn and run one cell
each until ``--execs`` cells ran. The mix: a counter increment in every cell, with output
every 10th cell, a user error every 50th and some computation every 100th. Each session's
counter is checked at the end, so a lost or doubled exec is caught, not just counted.

Sampled cold, at the start (after ``--warmup`` cells, so every client thread, worker thread
and kernel connection exists), ``--samples`` times during the run, at the end (sessions still
open) and after closing the sessions: open fds, RSS and threads of the worker processes, RSS
and fds of the kernel supervisors and the RSS of their whole containers, zombies among the
farm's processes, sandbox containers, Redis keys and memory, and this client's fds and RSS.
The baseline is the start sample of the same run; the goal is "flat": end minus start within
the tolerances in ``FLAT``. Process figures come from the host's ``/proc`` (run as root to see
into the containers). The exit status is 0 whether or not the goal is met; ``--json PATH``
writes every figure for ``scripts/reliability_report.py``.

``python bench/soak.py [--execs 10000] [--sessions 50] [--workers 2] [--json PATH]``
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
from benchlib import machine, write_json

from farm.client import Farm, Session
from farm.local.embedded import LocalFarm

# metric -> (allowed growth from start to end, as a fraction, and in absolute units)
FLAT: dict[str, tuple[float, float]] = {
    "worker_rss_kb": (0.10, 10 * 1024),
    "worker_fds": (0.0, 4),
    "worker_threads": (0.0, 2),
    "kernel_rss_kb": (0.10, 4 * 1024),
    "kernel_fds": (0.0, 2),
    "container_rss_kb": (0.10, 32 * 1024),
    "farm_zombies": (0.0, 0),
    "containers": (0.0, 0),
    "client_fds": (0.0, 4),
}


# --- what a sample reads --------------------------------------------------------------------


def _status(pid: int) -> dict[str, str]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            out[key] = value.strip()
    except OSError:
        pass
    return out


def rss_kb(pid: int) -> int:
    return int(_status(pid).get("VmRSS", "0 kB").split()[0])


def pss_kb(pid: int) -> int:
    """Proportional set size: each shared page counted once over the processes sharing it."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process on the host."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(name)] = (int(fields[1]), fields[0])
    return table


def descendants(table: dict[int, tuple[int, str]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


class Sampler:
    def __init__(self, local: LocalFarm, farm: Farm, client: docker.DockerClient) -> None:
        self.local = local
        self.farm = farm
        self.docker = client

    def _containers(self) -> list[Any]:
        found = []
        for worker_id in self.local.workers:
            found += self.docker.containers.list(
                ignore_removed=True, all=True, filters={"label": f"farm.owner={worker_id}"}
            )
        return found

    def sample(self, label: str, execs: int) -> dict[str, Any]:
        table = process_table()
        workers = [p.pid for p in self.local.workers.values() if p.poll() is None]
        kernels, container_rss = [], 0
        containers = self._containers()
        farm_pids = set()
        for worker in workers:
            farm_pids.update(descendants(table, worker))
        for container in containers:
            if container.status != "running":
                continue
            init = int(container.attrs["State"]["Pid"])
            tree = descendants(table, init)
            farm_pids.update(tree)
            container_rss += sum(rss_kb(pid) for pid in tree)
            kernels += [pid for pid in tree if table.get(pid, (0, ""))[0] == init]
        info = self.farm.registry.redis.info("memory")
        return {
            "label": label,
            "execs": execs,
            "at": time.time(),
            "worker_rss_kb": sum(rss_kb(p) for p in workers),
            "worker_fds": sum(fds(p) for p in workers),
            "worker_threads": sum(int(_status(p).get("Threads", "0")) for p in workers),
            "kernel_rss_kb": sum(rss_kb(p) for p in kernels),
            "kernel_fds": sum(fds(p) for p in kernels),
            "container_rss_kb": container_rss,
            "container_processes": sum(
                len(descendants(table, int(c.attrs["State"]["Pid"])))
                for c in containers
                if c.status == "running"
            ),
            "farm_zombies": sum(1 for p in farm_pids if table.get(p, (0, ""))[1] == "Z"),
            "host_zombies": sum(1 for _, state in table.values() if state == "Z"),
            "containers": len(containers),
            "redis_keys": int(self.farm.registry.redis.dbsize()),
            "redis_used_kb": int(info["used_memory"]) // 1024,
            "client_fds": fds(os.getpid()),
            "client_rss_kb": rss_kb(os.getpid()),
        }


# --- the load -------------------------------------------------------------------------------


def cell(n: int) -> str:
    """The n-th cell of a session: always increments the counter (an error comes after)."""
    code = "counter += 1"
    if n % 10 == 0:
        code += "\nprint('soak ' * 20)"
    if n % 100 == 0:
        code += "\nsum(i * i for i in range(20000))"
    if n % 50 == 0:
        code += "\nraise ValueError('an expected user error')"
    return code


class Load:
    """Client threads taking sessions in turn, one cell at a time; ``run(n)`` runs n cells."""

    def __init__(self, sessions: list[Session], threads: int) -> None:
        self.sessions = sessions
        self.threads = threads
        self.done = 0
        self.counts = {s.id: 0 for s in sessions}
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._tickets: Iterator[int] = iter(())
        self._goal = 0
        self._idle: queue.Queue[Session] = queue.Queue()
        for s in sessions:
            self._idle.put(s)

    def _work(self) -> None:
        while next(self._tickets) < self._goal:
            session = self._idle.get()
            n = self.counts[session.id] + 1
            t0 = time.perf_counter()
            try:
                result = session.run(cell(n), timeout_s=30)
                if (n % 50 == 0) == result.ok:  # an error where none belongs, or vice versa
                    self.failures.append(f"{session.id} cell {n}: {result.error}")
            except Exception as exc:
                self.failures.append(f"{session.id} cell {n}: {type(exc).__name__}: {exc}")
            elapsed = time.perf_counter() - t0
            with self._lock:
                self.counts[session.id] = n
                self.done += 1
                self.latencies.append(elapsed)
            self._idle.put(session)

    def start(self, n: int) -> list[threading.Thread]:
        """Start ``n`` more cells on the client threads; join the threads to wait for them."""
        self._tickets = itertools.count(self.done)
        self._goal = self.done + n
        threads = [
            threading.Thread(target=self._work, name=f"soak-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for thread in threads:
            thread.start()
        return threads


def verify_counters(load: Load) -> list[str]:
    """Every session's counter equals the cells it ran: no exec lost, none run twice."""
    wrong = []
    for session in load.sessions:
        result = session.run("counter", timeout_s=30)
        expected = str(load.counts[session.id])
        if result.value is None or result.value.text != expected:
            wrong.append(f"{session.id}: counter {result.value} != {expected}")
    return wrong


def soak(args: argparse.Namespace) -> dict[str, Any]:
    client = docker.from_env()
    local = LocalFarm(args.workers).start()
    farm = Farm(local.settings(), owned=local)
    try:
        sampler = Sampler(local, farm, client)
        sessions = [farm.session() for _ in range(args.sessions)]
        for s in sessions:
            s.run("counter = 0")
        samples = [sampler.sample("cold", 0)]
        load = Load(sessions, args.threads)
        for thread in load.start(args.warmup):  # every thread and connection in use once
            thread.join()
        samples.append(sampler.sample("start", 0))
        t0 = time.perf_counter()
        threads = load.start(args.execs)
        step = max(1, args.execs // args.samples)
        next_sample = load.done + step
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)  # sampling interval while the load runs
            if next_sample <= load.done < args.warmup + args.execs:
                ran = load.done - args.warmup
                samples.append(sampler.sample(f"{ran}", ran))
                next_sample += step
        elapsed = time.perf_counter() - t0
        measured = load.done - args.warmup
        samples.append(sampler.sample("end", measured))
        wrong = verify_counters(load)
        for s in sessions:
            s.close()
        time.sleep(1.0)  # let the kernels reap the closed sessions before the last sample
        samples.append(sampler.sample("closed", measured))
        workers = {w["id"]: w.get("sessions") for w in farm.workers()}
    finally:
        farm.close()
        client.close()
    lat = sorted(load.latencies[args.warmup :])
    return {
        "machine": machine(),
        "config": vars(args),
        "execs": measured,
        "warmup_execs": args.warmup,
        "elapsed_s": elapsed,
        "execs_per_s": measured / elapsed if elapsed else 0.0,
        "latency_ms": {
            "p50": statistics.median(lat) * 1e3 if lat else None,
            "p99": lat[int(len(lat) * 0.99) - 1] * 1e3 if lat else None,
        },
        "failures": load.failures[:20],
        "failure_count": len(load.failures),
        "counter_mismatches": wrong,
        "sessions_per_worker_after_close": workers,
        "samples": samples,
        "flat": verdicts(samples[1], samples[-2]),
    }


def verdicts(start: dict[str, Any], end: dict[str, Any]) -> dict[str, bool]:
    flat = {}
    for metric, (fraction, absolute) in FLAT.items():
        allowed = max(start[metric] * fraction, absolute)
        flat[metric] = end[metric] - start[metric] <= allowed
    return flat


def render(out: dict[str, Any]) -> str:
    m = out["machine"]
    samples: list[dict[str, Any]] = out["samples"]
    cold, first, end, closed = samples[0], samples[1], samples[-2], samples[-1]
    lines = [
        f"farm soak  {m['date']}  host {m['host']}  {m['cpu']}  {m['cores']} cores  "
        f"Python {m['python']}",
        f"{out['execs']} execs (after {out['warmup_execs']} to warm up), "
        f"{out['config']['sessions']} sessions, "
        f"{out['config']['workers']} workers, {out['config']['threads']} client threads: "
        f"{out['elapsed_s']:.1f}s, {out['execs_per_s']:.0f} execs/s, p50 "
        f"{out['latency_ms']['p50']:.1f} ms, p99 {out['latency_ms']['p99']:.1f} ms; "
        f"{out['failure_count']} unexpected results, {len(out['counter_mismatches'])} counter "
        "mismatches",
        "",
        f"{'metric':<22}{'cold':>12}{'start':>12}{'end':>12}{'end/start':>11}{'closed':>12}  flat",
    ]
    for metric in first:
        if metric in ("label", "execs", "at"):
            continue
        ratio = end[metric] / first[metric] if first[metric] else float("nan")
        verdict = "" if metric not in out["flat"] else "yes" if out["flat"][metric] else "NO"
        lines.append(
            f"{metric:<22}{cold[metric]:>12}{first[metric]:>12}{end[metric]:>12}{ratio:>11.2f}"
            f"{closed[metric]:>12}  {verdict}"
        )
    trend = "  ".join(f"{s['label']}:{s['worker_rss_kb'] // 1024}M" for s in out["samples"])
    lines += ["", f"worker RSS over the run: {trend}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--execs", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16, help="client threads")
    parser.add_argument("--warmup", type=int, default=500, help="execs before the start sample")
    parser.add_argument("--samples", type=int, default=5, help="samples during the run")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    out = soak(args)
    print(render(out))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
