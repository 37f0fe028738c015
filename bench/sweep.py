"""Sweep benchmark: a JSONL sweep of snippets through farm against two naive baselines.

Run with the project venv: ``.venv/bin/python bench/sweep.py [--quick] [--json]``.

All three run the same snippets from ``bench/snippets.py`` (small functions plus asserts, most
passing, one in ten failing an assert, a few raising) in this one run:

1. farm: ``Sweep(farm, concurrency=8).run(...)`` on ``Farm.local(workers=2)`` (a redis-server
   and two Celery workers, each owning a hardened Docker sandbox); one fresh session per item
   (a one-shot run for a single-cell item: open, run and close in one task).
   Timed from the start of the sweep to its last output line; the farm's start-up and a small
   warm-up sweep are printed separately and left out.
2. ``docker run --rm --network none`` of the same image per snippet (``python3 -c CODE``),
   with the same concurrency from a thread pool: the naive isolated baseline. It costs about a
   second a snippet, so only the first ``docker_items`` snippets run and items/s is read from
   those (the output says so). Goal: farm/docker run >= 10x.
3. An unisolated ``multiprocessing`` pool (one process per core, pool start-up left out) that
   ``exec()``s each snippet in a fresh dict: the cost of running the code at all. Goal:
   farm/multiprocessing >= 0.7x.

The outcome of every snippet (``pass`` or the exception's name) is compared across the three;
any disagreement is counted and listed. Goals are reported, never asserted: the program exits 0
when a goal is missed. The farm, every container (labelled ``farm.owner=bench-<pid>``) and the
temporary directory are removed on exit, also on errors and Ctrl-C.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchlib import emit, machine, parse_args
from snippets import outcome, snippets

from farm.client import Farm
from farm.sandbox.docker import LABEL_MANAGED, LABEL_OWNER
from farm.sweep import Sweep, plan_sweep

IMAGE = "farm-sandbox:default"
OWNER = f"bench-{os.getpid()}"
WORKERS = 2
CONCURRENCY = 8
ITEM_TIMEOUT_S = 10.0
DOCKER_RUN_TIMEOUT_S = 60.0
CLEANUP_TIMEOUT_S = 15.0
WARMUP_ITEMS = 2 * CONCURRENCY
DOCKER_GOAL_RATIO = 10.0
MP_GOAL_RATIO = 0.7
# the last line of a traceback: "ValueError: ..." or a bare "KeyError"
ENAME = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


@dataclass(frozen=True)
class Plan:
    items: int
    docker_items: int


FULL = Plan(items=200, docker_items=40)
QUICK = Plan(items=100, docker_items=16)


@dataclass
class Run:
    """One system's pass over the snippets: ``outcomes`` maps id to ``pass`` or an exception."""

    name: str
    seconds: float = 0.0
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def per_s(self) -> float:
        return self.n / self.seconds if self.seconds else float("nan")

    def mix(self) -> dict[str, int]:
        counts = Counter(self.outcomes.values())
        return {
            "pass": counts.pop("pass", 0),
            "assert": counts.pop("AssertionError", 0),
            "raise": sum(counts.values()),
        }

    def summary(self) -> dict[str, Any]:
        return {"n": self.n, "seconds": self.seconds, "items_per_s": self.per_s, **self.mix()}


# --- machine line -------------------------------------------------------------------------


# --- the three systems --------------------------------------------------------------------


def _mp_outcome(item: dict[str, Any]) -> tuple[str, str]:
    return item["id"], outcome(item["code"])


def measure_multiprocessing(items: list[dict[str, Any]], processes: int) -> Run:
    """``exec()`` in a fresh dict per snippet, one at a time per process (``chunksize=1``).

    Forked before any farm thread exists; the pool's start-up is left out, like the farm's.
    """
    run = Run(f"multiprocessing Pool({processes}), exec()")
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.map(abs, range(processes))  # every process up before the clock starts
        t0 = time.perf_counter()
        run.outcomes = dict(pool.imap_unordered(_mp_outcome, items, chunksize=1))
        run.seconds = time.perf_counter() - t0
    return run


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


