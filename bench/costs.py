"""What a stretch of farm work cost each part of a local farm: Redis and CPU, read before and after.

Imported as ``costs`` by the benchmarks (``bench/`` is first on ``sys.path``). A ``Snapshot``
holds, at one instant:

- the farm's redis-server, for every client at once: ``INFO commandstats`` (calls by command
  name), ``INFO stats`` (``total_net_input_bytes``, ``total_net_output_bytes``), ``INFO cpu``
  (``used_cpu_sys + used_cpu_user``, its main thread and background threads), ``INFO
  memory`` (``used_memory``) and ``INFO keyspace`` (keys: what an item leaves behind until
  its keys expire);
- CPU seconds (user + system, all threads) of the client (this process, ``getrusage``), of each
  worker process (``/proc/PID/stat``) and of each sandbox container (its cgroup's CPU
  accounting: v1 ``cpuacct.usage`` or v2 ``cpu.stat``; what runs inside, kernel and boxes);
- the sandbox's CPU by role (``sandbox_roles``, from the host's ``/proc`` of the container's
  processes: each one's own time and what it reaped): the supervisor, the zygote, the boxes'
  inits (making, serving and emptying boxes), the processes in boxes (session processes and
  commands, reaped by their init), boxes ended whole (reaped by the zygote), and what the
  cgroup was charged outside any process's times (the kernel's teardown of namespaces);
- the wall clock, the load average, and the busy CPU seconds of the whole machine
  (``/proc/stat``), so that a cost can say how much of the machine *other* processes used
  meanwhile (``others_share``: busy CPU not accounted to the farm's parts above, over the
  cores' time). The load average counts the farm's own boxes too (a map runs dozens at once),
  so it says little about interference; ``others_share`` does.

``Snapshot.take(farm)`` reads them; ``later - earlier`` is a ``Cost``, divided by the items
it covered for per-item figures. The benchmark's own ``INFO`` calls are left out of the
command counts.
"""

from __future__ import annotations

import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from farm.client import Farm

CLK_TCK = os.sysconf("SC_CLK_TCK")
OWN_COMMANDS = {"info"}  # what the snapshots themselves send
CGROUP_CPU = (
    # (path pattern, file, factor to seconds, key in the file or None for a bare number)
    ("/sys/fs/cgroup/cpuacct/docker/{id}", "cpuacct.usage", 1e-9, None),
    ("/sys/fs/cgroup/cpu,cpuacct/docker/{id}", "cpuacct.usage", 1e-9, None),
    ("/sys/fs/cgroup/system.slice/docker-{id}.scope", "cpu.stat", 1e-6, "usage_usec"),
    ("/sys/fs/cgroup/docker/{id}", "cpu.stat", 1e-6, "usage_usec"),
)


def machine_busy_s() -> float:
    """Busy CPU seconds of all cores since boot (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Others:
    """For a stretch run by this process and its children only (the baselines): the share of
    all cores' time that other processes used meanwhile. ``with Others() as o: ...``, then
    ``o.share``."""

    def __enter__(self) -> Others:
        self.share = float("nan")
        self._start = (time.perf_counter(), machine_busy_s(), _own_and_children_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, ours = self._start
        seconds = time.perf_counter() - wall
        others = machine_busy_s() - busy - (_own_and_children_s() - ours)
        self.share = max(0.0, others) / max(1e-9, seconds * (os.cpu_count() or 1))


def _own_and_children_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def container_cpu_s(container_id: str) -> float | None:
    """CPU seconds of a container's cgroup so far, or ``None`` where it cannot be read."""
    for pattern, name, factor, key in CGROUP_CPU:
        path = Path(pattern.format(id=container_id)) / name
        try:
            text = path.read_text()
        except OSError:
            continue
        if key is None:
            return int(text.strip()) * factor
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v) * factor
    return None


ROLES = ("supervisor", "zygote", "box inits", "in boxes", "boxes ended", "outside processes")


