"""The load suite's memory: each worker's process tree (its sandbox's processes included) and
redis-server, RSS and PSS, sampled on a thread of its own; at the start and the end also by
role (the worker, its sandbox's supervisor, zygote, box inits and boxes), so that a tree that
grew says which of its parts did.
"""

from __future__ import annotations

import threading

import docker
from soak import descendants, process_table, pss_kb, rss_kb

from farm.local.embedded import LocalFarm

SAMPLE_S = 2.0
ROLES = ("docker-init", "supervisor", "zygote", "box inits", "boxes")  # by depth in the container


def sandbox_roles(table: dict[int, tuple[int, str]], init: int) -> dict[int, str]:
    """A sandbox container's processes by role: their depth below its init (docker-init)."""
    found, todo = {}, [(init, 0)]
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid, depth = todo.pop()
        found[pid] = ROLES[min(depth, len(ROLES) - 1)]
        todo.extend((kid, depth + 1) for kid in children.get(pid, []))
    return found


def _by_role(roles: dict[int, str], pss: dict[int, int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for pid, role in roles.items():
        entry = out.setdefault(role, [0, 0])
        entry[0] += pss.get(pid, 0)
        entry[1] += 1
    return out


class Memory:
    """RSS and PSS (kB) of each worker's process tree, its sandbox container's processes
    included, and of redis-server, sampled on a thread of its own. The goal reads PSS: a box's
    processes are forks of its kernel's zygote, and RSS counts their shared pages once per
    process, so one box more alive at the end reads as ~20 MB of growth."""

    def __init__(self, local: LocalFarm) -> None:
        self.local = local
        self.docker = docker.from_env()
        self.samples: list[dict[str, int]] = []
        self.pss: list[dict[str, int]] = []
        self.roles: list[dict[str, dict[str, list[int]]]] = []  # tree: role: [PSS kB, count]
        self.stop = threading.Event()
        self.names = {}
        for image in sorted(set(local.worker_images.values())):
            mine = [w for w, i in local.worker_images.items() if i == image]
            self.names.update({w: f"worker {image}-{n + 1}" for n, w in enumerate(mine)})
        self.thread = threading.Thread(target=self._run, name="load-rss", daemon=True)

    def read(self) -> dict[str, int]:
        table = process_table()
        trees, roles = {}, {}
        for worker_id, proc in self.local.workers.items():
            name = self.names.get(worker_id, worker_id)
            pids = set(descendants(table, proc.pid)) if proc.poll() is None else set()
            roles[name] = dict.fromkeys(pids, "worker")
            for c in self.docker.containers.list(filters={"label": f"farm.owner={worker_id}"}):
                roles[name] |= sandbox_roles(table, int(c.attrs["State"]["Pid"]))
            trees[name] = set(roles[name])
        assert self.local.redis.proc is not None  # started, and stopped only at the end
        trees["redis-server"] = {self.local.redis.proc.pid}
        out = {name: sum(rss_kb(pid) for pid in pids) for name, pids in trees.items()}
        self.samples.append(out)
        pss = {pid: pss_kb(pid) for pids in trees.values() for pid in pids}
        self.pss.append({name: sum(pss[pid] for pid in pids) for name, pids in trees.items()})
        self.roles.append({name: _by_role(kinds, pss) for name, kinds in roles.items()})
        return out

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self.read()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.docker.close()
