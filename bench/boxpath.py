"""Where a map item's time goes: ``Farm.map`` of snippets against a process per item, by role.

Run with the project venv: ``.venv/bin/python bench/boxpath.py [--quick] [--json]
[--profile]``.

A local farm of ``WORKERS`` workers (each a Docker sandbox; every item in a box of its own)
and ``multiprocessing.Pool(2, maxtasksperchild=1)`` (a fresh process per item, no sandbox:
what an item costs at least when it may not share a process) run the same snippets
(``bench/snippets.py``) in alternating rounds, so that both see the same load; each side's
best round is kept, and the ratio is of those. Per farm round: CPU ms per item of the client,
the workers, Redis and the sandboxes, the sandboxes' split by role (``costs.sandbox_roles``:
supervisor, zygote, box inits, the processes in boxes, boxes ended, and what the cgroup was
charged outside any process), and the share of the cores other processes used.

``--profile`` also samples one sandbox's kernel with ``py-spy`` (``--subprocesses``: the
supervisor, zygote, inits and session processes) through one more farm round and prints each
role's top functions by own time. Goals are reported, never asserted (issue 35: >= 0.7x).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import emit, machine, parse_args
from costs import ROLES, Others, Snapshot, sandbox_containers
from snippets import outcome, snippets

from farm.client import Farm

WORKERS = 2
POOL = 2
GOAL = 0.7
ITEMS, ROUNDS = 1000, 3
QUICK_ITEMS, QUICK_ROUNDS = 200, 2
WARMUP_ITEMS = 128
TIMEOUT_S = 10.0
IDLE_S = 5.0
PROFILE_RATE = 200  # py-spy samples a second


def _one(item: dict[str, Any]) -> tuple[str, str]:
    return item["id"], outcome(item["code"])


def pool_round(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Items/s of a pool that forks a fresh process per item (its start-up left out)."""
    with multiprocessing.get_context("fork").Pool(POOL, maxtasksperchild=1) as pool:
        pool.map(abs, range(POOL))
        with Others() as others:
            t0 = time.perf_counter()
            got = dict(pool.imap_unordered(_one, items, chunksize=1))
            seconds = time.perf_counter() - t0
    return {"items_per_s": len(got) / seconds, "others": others.share, "outcomes": got}


def farm_round(farm: Farm, items: list[dict[str, Any]]) -> dict[str, Any]:
    before = Snapshot.take(farm)
    t0 = time.perf_counter()
    got = {str(r.id): r for r in farm.map(items, timeout_s=TIMEOUT_S)}
    seconds = time.perf_counter() - t0
    cost = Snapshot.take(farm) - before
    per = cost.per(len(got))
    outcomes = {
        i: "pass"
        if r.ok
        else (r.cells[-1].error.ename if r.cells and r.cells[-1].error else r.kind)
        for i, r in got.items()
    }
    return {
        "items_per_s": len(got) / seconds,
        "others": cost.others_share,
        "load": cost.load[0],
        "cpu_ms": per["cpu_ms_per_item"],
        "sandbox_ms": per["sandbox_ms_per_item"],
        "replaced": per["sandboxes_replaced"],
        "outcomes": outcomes,
    }