def _stat(pid: str) -> tuple[int, float, float] | None:
    """A process's parent, own CPU seconds and its reaped children's (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return int(fields[1]), own, (int(fields[13]) + int(fields[14])) / CLK_TCK


def sandbox_roles(container_id: str) -> dict[str, float]:
    """CPU seconds so far of a sandbox container's processes, by role (``ROLES``), read from
    the host: the container's init (docker-init) runs the supervisor, whose child is the
    zygote, whose children are the boxes' inits, whose children are the boxes' processes.
    Processes that ended count in their reaper's children's time: a session process in its
    init's (``in boxes``), an init in the zygote's (``boxes ended``). ``outside processes``
    is the cgroup's charge less all of that (only meaningful as a difference)."""
    for pattern, *_ in CGROUP_CPU:
        try:
            pids = (Path(pattern.format(id=container_id)) / "cgroup.procs").read_text().split()
            break
        except OSError:
            continue
    else:
        return {}
    stats = {int(pid): got for pid in pids if (got := _stat(pid)) is not None}
    depth: dict[int, int] = {}

    def depth_of(pid: int) -> int:
        if pid not in depth:
            parent = stats[pid][0]
            depth[pid] = 0 if parent not in stats else depth_of(parent) + 1
        return depth[pid]

    roles = dict.fromkeys(ROLES, 0.0)
    for pid, (_, own, reaped) in stats.items():
        level = depth_of(pid)  # 0: docker-init
        if level == 1:
            roles["supervisor"] += own
        elif level == 2:
            roles["zygote"] += own
            roles["boxes ended"] += reaped
        elif level == 3:
            roles["box inits"] += own
            roles["in boxes"] += reaped
        elif level >= 4:
            roles["in boxes"] += own
    total = container_cpu_s(container_id)
    if total is not None:
        roles["outside processes"] = total - sum(roles.values())
    return roles


def sandbox_containers(farm: Farm) -> dict[str, str]:
    """Container id -> worker id of the sandboxes of a local farm's workers (by their label)."""
    local = farm.local_farm
    pids = {str(proc.pid): worker_id for worker_id, proc in local.workers.items()}
    client = docker.from_env()
    try:
        found = client.containers.list(filters={"label": "farm.managed=1"}, ignore_removed=True)
        return {c.id: pids[c.labels["farm.pid"]] for c in found if c.labels.get("farm.pid") in pids}
    finally:
        client.close()


