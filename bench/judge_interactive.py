"""Interactive judge benchmark: an interactive problem of 100 queries judged by farm against the
same two programs connected by a bare pipe (``subprocess``), in one run.

Run with the project venv: ``.venv/bin/python bench/judge_interactive.py [--quick] [--json]``.

The problem (``add``): the interactor (C++ on testlib) sends ``QUERIES`` (100) lines ``a b``
one at a time, each answered ``a + b`` by the submission (C++, flushing each line) before
the next is sent: 100 round trips per test.

1. farm: ``Farm.local`` with one worker of the judge image; items of the same submission,
   ``TESTS`` (5) tests each, judged one map at a time (the interactor and the submission
   are compiled once, by a first item left out). A test's wall time is the runner's (from
   the interactor's start to the submission's end).
2. baseline: in a container of the same image, kept for the run, both programs compiled
   once and each test run by a plain ``subprocess`` loop: the interactor's stdout piped to
   the submission's stdin and back with ``os.pipe``, both waited for; at nice 0 and again
   at nice 10 (a box's tests run at ``uids.BOX_NICE``).

The two alternate in ``ROUNDS`` (5; ``--quick``: 2) rounds of ``ITEMS_PER_ROUND`` (4; 2)
items and as many bare runs, so that both see the same load of a shared machine. Median
and 10th percentile of a test's wall time, and their ratios.

Goal: farm's median test within 2x of the bare pipe's. Reported, never asserted; exits 0.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchlib import emit, machine, parse_args

from farm.client import Farm
from farm.sandbox.catalog import build_image

QUERIES = 100
TESTS = 5
ROUNDS = 5
ITEMS_PER_ROUND = 4
GOAL = 2.0

INTERACTOR = r"""#include "testlib.h"
#include <iostream>
int main(int argc, char* argv[]) {
    registerInteraction(argc, argv);
    int count = inf.readInt();
    for (int i = 0; i < count; i++) {
        long long a = rnd.next(1, 1000000), b = rnd.next(1, 1000000);
        std::cout << a << " " << b << std::endl;
        long long got = ouf.readLong();
        if (got != a + b) quitf(_wa, "query %d: %lld + %lld != %lld", i, a, b, got);
    }
    std::cout << 0 << " " << 0 << std::endl;
    quitf(_ok, "%d queries", count);
}
"""
SUBMISSION = r"""#include <cstdio>
int main() {
    long long a, b;
    while (scanf("%lld %lld", &a, &b) == 2 && (a || b)) { printf("%lld\n", a + b); fflush(stdout); }
}
"""

BASELINE = r"""
import json, os, statistics, subprocess, sys, time
job = json.load(sys.stdin)
os.chdir("/tmp")
if not os.path.exists("submission"):
    open("interactor.cpp", "w").write(job["interactor"])
    open("submission.cpp", "w").write(job["submission"])
    subprocess.run(["g++", "-O2", "-std=gnu++17", "-I/etc/farm/judge/include", "-o",
                    "interactor", "interactor.cpp"], check=True)
    subprocess.run(["g++", "-O2", "-std=gnu++17", "-o", "submission", "submission.cpp"],
                   check=True)
    open("input", "w").write(job["input"])
def timed(runs):
    walls, accepted = [], 0
    for _ in range(runs):
        to_sub_r, to_sub_w = os.pipe()
        to_int_r, to_int_w = os.pipe()
        started = time.perf_counter()
        inter = subprocess.Popen(["./interactor", "input", "/dev/null"], stdin=to_int_r,
                                 stdout=to_sub_w, stderr=subprocess.DEVNULL)
        sub = subprocess.Popen(["./submission"], stdin=to_sub_r, stdout=to_int_w)
        for fd in (to_sub_r, to_sub_w, to_int_r, to_int_w):
            os.close(fd)
        sub.wait()
        accepted += inter.wait() == 0
        walls.append(time.perf_counter() - started)
    return {"accepted": accepted, "walls": walls}
