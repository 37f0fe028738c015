"""Overload: the farm at 1x, 2x and 4x its capacity, with a mixed workload at once.

Run with the project venv: ``.venv/bin/python bench/load.py [--quick] [--json PATH]``.

One ``Farm.local(images={"default": 2, "judge": 1})`` (Docker sandboxes; the judge worker is
started up front so that it is neither started nor counted in the middle of a level) and the
real ``farm serve`` over it in a process of its own, called with a token of ``farm token
create`` whose cap fits every HTTP client. Capacity is counted per image, in boxes: the sum of
the live workers' ``capacity`` (``farm status``); C is the default image's (2 x 48 = 96 with
the default sandbox, set by its disk budget), the judge worker's is printed beside it.

A level L runs these parts at once, each checking every answer (``load_mix``):
- agent sessions, Python API: L*C/4 threads, each opening sessions one after the other
  (``x = 0``, then 20 runs of ``x += 1; x`` whose values are checked, close);
- a map, Python API: 10,000 one-line items (``--quick``: 1,500) at concurrency L*C/2, every
  record checked by id and value; it sets the level's length, the other parts loop until it
  ends and then wind down;
- HTTP clients of ``farm serve``: 50*L (``--quick``: 10*L), half of them sessions (open, 5
  checked runs, delete), half maps of 20 items (NDJSON, concurrency 1: one box at a time);
- judge items: a judge map (python3 and cpp17 submissions to a sum problem, all accepted) at
  concurrency L*C/8, on the judge worker.
"Nx" names the level: the default image is offered L*(C/4 + C/2) + 50*L boxes at once
(agents' sessions, the map's window, one per HTTP client), 1.27 x L x C for C = 96, and the
judge worker L*C/8 items. Per level: goodput (items/s of the three maps, runs/s of both
kinds of sessions, finished within the map's span; the goal is on their sum: sessions go
ahead of map items, so the more sessions a level offers, the more of the boxes they hold and
the fewer items are done) and its ratio to 1x, who got the farm (``load_shares``: boxes held
by sessions and by map items, CPU of the farm's parts against the load generator's, which
shares the cores), the latency of a run,
of an item's running (``duration_s - queue_s``) and of its queueing (``queue_s``), of an open
and its ``queue_s``, errors by kind, busy answers (``FarmBusy``; HTTP 503 ``busy``), lost and
duplicated records, sessions that lost their variables.

The warm-up, left out: a level at the top multiplier with a short map (every path, thread and
connection used once, at the run's peak concurrency: what a worker's process and its kernel's
supervisor hold at that concurrency are high-water marks, not growth), then a short burst
(below), so that every worker has held its most boxes once: a kernel keeps an emptied box's
pid 1 for its number's next box, a high-water mark too; and the judge part at the top level's
concurrency. The RSS and PSS of each worker's process
tree (the worker, its sandbox container's processes) are read from ``/proc`` (run as root)
after it, every ``load_memory.SAMPLE_S`` during the run, and at its end (after the burst,
once the farm is idle), at the start and the end also by role; so is redis-server's memory
less what keys kept for a fixed time hold (exec records: an hour, a map item's ten minutes;
journals: ``FARM_JOURNAL_TTL_S``), which is retention, not growth.
The goal is end within 10% of start (PSS: RSS counts a zygote's shared pages in each fork).

Then the burst (the issue's own goal): ``Farm.map`` of 3,000 items (``--quick``: 1,000) at
concurrency 512 while 120 sessions open at once from threads (each sets a variable, runs
twice, checks it, closes). Goals are printed PASS/FAIL and never asserted: the exit status is
0 either way; ``--json PATH`` writes every figure (``tests/test_reliability_load.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchlib import machine, write_json
from load_memory import Memory
from load_mix import ITEM_PARTS, RUN_PARTS, Tally, agent, batch, http_clients, judge
from load_report import goals, render
from load_shares import Shares
from serve import FARM, start_server, stop_server

from farm.client import Farm
from farm.errors import SessionLost, StateLost
from farm.local.embedded import LocalFarm

WIND_DOWN_S = 120.0  # a part still running this long after its level ended counts as hung
IDLE_S = 60.0  # how long the farm may take to be idle again between levels
JUDGE_WARM_S = 20.0
ID = re.compile(r"[0-9a-f]{8}[0-9a-f-]*.*$")  # a key's name from its first id on
TOKEN_CAP = 4096  # the HTTP clients' token: calls at once on the server


@dataclass(frozen=True)
class Plan:
    items: int  # the map that sets a level's length
    http: int  # HTTP clients per level of 1x
    burst_items: int
    burst_window: int = 512
    burst_sessions: int = 120


FULL = Plan(items=10_000, http=50, burst_items=3_000)
QUICK = Plan(items=1_500, http=10, burst_items=1_000)


def capacity(farm: Farm) -> dict[str, dict[str, Any]]:
    """Per image: workers, boxes (the sum of their capacity), the binding budgets and the
    kernel's refusals so far (boxes it had no room for after waiting: sent again)."""
    images: dict[str, dict[str, Any]] = {}
    for w in farm.workers():
        kernel = w.get("kernel") or {}
        entry = images.setdefault(
            str(w["image"]), {"workers": 0, "boxes": 0, "binding": [], "refused": 0}
        )
        entry["workers"] += 1
        entry["boxes"] += int(w.get("capacity") or 0)
        entry["binding"] = sorted({*entry["binding"], str(kernel.get("binding"))})
        entry["refused"] += int(kernel.get("refused") or 0)
    return images


