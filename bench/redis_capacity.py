"""How many items a second one Redis can carry for farm, and how many worker cores that serves.

Run with the project venv: ``.venv/bin/python bench/redis_capacity.py [--quick] [--json]``
(``docs/scaling.md`` explains the method and quotes its figures).

1. What an item costs the shared parts, measured: ``Farm.local(workers=2)``, a warm-up map,
   an idle stretch (what heartbeats and polling cost by themselves), then a map of ``ITEMS``
   trivial items (``1+1``) and one of ``ITEMS`` snippets (``bench/snippets.py``), each read
   with ``bench/costs.py``: Redis commands per item by name over every client, bytes in and
   out, redis-server CPU, and the CPU per item of the workers and their sandboxes.
2. What Redis does at saturation on this machine: a fresh, private ``redis-server`` (loopback,
   no persistence, no data but the benchmark's own) driven by ``redis-benchmark`` (50
   connections, no pipelining, as farm's clients talk to it) with each command farm sends,
   its keys random and its values about as large as farm's (claims about 100 B, results and
   Celery messages about 1.5 kB). Commands ``redis-benchmark`` cannot drive alone stand in
   for the same work: ``LPOP``/``RPOP`` with data for ``BLPOP``/``BRPOP``, ``PING`` for
   ``MULTI`` and ``EXEC`` (the queued commands are counted under their own names).
3. The arithmetic: Redis seconds per item = sum over commands of (calls per item / calls per
   second at saturation); one Redis carries the inverse in items/s. The same from the CPU
   redis-server really used per item (at farm's rate, one wake-up per command or so: the
   pessimistic figure). A worker core runs ``1000 / (worker + sandbox CPU ms per item)``
   items/s, so one Redis serves the ratio of the two in worker cores. The idle rate says
   what each worker costs Redis whether it works or not.

Everything it starts (the farm, its containers, the benchmark's redis-server) is stopped on
exit. Figures are reported, nothing is asserted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import emit, machine, parse_args
from costs import Snapshot
from snippets import snippets

from farm.client import Farm
from farm.local.redis_server import free_port

WORKERS = 2
ITEMS = 1000
QUICK_ITEMS = 200
WARMUP_ITEMS = 128
IDLE_S = 5.0
CLIENTS = 50
REQUESTS = 100_000
QUICK_REQUESTS = 20_000
REPEATS = 3  # each command's best of these: the least disturbed by other work on the machine
SMALL = "x" * 100  # a claim, a cancel mark
LARGE = "x" * 1500  # an ItemDone, a Celery message carrying a chunk
# What redis-benchmark runs for each command farm sends (``-r`` makes __rand_int__ random).
STAND_INS: dict[str, list[str]] = {
    "set": ["SET", "farm:exec:__rand_int__", SMALL, "EX", "3600", "NX"],
    "get": ["GET", "farm:exec:__rand_int__"],
    "exists": ["EXISTS", "farm:map:__rand_int__:cancel"],
    "rpush": ["RPUSH", "farm:map:r", LARGE],
    "lpush": ["LPUSH", "farm.default", LARGE],
    "lpop": ["LPOP", "farm:map:r"],
    "blpop": ["LPOP", "farm:map:r"],
    "brpop": ["RPOP", "farm.default"],
    "zadd": ["ZADD", "unacked_index", "__rand_int__", "tag__rand_int__"],
    "zrem": ["ZREM", "unacked_index", "tag__rand_int__"],
    "hset": ["HSET", "unacked", "tag__rand_int__", LARGE],
    "hdel": ["HDEL", "unacked", "tag__rand_int__"],
    "hget": ["HGET", "farm:worker:w1", "generation"],
    "hgetall": ["HGETALL", "farm:worker:w1"],
    "expire": ["EXPIRE", "farm:map:r", "3600"],
    "pexpire": ["PEXPIRE", "farm:worker:w1", "3000"],
    "sadd": ["SADD", "farm:workers", "w1"],
    "smembers": ["SMEMBERS", "farm:workers"],
    "multi": ["PING"],
    "exec": ["PING"],
    "ping": ["PING"],
}
# Pops need data: their list is filled (pipelined, untimed) before they are timed.
FILLS = {"lpop": "rpush", "blpop": "rpush", "brpop": "lpush"}


def farm_costs(n: int) -> dict[str, Any]:
    """Per item costs of ``n`` trivial and ``n`` snippet items, and the idle farm's rate."""
    out: dict[str, Any] = {}
    with Farm.local(workers=WORKERS) as farm:
        for _ in farm.map(["x = 1"] * WARMUP_ITEMS):
            pass
        before = Snapshot.take(farm)
        time.sleep(IDLE_S)
        idle = Snapshot.take(farm) - before
        out["idle"] = idle.rate()
        for name, items in (("trivial", ["1+1"] * n), ("snippets", snippets(n))):
            before = Snapshot.take(farm)
            t0 = time.perf_counter()
            done = sum(1 for _ in farm.map(items))
            seconds = time.perf_counter() - t0
            cost = Snapshot.take(farm) - before
            out[name] = {
                "items": done,
                "items_per_s": done / seconds,
                "load": cost.load,
                **cost.per(done, idle),
            }
        redis = farm.local_farm.redis.client(socket_timeout=10)
        try:  # after the maps: the connections the workers opened for them stay open
            out["connected_clients"] = int(redis.info("clients")["connected_clients"])
        finally:
            redis.close()
    return out


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A private redis-server for the benchmark: loopback only, no persistence, no data."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    config = f'port {port}\nbind 127.0.0.1\nprotected-mode yes\nsave ""\nappendonly no\n'
    proc.stdin.write(config.encode() + f'dir "{directory}"\n'.encode())
    proc.stdin.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ping = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, timeout=5
        )
        if ping.stdout.strip() == "PONG":
            return proc, port
        time.sleep(0.05)  # poll interval of the deadline-bounded readiness check
    proc.kill()
    raise RuntimeError("the benchmark's redis-server did not start")