@dataclass
class Snapshot:
    wall: float
    load: tuple[float, float, float]
    commands: Counter[str]
    net_in: int
    net_out: int
    redis_cpu_s: float
    redis_memory: int
    redis_keys: int
    client_cpu_s: float
    worker_cpu_s: float
    sandbox_cpu_s: float | None
    machine_busy_s: float
    roles: dict[str, dict[str, float]] = field(default_factory=dict)  # by container id

    @classmethod
    def take(cls, farm: Farm) -> Snapshot:
        redis = farm.local_farm.redis.client(socket_timeout=10)
        try:
            stats = redis.info("commandstats")
            info = {**redis.info("stats"), **redis.info("cpu"), **redis.info("memory")}
            keys = sum(int(db.get("keys", 0)) for db in redis.info("keyspace").values())
        finally:
            redis.close()
        own = resource.getrusage(resource.RUSAGE_SELF)
        sandbox: float | None = 0.0
        roles: dict[str, dict[str, float]] = {}
        for container_id in sandbox_containers(farm):
            used = container_cpu_s(container_id)
            sandbox = None if used is None or sandbox is None else sandbox + used
            roles[container_id] = sandbox_roles(container_id)
        return cls(
            wall=time.perf_counter(),
            load=os.getloadavg(),
            commands=Counter(
                {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
            ),
            net_in=int(info["total_net_input_bytes"]),
            net_out=int(info["total_net_output_bytes"]),
            redis_cpu_s=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
            redis_memory=int(info["used_memory"]),
            redis_keys=keys,
            client_cpu_s=own.ru_utime + own.ru_stime,
            worker_cpu_s=sum(process_cpu_s(p.pid) for p in farm.local_farm.workers.values()),
            sandbox_cpu_s=sandbox,
            machine_busy_s=machine_busy_s(),
            roles=roles,
        )

    def __sub__(self, earlier: Snapshot) -> Cost:
        commands = Counter(self.commands)
        commands.subtract(earlier.commands)
        for name in OWN_COMMANDS:
            commands.pop(name, None)
        sandbox = (
            None
            if self.sandbox_cpu_s is None or earlier.sandbox_cpu_s is None
            else self.sandbox_cpu_s - earlier.sandbox_cpu_s
        )
        seconds = self.wall - earlier.wall
        kept = set(self.roles) & set(earlier.roles)
        ours = (
            self.client_cpu_s
            - earlier.client_cpu_s
            + self.worker_cpu_s
            - earlier.worker_cpu_s
            + (sandbox or 0.0)
            + self.redis_cpu_s
            - earlier.redis_cpu_s
        )
        others = self.machine_busy_s - earlier.machine_busy_s - ours
        return Cost(
            seconds=seconds,
            others_share=max(0.0, others) / max(1e-9, seconds * (os.cpu_count() or 1)),
            load=self.load,
            commands=+commands,
            net_in=self.net_in - earlier.net_in,
            net_out=self.net_out - earlier.net_out,
            redis_cpu_s=self.redis_cpu_s - earlier.redis_cpu_s,
            redis_memory=self.redis_memory - earlier.redis_memory,
            redis_keys=self.redis_keys - earlier.redis_keys,
            cpu_s={
                "client": self.client_cpu_s - earlier.client_cpu_s,
                "workers": self.worker_cpu_s - earlier.worker_cpu_s,
                "sandboxes": sandbox,
                "redis": self.redis_cpu_s - earlier.redis_cpu_s,
            },
            # sandboxes present at both ends only (one replaced meanwhile counts in neither)
            roles={
                k: sum(self.roles[c].get(k, 0.0) - earlier.roles[c].get(k, 0.0) for c in kept)
                for k in ROLES
            },
            sandboxes_replaced=len(set(earlier.roles) - kept),
        )


@dataclass
class Cost:
    """What happened between two snapshots; ``per(n)`` divides it by ``n`` items."""

    seconds: float
    load: tuple[float, float, float]
    others_share: float = 0.0  # of all cores' time, used by processes not of this farm
    commands: Counter[str] = field(default_factory=Counter)
    net_in: int = 0
    net_out: int = 0
    redis_cpu_s: float = 0.0
    redis_memory: int = 0
    redis_keys: int = 0
    cpu_s: dict[str, float | None] = field(default_factory=dict)
    roles: dict[str, float] = field(default_factory=dict)  # the sandboxes' CPU s by role
    sandboxes_replaced: int = 0  # sandboxes gone between the snapshots (left out of roles)

    def per(self, n: int, idle: Cost | None = None) -> dict[str, Any]:
        """Per item (``commands`` per item by name, most first; bytes, redis CPU and memory
        per 1,000 items; CPU ms per item by part). With ``idle`` (a stretch of the same farm
        doing nothing), also the commands per item that the idle rate does not explain."""
        n = max(1, n)
        total = self.commands.total()
        out: dict[str, Any] = {
            "others_share": self.others_share,
            "commands_per_item": total / n,
            "by_command": {k: v / n for k, v in self.commands.most_common()},
            "net_in_bytes_per_1000": 1000 * self.net_in / n,
            "net_out_bytes_per_1000": 1000 * self.net_out / n,
            "redis_cpu_s_per_1000": 1000 * self.redis_cpu_s / n,
            "redis_memory_bytes_per_item": self.redis_memory / n,
            "redis_keys_per_item": self.redis_keys / n,
            "cpu_ms_per_item": {
                k: None if v is None else 1e3 * v / n for k, v in self.cpu_s.items()
            },
        }
        out["sandbox_ms_per_item"] = {k: 1e3 * v / n for k, v in self.roles.items()}
        out["sandboxes_replaced"] = self.sandboxes_replaced
        known = [v for v in self.cpu_s.values() if v is not None]
        out["cpu_ms_per_item"]["total"] = 1e3 * sum(known) / n
        if idle is not None and idle.seconds > 0:
            background = idle.commands.total() / idle.seconds * self.seconds
            out["idle_commands_per_item"] = background / n
            out["commands_per_item_net_of_idle"] = (total - background) / n
        return out

    def rate(self) -> dict[str, Any]:
        """Per second (for an idle stretch): commands by name, redis CPU."""
        s = max(1e-9, self.seconds)
        return {
            "commands_per_s": self.commands.total() / s,
            "by_command": {k: v / s for k, v in self.commands.most_common()},
            "redis_cpu_ms_per_s": 1e3 * self.redis_cpu_s / s,
            "worker_cpu_ms_per_s": 1e3 * (self.cpu_s.get("workers") or 0.0) / s,
            "sandbox_ms_per_s": {k: 1e3 * v / s for k, v in self.roles.items()},
            "others_share": self.others_share,
        }