def key_kinds(farm: Farm) -> dict[str, int]:
    """Redis keys by kind (their name up to the first id), the most numerous first."""
    kinds = Counter(ID.sub("*", str(key)) for key in farm.registry.redis.scan_iter(count=1000))
    return dict(kinds.most_common(8))


def redis_memory(farm: Farm) -> dict[str, int]:
    """Redis' used memory (``INFO``), and what its keys hold (``MEMORY USAGE`` each): those
    kept for a fixed time (exec records, journals: each with its TTL) and those never expiring,
    which must not grow (the rest is Redis' own: its keyspace's tables, clients' buffers)."""
    redis = farm.registry.redis
    used = int(redis.info("memory")["used_memory"])
    keys = list(redis.scan_iter(count=1000))
    expiring = kept = 0
    for start in range(0, len(keys), 1000):
        with redis.pipeline(transaction=False) as pipe:
            for key in keys[start : start + 1000]:
                pipe.ttl(key)
                pipe.memory_usage(key)
            replies = pipe.execute()
        for ttl, size in zip(replies[::2], replies[1::2], strict=True):
            if ttl > 0:
                expiring += size or 0
            else:
                kept += size or 0
    return {"used": used, "expiring": expiring, "kept": kept, "keys": len(keys)}


def wait_idle(farm: Farm) -> bool:
    """Until no worker has a box in use nor work waiting (heartbeats: once a second)."""
    deadline = time.monotonic() + IDLE_S
    while time.monotonic() < deadline:
        rooms = [w.get("room") or {} for w in farm.workers()]
        if all(not r.get("in_use") and not any(r.get("waiting", {}).values()) for r in rooms):
            return True
        time.sleep(0.5)  # poll interval of the deadline-bounded wait
    return False