def bench(port: int, command: list[str], requests: int, pipeline: int) -> float:
    """Calls per second of ``command`` by ``CLIENTS`` connections, ``pipeline`` deep."""
    argv = ["redis-benchmark", "-p", str(port), "-c", str(CLIENTS), "-n", str(requests)]
    argv += ["-r", "1000000", "-P", str(pipeline), "--csv", *command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    return float(done.stdout.strip().splitlines()[-1].split(",")[1].strip('"'))


def saturation(
    commands: list[str], requests: int, pipeline: int = 1, repeats: int = REPEATS
) -> dict[str, float]:
    """Calls per second at saturation of each command's stand-in (the best of ``repeats``
    runs), on a fresh server."""
    rates: dict[str, float] = {}
    directory = Path(tempfile.mkdtemp(prefix="farm-bench-redis-"))
    proc, port = start_redis(directory)
    try:
        for name in commands:
            for _ in range(repeats):
                if name in FILLS:
                    bench(port, STAND_INS[FILLS[name]], requests, pipeline=100)
                rate = bench(port, STAND_INS[name], requests, pipeline)
                rates[name] = max(rates.get(name, 0.0), rate)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
    return rates


def capacity(costs: dict[str, Any], rates: dict[str, float]) -> dict[str, Any]:
    """Items/s one Redis carries at a map's command mix, and the worker cores that serves."""
    mix: dict[str, float] = costs["by_command"]
    known = {k: v for k, v in mix.items() if k in rates}
    unknown = {k: v for k, v in mix.items() if k not in rates}
    seconds = sum(v / rates[k] for k, v in known.items())
    seconds += sum(unknown.values()) / rates["ping"]  # anything else: as cheap as a PING
    cpu = costs["cpu_ms_per_item"]
    per_core = 1e3 / ((cpu["workers"] or 0.0) + (cpu["sandboxes"] or 0.0))
    from_cpu = 1e3 / costs["redis_cpu_s_per_1000"]
    return {
        "redis_us_per_item": 1e6 * seconds,
        "items_per_s_at_saturation": 1 / seconds,
        "items_per_s_from_measured_cpu": from_cpu,
        "worker_core_items_per_s": per_core,
        "worker_cores_per_redis": (1 / seconds) / per_core,
        "worker_cores_per_redis_from_measured_cpu": from_cpu / per_core,
        "stand_in_for_ping": sorted(unknown),
    }


def render(info: dict[str, Any], out: dict[str, Any]) -> str:
    lines = [
        f"redis capacity bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores  Python {info['python']}" + ("  (--quick)" if out["quick"] else ""),
        "",
        f"1. per item, {WORKERS}-worker local farm (every client of its redis-server):",
    ]
    farm = out["farm"]
    for name in ("trivial", "snippets"):
        c = farm[name]
        cpu = c["cpu_ms_per_item"]
        lines += [
            f"  {name}: {c['items']} items at {c['items_per_s']:.1f}/s (other processes used "
            f"{100 * c['others_share']:.0f}% of the cores meanwhile): "
            f"{c['commands_per_item']:.2f} commands/item, "
            f"{(c['net_in_bytes_per_1000'] + c['net_out_bytes_per_1000']) / 1e6:.2f} MB and "
            f"{c['redis_cpu_s_per_1000']:.3f} redis CPU s per 1,000 items, "
            f"{c['redis_keys_per_item']:.2f} keys and {c['redis_memory_bytes_per_item']:.0f} B "
            "of memory left per item",
            "    " + ", ".join(f"{k} {v:.2f}" for k, v in list(c["by_command"].items())[:16]),
            "    CPU ms/item: "
            + ", ".join(f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in cpu.items()),
        ]
    idle = farm["idle"]
    lines += [
        f"  idle: {idle['commands_per_s'] / WORKERS:.1f} commands/s per worker ("
        + ", ".join(f"{k} {v / WORKERS:.2f}" for k, v in list(idle["by_command"].items())[:8])
        + f"), redis CPU {idle['redis_cpu_ms_per_s'] / WORKERS:.2f} ms/s per worker; "
        f"{farm['connected_clients']} connections open to the farm's redis-server with "
        f"{WORKERS} workers and this client",
        "",
        f"2. redis-server at saturation here ({CLIENTS} connections, no pipelining; best of "
        f"{out['repeats']}; load "
        + "/".join(f"{x:.1f}" for x in out["load"]["before"])
        + " before, "
        + "/".join(f"{x:.1f}" for x in out["load"]["after"])
        + " after), calls/s:",
        "  " + ", ".join(f"{k} {v:,.0f}" for k, v in out["rates"].items()),
        f"  pipelined {out['pipeline']} deep: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in out["pipelined"].items()),
        "",
        "3. one Redis, at each map's mix:",
    ]
    for name in ("trivial", "snippets"):
        c = out["capacity"][name]
        lines.append(
            f"  {name}: {c['redis_us_per_item']:.1f} us of Redis per item -> "
            f"{c['items_per_s_at_saturation']:,.0f} items/s at saturation "
            f"({c['items_per_s_from_measured_cpu']:,.0f} from the CPU it used here); a worker "
            f"core runs {c['worker_core_items_per_s']:.1f} items/s -> one Redis serves "
            f"{c['worker_cores_per_redis']:,.0f} worker cores "
            f"({c['worker_cores_per_redis_from_measured_cpu']:,.0f} from the measured CPU)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    if shutil.which("redis-benchmark") is None:
        print("redis-benchmark is not installed (Debian: apt-get install redis-tools)")
        return 0
    info = machine()
    n = QUICK_ITEMS if args.quick else ITEMS
    requests = QUICK_REQUESTS if args.quick else REQUESTS
    farm = farm_costs(n)
    commands = sorted({k for name in ("trivial", "snippets") for k in farm[name]["by_command"]})
    wanted = [k for k in STAND_INS if k in commands or k == "ping"]
    repeats = 1 if args.quick else REPEATS
    load_before = os.getloadavg()
    rates = saturation(wanted, requests, repeats=repeats)
    pipelined = saturation(["set", "rpush", "lpop"], requests, pipeline=16, repeats=repeats)
    out = {
        "quick": args.quick,
        "repeats": repeats,
        "farm": farm,
        "rates": rates,
        "pipeline": 16,
        "pipelined": pipelined,
        "capacity": {name: capacity(farm[name], rates) for name in ("trivial", "snippets")},
        "load": {"before": load_before, "after": os.getloadavg()},
    }
    return emit(render(info, out), {"machine": info, **out}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