def measure_docker_run(items: list[dict[str, Any]], concurrency: int) -> Run:
    run = Run(f"docker run --rm per snippet (c={concurrency})")
    docker_run_outcome("1")  # warm-up: the image's layers in the page cache
    with ThreadPoolExecutor(concurrency, thread_name_prefix="docker-run") as pool:
        t0 = time.perf_counter()
        found = pool.map(docker_run_outcome, [item["code"] for item in items])
        run.outcomes = dict(zip([item["id"] for item in items], found, strict=True))
        run.seconds = time.perf_counter() - t0
    return run


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")


def farm_outcomes(out_path: Path) -> tuple[dict[str, str], list[float], list[float]]:
    """Outcome per id, and per item its whole duration and its cells' kernel time."""
    outcomes, item_s, exec_s = {}, [], []
    with out_path.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            cells = record["cells"]
            if record["status"] == "ok":
                found = "pass"
            elif record["kind"] == "user" and cells and cells[-1].get("error"):
                found = cells[-1]["error"]["ename"]
            else:
                found = f"{record['kind']}: {record['message']}"
            outcomes[str(record["id"])] = found
            item_s.append(record["duration_s"])
            exec_s.append(sum(c["duration_s"] for c in cells))
    return outcomes, item_s, exec_s


def measure_farm(items: list[dict[str, Any]], tmp: Path, concurrency: int) -> dict[str, Any]:
    """The sweep on a fresh local farm; start-up and a warm-up sweep are timed apart."""
    warm = [{"id": f"warm-{i}", "code": "x = 1"} for i in range(WARMUP_ITEMS)]
    write_jsonl(tmp / "warm.jsonl", warm)
    write_jsonl(tmp / "in.jsonl", items)
    run = Run(f"farm sweep, {WORKERS} workers (c={concurrency})")
    t0 = time.perf_counter()
    with Farm.local(workers=WORKERS) as farm:
        startup_s = time.perf_counter() - t0
        sweep = Sweep(farm, concurrency=concurrency, timeout_s=ITEM_TIMEOUT_S)
        warm_summary = sweep.run(plan_sweep(tmp / "warm.jsonl", tmp / "warm.out"), tmp / "warm.out")
        sweep = Sweep(farm, concurrency=concurrency, timeout_s=ITEM_TIMEOUT_S)
        calls_before = redis_calls(farm)
        summary = sweep.run(plan_sweep(tmp / "in.jsonl", tmp / "out.jsonl"), tmp / "out.jsonl")
        calls = redis_calls(farm) - calls_before
    run.seconds = summary.duration_s
    run.outcomes, item_s, exec_s = farm_outcomes(tmp / "out.jsonl")
    return {
        "run": run,
        "startup_s": startup_s,
        "warmup_s": warm_summary.duration_s,
        "by_outcome": summary.by_outcome,
        "item_mean_ms": 1e3 * sum(item_s) / max(1, len(item_s)),
        "exec_mean_ms": 1e3 * sum(exec_s) / max(1, len(exec_s)),
        "redis_calls_per_item": {
            "total": calls.total() / max(1, len(items)),
            **{k: v / max(1, len(items)) for k, v in calls.most_common(4)},
        },
    }


def redis_calls(farm: Farm) -> Counter[str]:
    """Commands the farm's redis-server has answered so far, by name (all clients)."""
    stats = farm.registry.redis.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


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


# --- report -------------------------------------------------------------------------------


def disagreements(runs: list[Run]) -> dict[str, dict[str, str]]:
    """Ids whose outcome differs between the systems that ran them."""
    ids = sorted({i for run in runs for i in run.outcomes})
    seen = {i: {run.name: run.outcomes[i] for run in runs if i in run.outcomes} for i in ids}
    return {i: found for i, found in seen.items() if len(set(found.values())) > 1}


