"""Judge benchmark: ``Farm.map`` of judge items against a plain ``subprocess`` loop, in one run.

Run with the project venv: ``.venv/bin/python bench/judge.py [--quick] [--json]``.

One problem (the sum of a line of 2,000 numbers), ``TESTS`` (10) tests, ``CPP`` (500) C++17 and
``PY`` (500) Python submissions of it (``--quick``: 50 and 50). The C++ ones are ``DISTINCT``
(25) sources submitted many times each, as pass@k samples and reruns are; the Python ones are
all distinct.

1. farm: ``Farm.map`` of the 1,000 items (``ordered=False``) on ``Farm.local`` with 2 workers
   of the judge image (each a Docker sandbox; every submission in a box of its own, compiled
   once per worker and source by the compile cache, each test a fresh process measured by the
   kernel). A warm-up map is left out. Tests/s, end to end (compiles included).
2. baseline: the same compiled programs and Python sources run by a plain ``subprocess`` loop
   with no sandbox, 2 processes (one per core), in a container of the same image (where the
   toolchains are), its compiles left out: tests/s. Goal (issues 33, 35): farm >= 0.8x.
3. compile cache: ``COLD`` (20) C++ sources never seen, judged once (each compiles), again
   (a hit where the same worker takes it: the cache is per worker) and a third time (mostly
   hits): submissions/s of each, and the ratio of the third to the first.
4. stored problems: bytes per item of a map with the tests inline vs one naming the problem
   stored by digest (``bench/judge_bytes.py``), and their ratio.

Both sides also report CPU seconds per test (farm: client, workers, sandboxes and Redis, read by
``costs.Snapshot``; baseline: the loop's processes and their tests, ``RUSAGE_CHILDREN``): their
ratio is what tests/s would be on a machine nobody else uses, and moves little when other
processes share the cores (the tests/s ratio then moves with their load). The farm's include
its compile steps (each C++ source once per worker, Python's syntax checks), the loop's leave
its compiles out: a line gives the farm's CPU per test without them too (the ``compile.time_s``
of the steps that ran). The items are judged once more naming the problem stored by digest
(other sources, compiled again), as a user judging many submissions of one problem sends them
(docs/judge.md, "Stored problems"): its tests/s and CPU per test.

Verdicts must agree (all accepted). Goals are reported, never asserted; the program exits 0.
The farm and the baseline's container are stopped on exit.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import judge_bytes
from benchlib import emit, machine, parse_args
from costs import Snapshot

from farm.client import Farm
from farm.judge.problems import Problem
from farm.models.judge import Verdict
from farm.sandbox.catalog import build_image

TESTS = 10
NUMBERS = 2000
GOAL = 0.8
LIMITS = {"time_s": 2.0, "memory_mb": 256}


@dataclass
class Plan:
    cpp: int
    py: int
    distinct: int
    cold: int


FULL = Plan(cpp=500, py=500, distinct=25, cold=20)
QUICK = Plan(cpp=50, py=50, distinct=5, cold=6)

CPP = (
    "// submission {n}\n#include <cstdio>\nint main(){{int n;long long s=0,x;"
    'if(scanf("%d",&n)!=1)return 1;for(int i=0;i<n;i++){{scanf("%lld",&x);s+=x;}}'
    'printf("%lld\\n",s);}}\n'
)
PY = (
    "# submission {n}\nimport sys\nn, *xs = map(int, sys.stdin.read().split())\n"
    "print(sum(xs[:n]))\n"
)

# The baseline, run by python3 in a container of the judge image: compile each distinct
# source, then run every test of every submission with subprocess from 2 processes.
BASELINE = r"""
import json, os, resource, subprocess, sys, time
from multiprocessing import Pool
job = json.load(sys.stdin)
os.chdir("/tmp")
def cpu():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool's, once reaped, with tests
    return used.ru_utime + used.ru_stime
compile_cpu, compile_started = cpu(), time.perf_counter()
binaries = {}
for key, source in job["cpp"].items():
    with open(f"s{key}.cpp", "w") as f:
        f.write(source)
    subprocess.run(["g++", "-O2", "-std=gnu++17", "-o", f"s{key}", f"s{key}.cpp"], check=True)
    binaries[key] = f"./s{key}"
compile_s, compile_cpu = time.perf_counter() - compile_started, cpu() - compile_cpu
for key, source in job["py"].items():
    with open(f"p{key}.py", "w") as f:
        f.write(source)
def one(work):
    argv, stdin, expected = work
    done = subprocess.run(argv, input=stdin.encode(), capture_output=True, timeout=10)
    return done.returncode == 0 and done.stdout.split() == expected.encode().split()
