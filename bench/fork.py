"""Branching benchmark: checkpoints, rollbacks and forks of a session, on a real farm.

Run with the project venv: ``.venv/bin/python bench/fork.py [--quick] [--json]``.

One ``Farm.local(workers=1)`` (a redis-server and a Celery worker owning a Docker sandbox).
Measured, each against a baseline taken in the same run:

- ``checkpoint`` and ``rollback`` of a session holding 100 MB (a touched ``bytearray``), p50,
  against a bare cell (``1``) of the same session: goal <= 10 ms each; the same straight at a
  sandbox's kernel (no broker, no worker), so the kernel's share shows;
- ``fork(1)`` p50 and ``fork(16)`` in all, against opening a fresh session: goals <= 50 ms and
  <= 300 ms;
- "setup once, fork per item": items that each need a heavy setup, done as
  one setup and a fork per item, against a fresh session per item that does the setup itself:
  goal >= 10x. Two ways: ``fork(n)`` (by value: a box per item, the state pickled into each),
  and one checkpoint, then ``run(item, rollback_to=cp)`` per item (exact: each item runs in a
  fork of the checkpoint's process, one at a time in the session's box). Two setups: many
  stdlib modules imported and a table of 300,000 hashes built (the default image), and the
  issue's own, ``import numpy, pandas`` and a 200,000 x 8 frame, on an environment built here
  with both (``farm-sandbox:bench-pandas-<pid>``, removed at the end).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchlib import Latency, emit, environments, machine, parse_args

from farm.client import Farm, Session
from farm.sandbox.docker import DockerSandbox

HOLD = "big = bytearray(100 * 1024 * 1024)\nfor i in range(0, len(big), 4096): big[i] = 1"
SETUP = (
    "import hashlib, json, csv, decimal, fractions, statistics, email.parser, http.client\n"
    "import xml.etree.ElementTree, sqlite3, asyncio, difflib, unittest, argparse, logging\n"
    "table = {i: hashlib.sha256(str(i).encode()).hexdigest()[:8] for i in range(300_000)}\n"
)
FLOOR = (  # a bare fork of the same process and the child's exit: what a checkpoint cannot beat
    "import os, time\nt0 = time.perf_counter()\npid = os.fork()\nif pid == 0: os._exit(0)\n"
    "os.waitpid(pid, 0)\ntime.perf_counter() - t0"
)
ITEM = "sum(int(table[i], 16) % 7 for i in range({k}, 300_000, 1000))"
ROLLED = 5  # the rollback variant runs this many times the items (it is quick), per item
PANDAS_SETUP = (  # the issue's own case, on an environment with numpy and pandas
    "import numpy, pandas\n"
    "df = pandas.DataFrame(numpy.random.default_rng(0).random((200_000, 8)))\n"
)
PANDAS_ITEM = "float(df.iloc[{k}::1000].sum().sum())"


@dataclass(frozen=True)
class Plan:
    rounds: int  # checkpoint/rollback pairs, fork(1)s, fresh opens
    items: int  # items of the setup-once comparison


FULL = Plan(rounds=20, items=8)
QUICK = Plan(rounds=5, items=4)


def timed(samples: Latency, fn: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter_ns()
    out = fn(*args, **kwargs)
    samples.samples_ns.append(time.perf_counter_ns() - t0)
    return out


def checkpoints(farm: Farm, plan: Plan) -> dict[str, Latency]:
    cell, take, back = Latency("cell 1"), Latency("checkpoint"), Latency("rollback")
    spend = Latency("rollback, keep=False")
    floor = Latency("bare fork")
    with farm.session(timeout_s=120) as s:
        assert s.run(HOLD).ok
        for _ in range(plan.rounds):
            timed(cell, s.run, "1")
            bare = s.run(FLOOR).value
            assert bare is not None
            floor.samples_ns.append(int(float(bare.text) * 1e9))
            cp = timed(take, s.checkpoint)
            s.run("big[0] = 2")
            timed(back, s.rollback, cp)
            s.run("big[0] = 3")
            t0 = time.perf_counter_ns()
            s.rollback(cp, keep=False)  # spent: the held copy goes on, one fork less
            spend.samples_ns.append(time.perf_counter_ns() - t0)
        assert s.run("big[0]").value is not None
    return {"cell": cell, "checkpoint": take, "rollback": back, "spend": spend, "floor": floor}


def at_the_kernel(plan: Plan) -> dict[str, Latency]:
    """The same checkpoints and rollbacks straight at a sandbox's kernel (a ``DockerSandbox``
    of the default image, no broker, no worker): the kernel's share of the farm's figures."""
    cell, take, back = Latency("cell 1"), Latency("checkpoint"), Latency("rollback")
    spend = Latency("rollback, keep=False")
    with DockerSandbox(owner=f"bench-fork-{os.getpid()}") as box, box.kernel() as kernel:
        sid = kernel.open_session()["session_id"]
        epoch = kernel.execute(sid, HOLD, epoch=0)["epoch"]

        def branch(op: str, **fields: Any) -> int:
            message: Any = {"type": "branch", "op": op, "session_id": sid, **fields}
            return int(kernel.branch(message)["epoch"])

        for _ in range(plan.rounds * 2):
            timed(cell, kernel.execute, sid, "1", epoch=epoch)
            t0 = time.perf_counter_ns()
            cp = kernel.branch({"type": "branch", "op": "checkpoint", "session_id": sid})
            take.samples_ns.append(time.perf_counter_ns() - t0)
            kernel.execute(sid, "big[0] = 2", epoch=epoch)
            epoch = timed(back, branch, "rollback", checkpoint_id=cp["checkpoint_id"])
            kernel.execute(sid, "big[0] = 3", epoch=epoch)
            epoch = timed(spend, branch, "rollback", checkpoint_id=cp["checkpoint_id"], keep=False)
    return {"cell": cell, "checkpoint": take, "rollback": back, "spend": spend}


def forks(farm: Farm, plan: Plan) -> dict[str, Any]:
    opens, one = Latency("open"), Latency("fork(1)")
    with farm.session(timeout_s=120) as s:
        s.run("x = list(range(1000))")
        for _ in range(plan.rounds):
            timed(opens, farm.session).close()
            for f in timed(one, s.fork, 1):
                f.close()
        t0 = time.perf_counter()
        many = s.fork(16)
        sixteen_s = time.perf_counter() - t0
        for f in many:
            f.close()
    return {"open": opens, "fork1": one, "fork16_s": sixteen_s}


@dataclass(frozen=True)
class Setup:
    """A heavy setup, an item that needs it, and the image both run on."""

    code: str
    item: str
    image: str = "default"


STDLIB = Setup(SETUP, ITEM)
PANDAS = Setup(PANDAS_SETUP, PANDAS_ITEM, f"bench-pandas-{os.getpid()}")


def setup_once(farm: Farm, plan: Plan, setup: Setup) -> dict[str, float]:
    def session() -> Session:
        return farm.session(image=setup.image, timeout_s=300)

    t0 = time.perf_counter()
    for k in range(plan.items):  # the baseline: every item sets up for itself
        with session() as s:
            assert s.run(setup.code).ok and s.run(setup.item.format(k=k)).ok
    per_item_s = time.perf_counter() - t0
    t0 = time.perf_counter()  # by value: each item in a box of its own, the state pickled
    with session() as parent:
        assert parent.run(setup.code).ok
        items = parent.fork(plan.items)
        for k, f in enumerate(items):
            with f:
                assert f.run(setup.item.format(k=k)).ok
    forked_s = time.perf_counter() - t0
    t0 = time.perf_counter()  # exact: each item in a fork of the checkpoint, in the one box
    with session() as parent:
        assert parent.run(setup.code).ok
        cp = parent.checkpoint()
        t1 = time.perf_counter()
        for k in range(plan.items * ROLLED):
            assert parent.run(setup.item.format(k=k % plan.items), rollback_to=cp).ok
        t2 = time.perf_counter()
    return {
        "per_item_s": per_item_s,  # plan.items items, each with its setup
        "forked_s": forked_s,  # the same items, one setup and fork(plan.items)
        "rolled_s": (t2 - t0) / ROLLED,  # plan.items items' share: the setup and 1/ROLLED...
        "rolled_item_s": (t2 - t1) / (plan.items * ROLLED),  # ...and one item, setup left out
    }


def ms(latency: Latency) -> float:
    return latency.p(50) / 1e6


def main() -> int:
    args = parse_args(__doc__ or "")
    plan = QUICK if args.quick else FULL
    pip = ["numpy", "pandas"]
    with (
        environments({PANDAS.image: (pip, [])}),
        Farm.local(images={"default": 1, PANDAS.image: 1}) as farm,
    ):
        farm.session().close()  # the sandbox is up and warm
        cps = checkpoints(farm, plan)
        fk = forks(farm, plan)
        once = setup_once(farm, plan, STDLIB)
        farm.session(image=PANDAS.image).close()
        pandas = setup_once(farm, plan, PANDAS)
    kernel = at_the_kernel(plan)
    data = {
        "machine": machine(),
        "plan": plan.__dict__,
        "cell_ms": ms(cps["cell"]),
        "bare_fork_ms": ms(cps["floor"]),
        "checkpoint_ms": ms(cps["checkpoint"]),
        "rollback_ms": ms(cps["rollback"]),
        "rollback_spent_ms": ms(cps["spend"]),
        "kernel": {name: ms(latency) for name, latency in kernel.items()},
        "open_ms": ms(fk["open"]),
        "fork1_ms": ms(fk["fork1"]),
        "fork16_ms": fk["fork16_s"] * 1000,
        "setup_per_item_s": once["per_item_s"],
        "setup_once_fork_s": once["forked_s"],
        "setup_ratio": once["per_item_s"] / once["forked_s"],
        "setup_once_rollback_s": once["rolled_s"],
        "setup_rollback_ratio": once["per_item_s"] / once["rolled_s"],
        "pandas": pandas,
        "pandas_fork_ratio": pandas["per_item_s"] / pandas["forked_s"],
        "pandas_rollback_ratio": pandas["per_item_s"] / pandas["rolled_s"],
        "setup_rollback_steady": once["per_item_s"] / plan.items / once["rolled_item_s"],
        "pandas_rollback_steady": pandas["per_item_s"] / plan.items / pandas["rolled_item_s"],
    }
    spread = statistics.pstdev([s / 1e6 for s in cps["rollback"].samples_ns])
    lines = [
        f"# bench/fork.py  {data['machine']['date']}  {data['machine']['cpu']}  "
        f"{data['machine']['cores']} cores",
        f"checkpoint (100 MB) p50  {data['checkpoint_ms']:7.1f} ms  "
        f"({data['checkpoint_ms'] / data['cell_ms']:.1f}x a bare cell, {data['cell_ms']:.1f} ms)"
        "  goal <= 10 ms",
        f"rollback   (100 MB) p50  {data['rollback_ms']:7.1f} ms  "
        f"({data['rollback_ms'] / data['cell_ms']:.1f}x a bare cell; sd {spread:.1f} ms)"
        "  goal <= 10 ms",
        f"rollback, keep=False p50 {data['rollback_spent_ms']:7.1f} ms  "
        f"({data['rollback_spent_ms'] / data['cell_ms']:.1f}x a bare cell)  goal <= 10 ms",
        "  at the kernel alone (a Docker sandbox, no broker or worker), p50: cell "
        f"{data['kernel']['cell']:.2f}, checkpoint {data['kernel']['checkpoint']:.2f}, rollback "
        f"{data['kernel']['rollback']:.2f}, keep=False {data['kernel']['spend']:.2f} ms",
        f"  floor: a bare fork+exit of that process in its box, p50 {data['bare_fork_ms']:.1f} ms"
        f" (checkpoint {data['checkpoint_ms'] / data['bare_fork_ms']:.1f}x, rollback "
        f"{data['rollback_ms'] / data['bare_fork_ms']:.1f}x)",
        f"fork(1) p50              {data['fork1_ms']:7.1f} ms  "
        f"({data['fork1_ms'] / data['open_ms']:.1f}x an open, {data['open_ms']:.1f} ms)"
        "  goal <= 50 ms",
        f"fork(16) in all          {data['fork16_ms']:7.1f} ms  "
        f"({data['fork16_ms'] / data['open_ms']:.1f}x one open)  goal <= 300 ms",
        f"setup once + fork/item   {data['setup_ratio']:7.1f}x  faster than setup per item "
        f"({once['per_item_s']:.2f} s vs {once['forked_s']:.2f} s, {plan.items} items; "
        "by value, a box per item)  goal >= 10x",
        f"setup once + rollback/item {data['setup_rollback_ratio']:5.1f}x  faster than setup "
        f"per item ({once['per_item_s']:.2f} s vs {once['rolled_s']:.2f} s; exact, each item "
        "in a fork of one checkpoint, in the one box)  goal >= 10x",
        f"  in a long map (the setup's share -> 0): {data['setup_rollback_steady']:.1f}x "
        f"({once['rolled_item_s'] * 1000:.1f} ms an item against "
        f"{once['per_item_s'] / plan.items * 1000:.0f} ms with its setup)",
        f"  pandas (import numpy, pandas + a 200,000 x 8 frame): setup per item "
        f"{pandas['per_item_s'] / plan.items:.2f} s an item; fork/item "
        f"{data['pandas_fork_ratio']:.1f}x, rollback/item {data['pandas_rollback_ratio']:.1f}x, "
        f"in a long map {data['pandas_rollback_steady']:.1f}x "
        f"({pandas['rolled_item_s'] * 1000:.1f} ms an item)  goal >= 10x",
    ]
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
