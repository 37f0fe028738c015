"""Warm imports benchmark: ``Farm.map`` items that import numpy and pandas, on an image that
preloads them against the same image without ``preload``, in one run.

Run with the project venv: ``.venv/bin/python bench/preload.py [--quick] [--json]``.

Two environments are built under names of this run, from the same wheels (numpy and pandas,
downloaded by the host): ``warm`` with ``preload = ["numpy", "pandas"]``, ``cold`` without.
A local farm with one worker per image (each a Docker sandbox of the default limits: one CPU,
512 MB) then runs, in alternating rounds, ``CONCURRENCY`` items at a time on either:

1. ``Farm.map`` of ``import numpy, pandas`` items with a tiny computation: items/s on each
   image. Goal: warm >= 10x cold.
2. ``Farm.map`` of ``1+1`` items, which import nothing: what a larger zygote costs an item that
   does not use the preloads (forking more page tables).
3. A session on each: its process's ``VmData`` (what ``RLIMIT_DATA`` counts), ``VmRSS`` and
   proportional set size before it imports anything, and the kernel's preload time.

Goals are reported, never asserted. The images, their build directories and the farm are
removed on exit, also on errors.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from benchlib import emit, environments, machine, parse_args

from farm.client import Farm

NAMES = {"warm": f"bench-warm-{os.getpid()}", "cold": f"bench-cold-{os.getpid()}"}
PIP = ["numpy", "pandas"]
IMPORTING = "import numpy, pandas\nint(pandas.Series(numpy.arange({n})).sum())"
GOAL = 10.0
# Items at once, on both images: each cold item holds ~60 MB while it imports pandas, and the
# sandbox's 512 MB and one CPU are shared by all of them (the capacity, ~48, would time out).
CONCURRENCY = 4
TIMEOUT_S = 120.0
# (rounds, importing items per round and image, trivial items per round and image)
FULL = (3, 200, 400)
QUICK = (2, 60, 100)
MEMORY = (  # kB: VmData and VmRSS (status), Pss (smaps_rollup, after its address line)
    "kb = lambda text: int(text.split()[0])\n"
    "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
    "rollup = dict(line.split(':', 1) for line in list(open('/proc/self/smaps_rollup'))[1:])\n"
    "[kb(status['VmData']), kb(status['VmRSS']), kb(rollup['Pss'])]"
)


def rate(farm: Farm, items: list[str], image: str) -> float:
    """Items/s of one ``Farm.map`` of ``items`` on ``image``; every item must succeed."""
    t0 = time.perf_counter()
    records = list(
        farm.map(items, image=image, ordered=False, concurrency=CONCURRENCY, timeout_s=TIMEOUT_S)
    )
    elapsed = time.perf_counter() - t0
    failed = [r for r in records if r.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} items failed on {image}: {failed[0]}")
    return len(records) / elapsed


def memory(farm: Farm, image: str) -> dict[str, Any]:
    """A fresh session's memory before it imports anything (kB), and the kernel's preload."""
    with farm.session(image=image) as session:
        result = session.run(MEMORY)
        if not result.ok or result.value is None:
            raise RuntimeError(f"memory probe failed on {image}: {result.error}")
        data_kb, rss_kb, pss_kb = (int(x) for x in result.value.text.strip("[]").split(","))
    (worker,) = [w for w in farm.workers() if w["image"] == image]
    preload = (worker.get("sandbox") or {}).get("preload") or {}
    return {
        "vm_data_kb": data_kb,
        "vm_rss_kb": rss_kb,
        "pss_kb": pss_kb,
        "preloaded": preload.get("modules"),
        "preload_s": preload.get("seconds"),
    }


def measure(plan: tuple[int, int, int]) -> dict[str, Any]:
    rounds, importing, trivial = plan
    work = [IMPORTING.format(n=n) for n in range(importing)]
    rates: dict[str, dict[str, list[float]]] = {
        kind: {"importing": [], "trivial": []} for kind in NAMES
    }
    with (
        environments({NAMES[kind]: (PIP, PIP if kind == "warm" else []) for kind in NAMES}),
        Farm.local(images={name: 1 for name in NAMES.values()}) as farm,
    ):
        for name in NAMES.values():  # warm-up: spares made, connections open
            rate(farm, work[:20], name)
        for _ in range(rounds):
            for kind, name in NAMES.items():
                rates[kind]["importing"].append(rate(farm, work, name))
                rates[kind]["trivial"].append(rate(farm, ["1+1"] * trivial, name))
        memories = {kind: memory(farm, name) for kind, name in NAMES.items()}
    return {
        kind: {
            "import_items_per_s": max(rates[kind]["importing"]),
            "trivial_items_per_s": max(rates[kind]["trivial"]),
            **memories[kind],
        }
        for kind in NAMES
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    plan = QUICK if args.quick else FULL
    info = machine()
    measured = measure(plan)
    warm, cold = measured["warm"], measured["cold"]
    ratios = {
        "import items/s, warm / cold": warm["import_items_per_s"] / cold["import_items_per_s"],
        "1+1 items/s, warm / cold": warm["trivial_items_per_s"] / cold["trivial_items_per_s"],
        "session VmData, warm / cold": warm["vm_data_kb"] / cold["vm_data_kb"],
    }
    goals = {f"warm >= {GOAL:g}x cold": ratios["import items/s, warm / cold"] >= GOAL}
    data = {"machine": info, "plan": plan, "concurrency": CONCURRENCY, "measured": measured}
    data.update(ratios=ratios, goals=goals)
    lines = [f"bench/preload.py ({'quick' if args.quick else 'full'}) on {info}"]
    lines.append(f"Farm.map, {CONCURRENCY} items at a time, best of {plan[0]} rounds")
    lines.append(f"{'':30} {'cold':>12} {'warm':>12}")
    for key in ("import_items_per_s", "trivial_items_per_s", "vm_data_kb", "vm_rss_kb", "pss_kb"):
        lines.append(f"{key:30} {cold[key]:12.1f} {warm[key]:12.1f}")
    lines.append(f"{'kernel preload_s':30} {'':>12} {warm['preload_s']:12.2f}")
    lines += [f"{name:30} {value:12.2f}x" for name, value in ratios.items()]
    lines += [f"goal {name}: {'met' if ok else 'MISSED'}" for name, ok in goals.items()]
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