work = []
for kind, key in job["order"]:
    argv = [binaries[key]] if kind == "cpp" else ["python3", f"p{key}.py"]
    work += [(argv, t["stdin"], t["expected"]) for t in job["tests"]]
before = cpu()
with Pool(2) as pool:
    started = time.perf_counter()
    passed = pool.map(one, work, chunksize=8)
    took = time.perf_counter() - started
used = cpu() - before
print(json.dumps({"tests": len(work), "passed": sum(passed), "seconds": took, "cpu_s": used,
                  "compiles": len(binaries), "compile_s": compile_s, "compile_cpu_s": compile_cpu}))
"""


def problem_tests(seed: int = 5) -> list[dict[str, str]]:
    rng = random.Random(seed)
    tests = []
    for _ in range(TESTS):
        numbers = [rng.randint(-(10**9), 10**9) for _ in range(NUMBERS)]
        stdin = f"{NUMBERS}\n{' '.join(map(str, numbers))}\n"
        tests.append({"stdin": stdin, "expected": f"{sum(numbers)}\n"})
    return tests


def items(
    plan: Plan, tests: list[dict[str, str]], problem: str | None = None, tag: str = ""
) -> list[dict[str, Any]]:
    """C++ and Python submissions interleaved (a mixed batch, as an eval's is), with the
    tests inline or naming ``problem`` (stored); ``tag`` makes other sources of each."""
    cpp = [
        {
            "id": f"{tag}cpp-{n}",
            "language": "cpp17",
            "source": CPP.format(n=f"{tag}{n % plan.distinct}"),
        }
        for n in range(plan.cpp)
    ]
    py = [
        {"id": f"{tag}py-{n}", "language": "python3", "source": PY.format(n=f"{tag}{n}")}
        for n in range(plan.py)
    ]
    mixed = [x for pair in zip(cpp, py, strict=False) for x in pair]
    mixed += cpp[len(py) :] + py[len(cpp) :]
    given = {"tests": tests, "limits": LIMITS} if problem is None else {"problem": problem}
    return [{**item, **given} for item in mixed]


def baseline(plan: Plan, tests: list[dict[str, str]]) -> dict[str, Any]:
    job = {
        "cpp": {str(n): CPP.format(n=n) for n in range(plan.distinct)},
        "py": {str(n): PY.format(n=n) for n in range(plan.py)},
        "order": [("cpp", str(n % plan.distinct)) for n in range(plan.cpp)]
        + [("py", str(n)) for n in range(plan.py)],
        "tests": tests,
    }
    argv = ["docker", "run", "--rm", "-i", "--network", "none", "--label", "farm.owner=bench-judge"]
    argv += ["--entrypoint", "python3", "farm-sandbox:judge", "-c", BASELINE]
    done = subprocess.run(argv, input=json.dumps(job), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the baseline failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    result["tests_per_s"] = result["tests"] / result["seconds"]
    result["cpu_ms_per_test"] = result["cpu_s"] / result["tests"] * 1e3
    return result


def judged(farm: Farm, batch: list[dict[str, Any]]) -> dict[str, Any]:
    before = Snapshot.take(farm)
    started = time.perf_counter()
    records = list(farm.map(batch, image="judge", ordered=False, retries=1))
    took = time.perf_counter() - started
    cost = Snapshot.take(farm) - before
    accepted = sum(r.judge is not None and r.judge.verdict == Verdict.AC for r in records)
    cached = sum(bool(r.judge and r.judge.compile and r.judge.compile.cached) for r in records)
    tests = sum(len(r.judge.tests) for r in records if r.judge is not None)
    ran = [r.judge.compile for r in records if r.judge and r.judge.compile]
    compile_cpu_s = sum(c.time_s for c in ran if not c.cached)  # the compilers' and checks' own
    return {
        "submissions": len(records),
        "accepted": accepted,
        "compiles_cached": cached,
        "tests": tests,
        "seconds": took,
        "tests_per_s": tests / took,
        "submissions_per_s": len(records) / took,
        "cpu_ms_per_test": {k: (v or 0.0) / max(1, tests) * 1e3 for k, v in cost.cpu_s.items()},
        "compile_steps": sum(not c.cached for c in ran),
        "compile_cpu_ms_per_test": compile_cpu_s / max(1, tests) * 1e3,
        "others_share": cost.others_share,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    plan = QUICK if args.quick else FULL
    info = {**machine(), "load": os.getloadavg()}
    build_image("judge")
    tests = problem_tests()
    base = baseline(plan, tests)
    with Farm.local(images={"judge": 2}) as farm:
        warm = [{**i, "id": f"warm-{i['id']}"} for i in items(QUICK, tests)[:8]]
        judged(farm, warm)
        main_run = judged(farm, items(plan, tests))
        digest = farm.put_problem(Problem.model_validate({"tests": tests, "limits": LIMITS}))
        by_digest = judged(farm, items(plan, tests, problem=digest, tag="stored "))
        cold_items = [
            {"id": f"cold-{n}", "language": "cpp17", "source": CPP.format(n=f"cold {n}")}
            for n in range(plan.cold)
        ]
        cold_items = [{**i, "tests": tests, "limits": LIMITS} for i in cold_items]
        cold = judged(farm, cold_items)
        again = judged(farm, [{**i, "id": f"again-{i['id']}"} for i in cold_items])
        warm_again = judged(farm, [{**i, "id": f"warm-{i['id']}"} for i in cold_items])
        count = judge_bytes.QUICK_ITEMS if args.quick else judge_bytes.ITEMS
        stored = judge_bytes.measure(farm, tests, LIMITS, count)  # bytes per item
    ratio = main_run["tests_per_s"] / base["tests_per_s"]
    farm_cpu = sum(main_run["cpu_ms_per_test"].values())
    cpu_ratio = base["cpu_ms_per_test"] / farm_cpu
    # both sides without their compiles: the loop's are outside its figures, the farm's
    # (once per worker and source, and Python's syntax checks) are not
    bare_cpu = farm_cpu - main_run["compile_cpu_ms_per_test"]
    stored_cpu = sum(by_digest["cpu_ms_per_test"].values()) - by_digest["compile_cpu_ms_per_test"]
    ok = ratio >= GOAL
    cache_ratio = warm_again["submissions_per_s"] / cold["submissions_per_s"]
    data = {
        "machine": info,
        "plan": plan.__dict__,
        "farm": main_run,
        "baseline": base,
        "ratio": ratio,
        "cpu_ratio": cpu_ratio,
        "cpu_ratio_without_compiles": base["cpu_ms_per_test"] / bare_cpu,
        "stored": by_digest,
        "compile_cache": {"cold": cold, "again": again, "warm": warm_again, "ratio": cache_ratio},
        "stored_problem": stored,
        "goal": {f"farm >= {GOAL}x baseline": ratio >= GOAL},
    }
    lines = [
        f"bench/judge.py ({'quick' if args.quick else 'full'}) on {info}",
        f"{plan.cpp} C++17 ({plan.distinct} distinct) + {plan.py} Python submissions, "
        f"{TESTS} tests each",
        f"farm (2 workers)      {main_run['tests_per_s']:9.1f} tests/s  "
        f"({main_run['accepted']}/{main_run['submissions']} accepted, "
        f"{main_run['compiles_cached']} compiles cached, {main_run['seconds']:.1f} s)",
        f"subprocess loop (2)   {base['tests_per_s']:9.1f} tests/s  "
        f"({base['passed']}/{base['tests']} tests passed, {base['seconds']:.1f} s)",
        f"ratio                 {ratio:9.2f}x  (goal >= {GOAL}x: {'met' if ok else 'MISSED'}; "
        f"others used {main_run['others_share']:.0%} of the cores meanwhile)",
        f"CPU per test          farm {farm_cpu:.2f} ms ("
        + ", ".join(f"{k} {v:.2f}" for k, v in main_run["cpu_ms_per_test"].items())
        + f"), loop {base['cpu_ms_per_test']:.2f} ms: {cpu_ratio:.2f}x",
        f"  compiles left out   farm {bare_cpu:.2f} ms ({main_run['compile_steps']} compile "
        f"steps, {main_run['compile_cpu_ms_per_test']:.2f} ms/test), loop "
        f"{base['cpu_ms_per_test']:.2f} ms ({base['compiles']} compiles, "
        f"{base['compile_cpu_s']:.2f} s, not counted): {base['cpu_ms_per_test'] / bare_cpu:.2f}x",
        f"  problem by digest   {by_digest['tests_per_s']:9.1f} tests/s "
        f"({by_digest['accepted']}/{by_digest['submissions']} accepted, "
        f"{by_digest['tests_per_s'] / base['tests_per_s']:.2f}x the loop), CPU per test, "
        f"compiles left out, {stored_cpu:.2f} ms: {base['cpu_ms_per_test'] / stored_cpu:.2f}x",
        f"compile cache: {plan.cold} new C++ sources {cold['submissions_per_s']:.1f}/s; again "
        f"{again['submissions_per_s']:.1f}/s ({again['compiles_cached']} cached: a cache is "
        f"per worker); a third time {warm_again['submissions_per_s']:.1f}/s "
        f"({warm_again['compiles_cached']} cached, {cache_ratio:.1f}x the first)",
        *judge_bytes.lines(stored),
    ]
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