result = timed(job["runs"])
os.setpriority(os.PRIO_PROCESS, 0, 10)  # a box's nice value (uids.BOX_NICE): its tests' too
result["niced"] = timed(job["runs"])
print(json.dumps(result))
"""


class Baseline:
    """A container of the judge image, kept for the run: both programs compiled in it once,
    then timed a round at a time, between farm's rounds (the machine's load moves)."""

    def __init__(self, image: str) -> None:
        argv = ["docker", "run", "-d", "--rm", "--network", "none"]
        argv += ["--label", "farm.owner=bench-judge", "--entrypoint", "sleep", image, "3600"]
        self.container = subprocess.run(argv, capture_output=True, text=True, check=True)
        self.id = self.container.stdout.strip()

    def round(self, runs: int) -> dict[str, Any]:
        job = {
            "interactor": INTERACTOR,
            "submission": SUBMISSION,
            "input": f"{QUERIES}\n",
            "runs": runs,
        }
        argv = ["docker", "exec", "-i", self.id, "python3", "-c", BASELINE]
        done = subprocess.run(
            argv, input=json.dumps(job), capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise SystemExit(f"the baseline failed: {done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def close(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.id], capture_output=True, check=False)


def item(n: int) -> dict[str, Any]:
    return {
        "id": f"add-{n}",
        "language": "cpp17",
        "source": SUBMISSION,
        "tests": [{"stdin": f"{QUERIES}\n"}] * TESTS,
        "interactor": {"language": "cpp17", "source": INTERACTOR, "protocol": "testlib"},
        "limits": {"time_s": 2.0},
    }


def judged(farm: Farm, count: int) -> tuple[list[float], int, float]:
    """The tests' wall times of ``count`` items judged one after another, how many items
    were accepted, and the seconds per item end to end."""
    walls: list[float] = []
    accepted = 0
    started = time.perf_counter()
    for n in range(count):
        (record,) = farm.map([item(n)], image="judge")
        result = record.judge
        if result is None:
            raise SystemExit(f"farm failed: {record.message}")
        accepted += result.accepted
        walls += [test.wall_s for test in result.tests]
    return walls, accepted, (time.perf_counter() - started) / count


def summary(walls: list[float]) -> dict[str, float]:
    ordered = sorted(walls)
    return {
        "median_s": statistics.median(ordered),
        "p10_s": ordered[len(ordered) // 10],
        "mean_s": statistics.mean(ordered),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    rounds, per_round = (2, 2) if args.quick else (ROUNDS, ITEMS_PER_ROUND)
    info = {**machine(), "load": os.getloadavg()}
    image = build_image("judge").image_id  # the plain tag may be another checkout's build
    base = Baseline(image)
    farm_walls: list[float] = []
    bare: list[float] = []
    niced: list[float] = []
    accepted = bare_accepted = 0
    item_s: list[float] = []
    try:
        base.round(1)  # compiles both programs
        with Farm.local(images={"judge": 1}) as farm:
            judged(farm, 1)  # compiles both programs (and warms the worker)
            for _ in range(rounds):
                walls, ok_items, per_item = judged(farm, per_round)
                farm_walls += walls
                accepted += ok_items
                item_s.append(per_item)
                timed = base.round(per_round * TESTS)
                bare += timed["walls"]
                niced += timed["niced"]["walls"]
                bare_accepted += timed["accepted"] + timed["niced"]["accepted"]
    finally:
        base.close()
    run, plain, low = summary(farm_walls), summary(bare), summary(niced)
    ratio = run["median_s"] / plain["median_s"]
    ratio_niced = run["median_s"] / low["median_s"]
    ok = ratio <= GOAL
    data = {
        "machine": info,
        "queries": QUERIES,
        "farm": {**run, "items": rounds * per_round, "accepted": accepted, "item_s": item_s},
        "baseline": {**plain, "tests": len(bare), "accepted": bare_accepted},
        "baseline_nice_10": low,
        "ratio": ratio,
        "ratio_at_box_nice": ratio_niced,
        "ratio_p10": run["p10_s"] / plain["p10_s"],
        "goal": {f"farm <= {GOAL}x bare pipe": ok},
    }
    lines = [
        f"bench/judge_interactive.py ({'quick' if args.quick else 'full'}) on {info}",
        f"{QUERIES} queries per test; {rounds} rounds of {per_round} items x {TESTS} tests, "
        "each followed by as many bare runs",
        f"farm (1 worker)     median test {run['median_s'] * 1000:7.1f} ms, p10 "
        f"{run['p10_s'] * 1000:.1f} ms ({accepted}/{rounds * per_round} accepted, "
        f"{statistics.median(item_s) * 1000:.0f} ms per item end to end)",
        f"bare pipe           median test {plain['median_s'] * 1000:7.1f} ms, p10 "
        f"{plain['p10_s'] * 1000:.1f} ms ({bare_accepted}/{2 * len(bare)} accepted)",
        f"bare pipe, nice 10  median test {low['median_s'] * 1000:7.1f} ms, p10 "
        f"{low['p10_s'] * 1000:.1f} ms (a box's tests run at nice 10: uids.BOX_NICE)",
        f"ratio               {ratio:7.2f}x  (goal <= {GOAL}x: {'met' if ok else 'MISSED'}); "
        f"{ratio_niced:.2f}x at nice 10; p10 {data['ratio_p10']:.2f}x",
    ]
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