def profile(farm: Farm, items: list[dict[str, Any]], top: int = 12) -> dict[str, list[Any]]:
    """One farm round with py-spy on one sandbox's kernel: each role's top functions by own
    time, as a share of that role's samples."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    container = next(iter(sandbox_containers(farm)))
    tree = subprocess.run(
        ["docker", "top", container, "-o", "pid,ppid"], capture_output=True, text=True, check=True
    ).stdout.split("\n")[1:]
    parents = {int(p): int(pp) for p, pp in (line.split() for line in tree if line.strip())}
    init = next(p for p, pp in parents.items() if pp not in parents)
    supervisor = next(p for p, pp in parents.items() if pp == init)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "raw.txt"
        argv = [spy, "record", "--pid", str(supervisor), "--subprocesses", "--nonblocking", "--gil"]
        argv += ["--format", "raw", "--rate", str(PROFILE_RATE), "--output", str(out)]
        spying = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches (no signal of it to poll)
        farm_round(farm, items)
        spying.send_signal(2)
        spying.wait(30)
        lines = out.read_text().splitlines() if out.exists() else []
        if os.environ.get("BOXPATH_RAW"):  # the raw samples, for a closer look
            shutil.copy(out, os.environ["BOXPATH_RAW"])
    by_role: dict[str, Counter[str]] = {}
    names = ("supervisor", "zygote", "box inits", "in boxes")
    for line in lines:  # "process A:...;process B:...;frame;...;leaf COUNT", A the oldest
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        depth = sum(1 for frame in frames if frame.startswith("process "))
        role = names[min(depth, len(names)) - 1]
        leaf = frames[-1] if len(frames) > depth else "?"
        by_role.setdefault(role, Counter())[leaf] += int(count)
    return {
        role: [(leaf, n / max(1, counts.total())) for leaf, n in counts.most_common(top)]
        + [("samples", counts.total())]
        for role, counts in by_role.items()
    }


def main(argv: list[str] | None = None) -> int:
    want_profile = "--profile" in (argv if argv is not None else sys.argv[1:])
    args = parse_args(__doc__, [a for a in (argv or sys.argv[1:]) if a != "--profile"])
    n, rounds = (QUICK_ITEMS, QUICK_ROUNDS) if args.quick else (ITEMS, ROUNDS)
    items = snippets(n)
    info = machine()
    pools: list[dict[str, Any]] = []
    farms: list[dict[str, Any]] = []
    prof: dict[str, list[Any]] = {}
    with Farm.local(workers=WORKERS) as farm:
        for _ in farm.map(["x = 1"] * WARMUP_ITEMS):
            pass
        before = Snapshot.take(farm)
        time.sleep(IDLE_S)  # what the sandboxes cost doing nothing (health checks, polls)
        idle = (Snapshot.take(farm) - before).rate()["sandbox_ms_per_s"]
        for _ in range(rounds):
            pools.append(pool_round(items))
            farms.append(farm_round(farm, items))
        if want_profile:
            prof = profile(farm, items)
    best_pool = max(pools, key=lambda r: r["items_per_s"])
    best_farm = max(farms, key=lambda r: r["items_per_s"])
    differ = [i for i, o in best_pool["outcomes"].items() if best_farm["outcomes"].get(i) != o]
    lines = [
        f"box path bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores  Python {info['python']}  {n} snippets, {rounds} rounds",
        "",
        f"{'round':<8} {'pool items/s':>13} {'farm items/s':>13} {'ratio':>7} "
        f"{'others p/f':>11} {'load':>5}",
    ]
    for i, (p, f) in enumerate(zip(pools, farms, strict=True)):
        lines.append(
            f"{i:<8} {p['items_per_s']:>13.1f} {f['items_per_s']:>13.1f} "
            f"{f['items_per_s'] / p['items_per_s']:>6.2f}x "
            f"{100 * p['others']:>4.0f}%/{100 * f['others']:>3.0f}% {f['load']:>5.1f}"
        )
    ratio = best_farm["items_per_s"] / best_pool["items_per_s"]
    lines.append(
        f"{'best':<8} {best_pool['items_per_s']:>13.1f} {best_farm['items_per_s']:>13.1f} "
        f"{ratio:>6.2f}x  goal >= {GOAL}x: {'met' if ratio >= GOAL else 'missed'}; "
        f"outcome disagreements {len(differ)}"
    )
    lines += ["", "CPU ms per item (each farm round):"]
    for i, f in enumerate(farms):
        parts = ", ".join(f"{k} {v:.2f}" for k, v in f["cpu_ms"].items() if v is not None)
        lines.append(f"  {i}: {parts}")
        roles = ", ".join(f"{k} {f['sandbox_ms'].get(k, 0.0):.2f}" for k in ROLES)
        replaced = f" ({f['replaced']} sandbox(es) replaced, left out)" if f["replaced"] else ""
        lines.append(f"     sandboxes by role{replaced}: {roles}")
    idle_roles = ", ".join(f"{k} {v:.1f}" for k, v in idle.items())
    lines.append(f"  idle farm, sandboxes' CPU ms per second by role: {idle_roles}")
    for role, top in prof.items():
        samples = top[-1][1]
        lines.append(f"\npy-spy, {role} ({samples} samples), own time:")
        lines += [f"  {100 * share:5.1f}%  {leaf}" for leaf, share in top[:-1]]
    data = {
        "machine": info,
        "items": n,
        "pool": [{k: v for k, v in p.items() if k != "outcomes"} for p in pools],
        "farm": [{k: v for k, v in f.items() if k != "outcomes"} for f in farms],
        "ratio": ratio,
        "idle_sandbox_ms_per_s": idle,
        "disagreements": differ,
        "profile": prof,
        "pid": os.getpid(),
    }
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