def level(
    farm: Farm,
    url: str,
    token: str,
    mult: int,
    c: int,
    items: int,
    http: int,
    shares: Shares | None = None,
) -> dict[str, Any]:
    """One level: every part at once until the map of ``items`` ends; its figures, and with
    ``shares`` who got the farm meanwhile (boxes by kind, CPU by part)."""
    stop = threading.Event()
    tallies = {name: Tally() for name in (*ITEM_PARTS, *RUN_PARTS)}
    parts: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (agent, (farm, stop, tallies["agent"])) for _ in range(mult * c // 4)
    ]
    parts.append((judge, (farm, stop, tallies["judge"], mult * c // 8, f"j{mult}-")))
    parts.append((http_clients, (url, token, http * mult, stop, tallies)))
    threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in parts]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    with shares or contextlib.nullcontext():
        batch(farm, items, mult * c // 2, tallies["map"], f"m{mult}-")
    ended = time.monotonic()
    stop.set()
    for thread in threads:
        thread.join(max(0.0, ended + WIND_DOWN_S - time.monotonic()))
    span = ended - started
    out = {name: t.summary(started, ended) for name, t in tallies.items()}
    return {
        "level": mult,
        "offered": {
            "default_boxes": mult * (c // 4 + c // 2) + http * mult,
            "judge": mult * c // 8,
        },
        "span_s": span,
        "wind_down_s": time.monotonic() - ended,
        "hung_parts": sum(t.is_alive() for t in threads),
        "items_per_s": sum(out[p]["done"] for p in ITEM_PARTS) / span,
        "runs_per_s": sum(out[p]["done"] for p in RUN_PARTS) / span,
        "units_per_s": sum(out[p]["done"] for p in (*ITEM_PARTS, *RUN_PARTS)) / span,
        "shares": shares.summary(span) if shares is not None else None,
        "parts": out,
        "idle_after": wait_idle(farm),
    }


def warm_judge(farm: Farm, concurrency: int) -> None:
    """The judge worker's warm-up at the top level's concurrency: its compile cache and the
    boxes it keeps reach the sizes the run will have, before memory's first sample."""
    stop = threading.Event()
    thread = threading.Thread(target=judge, args=(farm, stop, Tally(), concurrency, "w-"))
    thread.start()
    stop.wait(JUDGE_WARM_S)  # the warm-up's length, not a wait for readiness
    stop.set()
    thread.join(WIND_DOWN_S)


def burst(farm: Farm, plan: Plan) -> dict[str, Any]:
    """A map at concurrency ``burst_window`` while ``burst_sessions`` sessions open at once."""
    items, sessions, go = Tally(), Tally(), threading.Event()

    def one(i: int) -> None:
        go.wait()
        started = time.perf_counter()
        try:
            with farm.session() as s:
                sessions.sample("open", time.perf_counter() - started)
                sessions.sample("open_queue", s.queue_s)
                results = [s.run(code) for code in (f"v = {i}", "v += 1", "v")]
        except (StateLost, SessionLost) as exc:
            sessions.count("lost_variables")
            sessions.error(type(exc).__name__)
            return
        except Exception as exc:
            sessions.error(type(exc).__name__)
            return
        failed = [r for r in results if not r.ok]
        if failed:
            sessions.error(str(failed[0].kind))
        elif results[-1].value is None or results[-1].value.text != str(i + 1):
            sessions.count("lost_variables")
        else:
            sessions.ok()

    threads = [
        threading.Thread(target=one, args=(i,), daemon=True) for i in range(plan.burst_sessions)
    ]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    mapper = threading.Thread(
        target=batch, args=(farm, plan.burst_items, plan.burst_window, items, "b"), daemon=True
    )
    mapper.start()
    while not items.done_at and mapper.is_alive() and time.monotonic() < started + 30:
        time.sleep(0.01)  # the map's chunks are queued and running: now the sessions open
    go.set()
    for thread in [mapper, *threads]:
        thread.join(max(0.0, started + 600 - time.monotonic()))
    return {
        "took_s": time.monotonic() - started,
        "hung": sum(t.is_alive() for t in [mapper, *threads]),
        "map": items.summary(started, time.monotonic()),
        "sessions": sessions.summary(started, time.monotonic()),
        "idle_after": wait_idle(farm),
    }


# --- the run ----------------------------------------------------------------------------------


def parts_of(local: LocalFarm, serve: subprocess.Popen[bytes]) -> dict[str, list[int]]:
    """The farm's processes by part, for CPU: the workers, redis-server, farm serve."""
    assert local.redis.proc is not None
    return {
        "workers": [p.pid for p in local.workers.values()],
        "redis-server": [local.redis.proc.pid],
        "farm serve": [serve.pid],
    }


def _over_run(samples: list[dict[str, int]]) -> dict[str, dict[str, int]]:
    """Each name's first, last and largest sample (the first is the start, the last the end)."""
    return {
        name: {
            "start": samples[0][name],
            "end": samples[-1].get(name, 0),
            "max": max(s.get(name, 0) for s in samples),
        }
        for name in samples[0]
    }


def containers_of(memory: Memory) -> list[str]:
    """The ids of the workers' sandbox containers (their CPU is in their cgroups)."""
    return [
        str(c.id)
        for worker_id in memory.local.workers
        for c in memory.docker.containers.list(filters={"label": f"farm.owner={worker_id}"})
    ]


def create_token(broker_url: str) -> str:
    env = {**os.environ, "FARM_BROKER_URL": broker_url}
    args = [FARM, "token", "create", "load", "--concurrency", str(TOKEN_CAP)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    if args.items:
        plan = replace(plan, items=args.items, burst_items=args.items)
    out: dict[str, Any] = {"machine": machine(), "quick": args.quick, "plan": asdict(plan)}
    with (
        Farm.local(images={"default": 2, "judge": 1}) as farm,
        tempfile.TemporaryDirectory() as tmp,
    ):
        local = farm.local_farm
        out["capacity"] = capacity(farm)
        c = out["c"] = out["capacity"]["default"]["boxes"]
        proc, url, _ = start_server(farm, Path(tmp))
        memory = Memory(local)
        try:
            token = create_token(local.broker_url)
            top = max(args.levels)  # the warm-up: the peak's concurrency, its high-water marks
            level(farm, url, token, top, c, max(200, plan.items // 10), plan.http)
            burst(farm, replace(plan, burst_items=4 * c))
            warm_judge(farm, top * c // 8)
            memory.read()  # the start
            keys = [key_kinds(farm)]
            redis = [redis_memory(farm)]
            memory.thread.start()
            out["levels"] = []
            for mult in args.levels:
                shares = Shares(farm, parts_of(local, proc), containers_of(memory))
                out["levels"].append(
                    level(farm, url, token, mult, c, plan.items, plan.http, shares)
                )
                print(f"level {mult}x done", file=sys.stderr, flush=True)
            out["burst"] = burst(farm, plan)
            out["capacity_end"] = capacity(farm)
            memory.stop.set()
            memory.read()  # the end
            keys.append(key_kinds(farm))
            redis.append(redis_memory(farm))
        finally:
            memory.close()
            stop_server(proc)
    out["rss_kb"] = _over_run(memory.samples)
    out["pss_kb"] = _over_run(memory.pss)
    out["pss_roles"] = {"start": memory.roles[0], "end": memory.roles[-1]}
    out["redis_keys"] = {"start": keys[0], "end": keys[1]}
    out["redis_memory"] = {"start": redis[0], "end": redis[1]}
    out["goals"] = goals(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller maps, fewer HTTP clients")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--levels", default="1,2,4", help="the levels to run (development)")
    parser.add_argument("--items", type=int, help="the map's and the burst's items (development)")
    args = parser.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    out = run(args)
    print(render(out))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
