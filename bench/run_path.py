"""Where a warm ``session.run("x+1")`` spends its CPU, process by process, against the echo task.

Run with the project venv: ``.venv/bin/python bench/run_path.py [--quick] [--json]``.

One ``Farm.local(workers=1)``: every call goes to the one worker. ``session.run("x+1")`` and the
bare ``farm.echo`` Celery task (payload padded to farm's bytes, as ``bench/farm_e2e.py``) run in
alternating blocks; around each block the CPU time of every process on the path is read from
``/proc/<pid>/task/*/schedstat`` (nanoseconds on a CPU, all threads): the client (this process),
redis-server, the worker, the sandbox's supervisor and the session's process (the rest of the
container apart). CPU per call moves far less with the machine's load than wall time does, so
the difference farm - echo is what farm adds per call, and where. A third shape, ``lane``, is a
bare Redis-list echo (``bench/lane_echo.py``: a push and a blocking pop each way, served by
threads in a process of their own), the same payload: what the echo's Celery machinery costs
over Redis alone. Nothing is asserted.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import docker
from benchlib import emit, machine, parse_args
from farm_e2e import echo_call, echo_payload, farm_call
from lane_echo import LaneEcho, lane_server

from farm.client import Farm

BLOCK = 200
ROUNDS_FULL = 10
ROUNDS_QUICK = 3


def cpu_ns(pid: int) -> int:
    """Nanoseconds ``pid``'s threads (all of them, live ones) spent on a CPU so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (read from ``/proc/<pid>/task/*/children``)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except OSError:
                continue
    return found


def ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def groups_of(farm: Farm) -> dict[str, list[int]]:
    """The processes on the path: the container's are its init (``docker-init``), the
    supervisor (its child), the zygote (the supervisor's child that forks boxes) and the boxes
    (the session's process, with its box's init and the idle spares: only it uses CPU here)."""
    (worker,) = farm.workers()
    local = farm.local_farm
    assert local is not None and local.redis.proc is not None
    client = docker.from_env()
    try:
        container = client.containers.get(str(worker["sandbox"]["container_id"]))
        init = int(container.attrs["State"]["Pid"])
    finally:
        client.close()
    inside = descendants(init)
    supervisor = [p for p in inside if ppid(p) == init]
    zygote = [p for p in inside if ppid(p) in supervisor]
    boxes = [p for p in inside if p != init and p not in supervisor and p not in zygote]
    return {
        "client": [os.getpid()],
        "redis": [local.redis.proc.pid],
        "worker": [int(worker["pid"])],
        "supervisor": supervisor,
        "zygote": zygote,
        "boxes (session process)": boxes,
    }


def sample(groups: dict[str, list[int]]) -> dict[str, int]:
    return {name: sum(cpu_ns(pid) for pid in pids) for name, pids in groups.items()}


def commands(farm: Farm) -> Counter[str]:
    """Redis commands run so far, by name (``INFO commandstats``)."""
    stats = farm.registry.redis.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def measure(rounds: int) -> dict[str, Any]:
    with ExitStack() as stack:
        farm = stack.enter_context(Farm.local(workers=1))
        session = stack.enter_context(farm.session())
        session.run("x = 1")
        groups = groups_of(farm)
        groups["lane server"] = [stack.enter_context(lane_server(farm.settings.redis_url))]
        payload = echo_payload(session)
        calls: dict[str, Callable[[], None]] = {
            "farm": farm_call(session),
            "echo": echo_call(farm, payload),
            "lane": functools.partial(LaneEcho(farm.settings.redis_url).call, payload),
        }
        cpu = {name: dict.fromkeys(groups, 0) for name in calls}
        redis_calls = {name: Counter[str]() for name in calls}
        wall = dict.fromkeys(calls, 0.0)
        count = dict.fromkeys(calls, 0)
        for call in calls.values():
            for _ in range(BLOCK // 4):
                call()
        for _ in range(rounds):
            for name, call in calls.items():
                ran = commands(farm)
                before, t0 = sample(groups), time.perf_counter()
                for _ in range(BLOCK):
                    call()
                wall[name] += time.perf_counter() - t0
                after = sample(groups)
                redis_calls[name] += commands(farm) - ran
                redis_calls[name]["info"] -= 1
                count[name] += BLOCK
                for group in groups:
                    cpu[name][group] += after[group] - before[group]
    return {
        name: {
            "calls": count[name],
            "wall_us": wall[name] / count[name] * 1e6,
            "cpu_us": {g: ns / count[name] / 1e3 for g, ns in cpu[name].items()},
            "redis": {c: n / count[name] for c, n in sorted(redis_calls[name].items()) if n > 0},
        }
        for name in calls
    }


def render(info: dict[str, Any], report: dict[str, Any]) -> str:
    names = list(report)  # farm, echo, lane
    farm, echo = report["farm"], report["echo"]
    lines = [
        f"run path  {info['date']}  host {info['host']}  {info['cores']} cores  "
        f"load {os.getloadavg()[0]:.1f}",
        "",
        f"{'CPU us per call':<24}" + "".join(f"{n:>9}" for n in names) + f"{'farm-echo':>10}",
    ]
    for group in farm["cpu_us"]:
        cells = [report[n]["cpu_us"][group] for n in names]
        diff = farm["cpu_us"][group] - echo["cpu_us"][group]
        lines.append(f"{group:<24}" + "".join(f"{c:>9.0f}" for c in cells) + f"{diff:>10.0f}")
    cpu = {n: sum(report[n]["cpu_us"].values()) for n in names}
    wall = {n: report[n]["wall_us"] for n in names}
    lines += [
        f"{'all':<24}"
        + "".join(f"{cpu[n]:>9.0f}" for n in names)
        + f"{cpu['farm'] - cpu['echo']:>10.0f}",
        f"{'wall us per call':<24}"
        + "".join(f"{wall[n]:>9.0f}" for n in names)
        + f"{wall['farm'] - wall['echo']:>10.0f}",
        f"calls: {farm['calls']} each, alternating blocks of {BLOCK}; lane: a bare Redis-list "
        f"echo (bench/lane_echo.py), echo CPU {cpu['echo'] / cpu['lane']:.1f}x and wall "
        f"{wall['echo'] / wall['lane']:.1f}x the lane's",
        "",
        f"{'Redis commands per call':<24}" + "".join(f"{n:>9}" for n in names),
    ]
    commands_seen = sorted({c for n in names for c in report[n]["redis"]})
    for command in commands_seen:
        cells = [report[n]["redis"].get(command, 0.0) for n in names]
        lines.append(f"{command:<24}" + "".join(f"{c:>9.2f}" for c in cells))
    totals = [sum(report[n]["redis"].values()) for n in names]
    lines.append(f"{'all':<24}" + "".join(f"{t:>9.2f}" for t in totals))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    info = machine()
    report = measure(ROUNDS_QUICK if args.quick else ROUNDS_FULL)
    return emit(render(info, report), {"machine": info, **report}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
