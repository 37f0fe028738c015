"""Who got the farm during a level of the overload suite (``bench/load.py``): boxes and CPU.

``Shares`` samples, once a second, the boxes each kind of work held on the default image's
workers (sessions, map items; from their ``room`` in the registry) and, over the level, the
CPU seconds of the farm (its workers with their sandboxes' containers, redis-server, ``farm
serve``) against this process's own, the load generator's, which shares the machine's cores.
"""

from __future__ import annotations

import glob
import os
import resource
import threading
from typing import Any

from soak import descendants, process_table

from farm.client import Farm

TICKS = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return 0.0
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _container_cpu_s(container_id: str) -> float:
    """A container's CPU seconds from its cgroup (v1's cpuacct, or v2's cpu.stat)."""
    for path in glob.glob(f"/sys/fs/cgroup/cpuacct/docker/{container_id}*/cpuacct.usage"):
        with open(path) as f:
            return int(f.read()) / 1e9
    for path in glob.glob(f"/sys/fs/cgroup/system.slice/docker-{container_id}*.scope/cpu.stat"):
        with open(path) as f:
            for line in f:
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
    return 0.0


class Shares:
    """Boxes held by kind, sampled, and CPU seconds by part, over one level."""

    def __init__(self, farm: Farm, pids: dict[str, list[int]], containers: list[str]) -> None:
        self.farm = farm
        self.pids = pids  # part -> the processes whose trees are that part
        self.containers = containers
        self.held: list[dict[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load-shares", daemon=True)

    def cpu(self) -> dict[str, float]:
        table = process_table()
        out = {
            part: sum(_proc_cpu_s(p) for pid in pids for p in {pid, *descendants(table, pid)})
            for part, pids in self.pids.items()
        }
        out["sandboxes"] = sum(_container_cpu_s(c) for c in self.containers)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["load generator"] = usage.ru_utime + usage.ru_stime
        return out

    def __enter__(self) -> Shares:
        self.start_cpu = self.cpu()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.end_cpu = self.cpu()

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            held: dict[str, int] = {}
            for worker in self.farm.workers():
                if worker.get("image") == "default":
                    for kind, n in ((worker.get("room") or {}).get("held") or {}).items():
                        held[kind] = held.get(kind, 0) + int(n)
            self.held.append(held)

    def summary(self, span_s: float) -> dict[str, Any]:
        """Average boxes held by kind, and each part's CPU in cores over ``span_s``."""
        kinds = {kind for sample in self.held for kind in sample}
        boxes = {k: sum(s.get(k, 0) for s in self.held) / max(len(self.held), 1) for k in kinds}
        cores = {
            part: (self.end_cpu[part] - self.start_cpu.get(part, 0.0)) / span_s
            for part in self.end_cpu
        }
        return {"boxes_held": boxes, "cores": cores}