def report(plan: Plan, farm: dict[str, Any], docker: Run, mp: Run, quick: bool) -> dict[str, Any]:
    f: Run = farm["run"]
    ratios = {"farm/docker_run": f.per_s / docker.per_s, "farm/multiprocessing": f.per_s / mp.per_s}
    differ = disagreements([f, docker, mp])
    return {
        "bench": "sweep",
        "quick": quick,
        "plan": asdict(plan),
        "concurrency": CONCURRENCY,
        "results": {
            "farm": {
                **f.summary(),
                **{k: v for k, v in farm.items() if k != "run"},
            },
            "docker_run": docker.summary(),
            "multiprocessing": mp.summary(),
        },
        "ratios": ratios,
        "goals": {"farm/docker_run": DOCKER_GOAL_RATIO, "farm/multiprocessing": MP_GOAL_RATIO},
        "met": {
            "farm/docker_run": ratios["farm/docker_run"] >= DOCKER_GOAL_RATIO,
            "farm/multiprocessing": ratios["farm/multiprocessing"] >= MP_GOAL_RATIO,
        },
        "disagreements": differ,
    }


def yes_no(ok: bool) -> str:
    return "yes" if ok else "NO"


def render(info: dict[str, Any], out: dict[str, Any], names: list[str]) -> str:
    r, ratio, met, goal = out["results"], out["ratios"], out["met"], out["goals"]
    farm = r["farm"]
    throughput = [("throughput", "n", "wall", "items/s", "pass", "assert", "raise")]
    for name, key in zip(names, ("farm", "docker_run", "multiprocessing"), strict=True):
        s = r[key]
        throughput.append(
            (name, s["n"], f"{s['seconds']:.2f} s", f"{s['items_per_s']:.1f}")
            + (s["pass"], s["assert"], s["raise"])
        )
    ratios = [("ratio of items/s", "", "", "value", "goal", "met")]
    for key in ("farm/docker_run", "farm/multiprocessing"):
        label = key.replace("_", " ")
        ratios.append((label, "", "", f"{ratio[key]:.2f}x", f">= {goal[key]:g}x", yes_no(met[key])))
    n_diff = len(out["disagreements"])
    ratios.append(("outcome disagreements", "", "", str(n_diff), "0", yes_no(n_diff == 0)))
    lines = [
        f"farm sweep bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
        + ("  (--quick)" if out["quick"] else ""),
        "",
    ]
    for table in (throughput, ratios):
        for cells in table:
            padded = [*map(str, cells), "", "", "", "", "", ""][:7]
            lines.append("{:<38} {:>4} {:>9} {:>8} {:>6} {:>7} {:>6}".format(*padded).rstrip())
        lines.append("")
    plan = out["plan"]
    lines += [
        f"farm start-up {farm['startup_s']:.1f} s and a {WARMUP_ITEMS}-item warm-up sweep "
        f"{farm['warmup_s']:.2f} s, both left out; per item (open, run, close) "
        f"{farm['item_mean_ms']:.1f} ms mean, of which kernel exec {farm['exec_mean_ms']:.1f} ms",
        f"docker run: the first {plan['docker_items']} of {plan['items']} snippets only; its "
        "items/s is read from those (--network none, no other hardening flags)",
        "redis commands per item (all clients, top 4): "
        + ", ".join(f"{k} {v:.1f}" for k, v in farm["redis_calls_per_item"].items()),
        "multiprocessing: pool start-up left out; no isolation at all",
    ]
    for i, found in list(out["disagreements"].items())[:5]:
        lines.append(f"disagreement {i}: {found}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    plan = QUICK if args.quick else FULL
    items = snippets(plan.items)
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="farm-bench-sweep-"))
    try:
        mp = measure_multiprocessing(items, os.cpu_count() or 1)
        farm = measure_farm(items, tmp, CONCURRENCY)
        docker = measure_docker_run(items[: plan.docker_items], CONCURRENCY)
    finally:
        left = remove_leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"containers of {OWNER} left behind: {left}"
    out = report(plan, farm, docker, mp, args.quick)
    table = render(info, out, [farm["run"].name, docker.name, mp.name])
    return emit(table, {"machine": info, **out}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
