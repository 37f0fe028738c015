"""Farm benchmark: warm session round trip and throughput against Celery echo and ipykernel.

Run with the project venv: ``.venv/bin/python bench/farm_e2e.py [--quick] [--json]``.

Figures, all measured in this one run against one ``Farm.local(workers=2)`` (a redis-server
and two Celery worker processes, each owning a Docker sandbox):

1. ``session.run("x+1")`` on a warm session (after ``x = 1``), p50/p99, against two baselines
   sampled alongside it in alternating blocks, so drift in machine load hits them alike:
   - the bare ``farm.echo`` Celery task on the same broker and workers, its payload padded so
     that it carries as many bytes per round trip as farm's request plus reply.
     Goal: farm/echo <= 1.3;
   - a local ipykernel (``jupyter_client.KernelManager`` and its blocking client) running
     ``x+1``: timed from ``execute`` until both the ``execute_reply`` on shell and the idle
     status on iopub (after the ``execute_result``) have arrived, i.e. what a user waits for.
     Goal: farm/ipykernel < 1;
   - for reference, one Redis round trip (``PING``): farm's path has two beyond Celery's own
     (the session check and the exec claim), so echo + 2 of them is what no kernel can beat.
2. Throughput of trivial execs: ``THREADS`` client threads, each with its own session (the
   sessions spread over both workers), run ``x+1`` in a loop for a fixed time. Goal: 300/s.
   The bare echo task driven by the same number of threads is shown as the ceiling that the
   broker and the workers' Celery machinery allow.

Goals are reported, never asserted: the program exits 0 when a goal is missed. The farm (its
containers and redis) and the ipykernel are stopped on exit, also on errors and Ctrl-C.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from benchlib import Latency, emit, machine, parse_args
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from farm.celeryconf import TASK_ECHO
from farm.client import Farm, Session
from farm.client.broker import release
from farm.image_name import ImageName

CODE = "x+1"
WORKERS = 2
THREADS = 16
CALL_TIMEOUT_S = 30.0
KERNEL_READY_S = 60.0
RTT_BLOCK = 50  # farm, echo and ipykernel samples alternate in blocks of this many calls
BALANCE_TRIES = 8  # extra opens allowed to even out sessions over the workers
ECHO_GOAL_RATIO = 1.3
IPYKERNEL_GOAL_RATIO = 1.0
THROUGHPUT_GOAL = 300.0


@dataclass(frozen=True)
class Plan:
    rtt_calls: int
    rtt_warmup: int
    throughput_s: float
    echo_throughput_s: float
    budget_s: float  # the latency loops stop here whatever their count


FULL = Plan(rtt_calls=500, rtt_warmup=50, throughput_s=10.0, echo_throughput_s=10.0, budget_s=60)
QUICK = Plan(rtt_calls=150, rtt_warmup=20, throughput_s=3.0, echo_throughput_s=3.0, budget_s=20)


@dataclass
class Throughput:
    name: str
    threads: int
    calls: int
    seconds: float
    errors: int
    per_worker: dict[str, int]

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else float("nan")


class Deadline:
    """One budget shared by the latency loops: a slow machine gets fewer samples, no hang."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.end


# --- machine line -------------------------------------------------------------------------


# --- the systems measured -----------------------------------------------------------------


def farm_call(session: Session) -> Callable[[], None]:
    def call() -> None:
        result = session.run(CODE)
        if not result.ok:
            raise RuntimeError(f"{CODE!r} failed on the farm: {result.error}")

    return call


def echo_payload(session: Session) -> dict[str, Any]:
    """A request-shaped payload padded so that two trips of it carry farm's request + reply."""
    request = session.exec_request(CODE).model_dump(mode="json")
    reply = session.run(CODE).model_dump(mode="json", exclude_defaults=True)
    target = (len(json.dumps(request)) + len(json.dumps(reply))) // 2
    payload = dict(request, pad="")
    payload["pad"] = "x" * max(0, target - len(json.dumps(payload)))
    return payload


def echo_call(farm: Farm, payload: dict[str, Any]) -> Callable[[], None]:
    queue = ImageName("default").queue

    def call() -> None:
        pending = farm.app.send_task(TASK_ECHO, args=[payload], queue=queue)
        pending.get(timeout=CALL_TIMEOUT_S)
        pending.forget()
        release(pending, unsubscribe=False)  # as farm's own calls do: nothing left for __del__

    return call


@contextmanager
def ipykernel() -> Iterator[BlockingKernelClient]:
    """A local ipykernel and a connected blocking client; the kernel is shut down on exit."""
    manager = KernelManager(kernel_name="python3")
    # its one warning (TCP without encryption, on loopback) would interleave with the table
    manager.start_kernel(extra_arguments=["--IPKernelApp.log_level=ERROR"])
    client: BlockingKernelClient | None = None
    try:
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=KERNEL_READY_S)
        yield client
    finally:
        if client is not None:
            client.stop_channels()
        manager.shutdown_kernel(now=False)


def ipykernel_call(client: BlockingKernelClient) -> Callable[[], None]:
    def call() -> None:
        msg_id = client.execute(CODE)
        replied = idle = False
        while not replied:
            msg = client.get_shell_msg(timeout=CALL_TIMEOUT_S)
            replied = msg["parent_header"].get("msg_id") == msg_id
        if msg["content"]["status"] != "ok":
            raise RuntimeError(f"{CODE!r} failed in ipykernel: {msg['content']}")
        while not idle:
            msg = client.get_iopub_msg(timeout=CALL_TIMEOUT_S)
            idle = (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            )

    return call


# --- measurements -------------------------------------------------------------------------


def timed(call: Callable[[], None], out: Latency, n: int, deadline: Deadline) -> None:
    for _ in range(n):
        if deadline.passed():
            return
        t0 = time.perf_counter_ns()
        call()
        out.samples_ns.append(time.perf_counter_ns() - t0)


def alternate(calls: dict[str, Callable[[], None]], plan: Plan) -> dict[str, Latency]:
    """Warm each call up, then sample all of them in alternating blocks of ``RTT_BLOCK``."""
    deadline = Deadline(plan.budget_s)
    samples = {name: Latency(name) for name in calls}
    for call in calls.values():
        timed(call, Latency("warm-up"), plan.rtt_warmup, deadline)
    while not deadline.passed() and any(
        len(s.samples_ns) < plan.rtt_calls for s in samples.values()
    ):
        for name, call in calls.items():
            block = min(RTT_BLOCK, plan.rtt_calls - len(samples[name].samples_ns))
            timed(call, samples[name], block, deadline)
    return samples


def open_balanced(farm: Farm, count: int, stack: ExitStack) -> list[Session]:
    """``count`` sessions opened concurrently, evened out over the workers by a few re-opens.

    Opens go to the shared queue, so either worker may take each one; extra sessions on the
    busier worker are closed again (their owner is ``stack``, which closes the kept ones).
    """
    opened: list[Session] = []
    lock = threading.Lock()

    def open_one() -> None:
        session = farm.session()
        with lock:
            stack.enter_context(session)  # ExitStack is not thread-safe
            opened.append(session)
        session.run("x = 1")

    run_threads(open_one, count)
    for _ in range(BALANCE_TRIES):
        per = Counter(s.worker for s in opened)
        if len(per) >= WORKERS and max(per.values()) - min(per.values()) <= 1:
            break
        open_one()
        busiest, _ = per.most_common(1)[0]
        if opened[-1].worker != busiest:
            drop = next(s for s in opened if s.worker == busiest)
            opened.remove(drop)
            drop.close()
        else:
            opened.pop().close()
    return opened


def run_threads(target: Callable[[], None], count: int) -> None:
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CALL_TIMEOUT_S + 60)


def throughput(
    name: str, calls: list[tuple[str, Callable[[], None]]], seconds: float
) -> Throughput:
    """Each thread runs its own call in a loop until ``seconds`` after they all started."""
    counts = Counter[str]()
    errors = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(calls) + 1)
    stop = [0.0]

    def loop(worker: str, call: Callable[[], None]) -> None:
        done = failed = 0
        start.wait()
        while time.monotonic() < stop[0]:
            try:
                call()
                done += 1
            except Exception:
                failed += 1
        with lock:
            counts[worker] += done
            errors[0] += failed

    threads = [threading.Thread(target=loop, args=c, daemon=True) for c in calls]
    for thread in threads:
        thread.start()
    t0 = time.monotonic()
    stop[0] = t0 + seconds
    start.wait()
    for thread in threads:
        thread.join(seconds + CALL_TIMEOUT_S + 10)
    elapsed = time.monotonic() - t0
    return Throughput(name, len(calls), sum(counts.values()), elapsed, errors[0], dict(counts))


def measure(plan: Plan) -> dict[str, Any]:
    with (
        Farm.local(workers=WORKERS) as farm,
        ipykernel() as kernel,
        ExitStack() as sessions,
    ):
        session = sessions.enter_context(farm.session())
        session.run("x = 1")
        kernel.execute_interactive("x = 1", timeout=CALL_TIMEOUT_S)
        payload = echo_payload(session)
        latency = alternate(
            {
                "farm": farm_call(session),
                "echo": echo_call(farm, payload),
                "ipykernel": ipykernel_call(kernel),
                "redis": farm.registry.redis.ping,
            },
            plan,
        )
        session.close()
        pool = open_balanced(farm, THREADS, sessions)
        farm_tp = throughput("farm", [(s.worker, farm_call(s)) for s in pool], plan.throughput_s)
        echo = echo_call(farm, payload)
        echo_tp = throughput("echo", [("any", echo)] * THREADS, plan.echo_throughput_s)
        bytes_ = {"echo_payload": len(json.dumps(payload))}
    return {"latency": latency, "throughput": [farm_tp, echo_tp], "bytes": bytes_}


# --- report -------------------------------------------------------------------------------


def summarise(measured: dict[str, Any]) -> dict[str, Any]:
    lat: dict[str, Latency] = measured["latency"]
    farm_tp, echo_tp = measured["throughput"]

    def ratio(base: str, q: float) -> float:
        return lat["farm"].p(q) / lat[base].p(q) if lat[base].samples_ns else float("nan")

    latency = {
        name: {"n": len(s.samples_ns), "p50_us": s.p(50) / 1e3, "p99_us": s.p(99) / 1e3}
        for name, s in lat.items()
    }
    ratios = {f"farm/{b}_p{q}": ratio(b, q) for b in ("echo", "ipykernel") for q in (50, 99)}
    met = {
        **{f"farm/echo_p{q}": ratios[f"farm/echo_p{q}"] <= ECHO_GOAL_RATIO for q in (50, 99)},
        **{
            f"farm/ipykernel_p{q}": ratios[f"farm/ipykernel_p{q}"] < IPYKERNEL_GOAL_RATIO
            for q in (50, 99)
        },
        "throughput": farm_tp.per_s >= THROUGHPUT_GOAL,
    }
    return {
        "latency": latency,
        "ratios": ratios,
        "throughput": [{**asdict(t), "per_s": t.per_s} for t in (farm_tp, echo_tp)],
        "goals": {
            "farm/echo": ECHO_GOAL_RATIO,
            "farm/ipykernel": IPYKERNEL_GOAL_RATIO,
            "throughput_per_s": THROUGHPUT_GOAL,
        },
        "met": met,
        "bytes": measured["bytes"],
    }


def fmt_us(us: float) -> str:
    return f"{us:.0f} us" if us < 1000 else f"{us / 1e3:.2f} ms"


def yes_no(ok: bool) -> str:
    return "yes" if ok else "NO"


def render(info: dict[str, Any], quick: bool, report: dict[str, Any]) -> str:
    lat, ratio, met = report["latency"], report["ratios"], report["met"]
    farm_tp, echo_tp = report["throughput"]

    def row(label: str, s: dict[str, Any]) -> tuple[Any, ...]:
        return (label, s["n"], fmt_us(s["p50_us"]), fmt_us(s["p99_us"]))

    def ratio_row(base: str, goal: str) -> tuple[Any, ...]:
        p50, p99 = ratio[f"farm/{base}_p50"], ratio[f"farm/{base}_p99"]
        verdict = f"{yes_no(met[f'farm/{base}_p50'])}/{yes_no(met[f'farm/{base}_p99'])}"
        return (f"ratio farm/{base}", "", f"{p50:.2f}x", f"{p99:.2f}x", goal, verdict)

    latency = [
        ("warm round trip", "n", "p50", "p99", "goal", "met p50/p99"),
        (f'farm session.run("{CODE}")', *row("", lat["farm"])[1:]),
        ("bare Celery echo task", *row("", lat["echo"])[1:]),
        (f'local ipykernel "{CODE}"', *row("", lat["ipykernel"])[1:]),
        ("one Redis round trip (info)", *row("", lat["redis"])[1:]),
        ratio_row("echo", f"<= {ECHO_GOAL_RATIO:g}x"),
        ratio_row("ipykernel", f"< {IPYKERNEL_GOAL_RATIO:g}x"),
    ]

    def spread(t: dict[str, Any]) -> str:
        return "/".join(str(n) for _, n in sorted(t["per_worker"].items()))

    tp = [
        (f"throughput ({WORKERS} workers)", "threads", "execs/s", "errors", "goal", "met"),
        (
            f'farm session.run("{CODE}")',
            farm_tp["threads"],
            f"{farm_tp['per_s']:.0f}",
            farm_tp["errors"],
            f">= {THROUGHPUT_GOAL:g}/s",
            yes_no(met["throughput"]),
        ),
        (
            "bare echo task (ceiling)",
            echo_tp["threads"],
            f"{echo_tp['per_s']:.0f}",
            echo_tp["errors"],
            "info only",
            "-",
        ),
    ]
    lines = [
        f"farm bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
        + ("  (--quick)" if quick else ""),
        "",
    ]
    for table in (latency, tp):
        for cells in table:
            padded = [*map(str, cells), "", "", "", "", ""][:6]
            lines.append("{:<30} {:>7} {:>10} {:>10} {:>10} {:>11}".format(*padded).rstrip())
        lines.append("")
    guarded = (lat["echo"]["p50_us"] + 2 * lat["redis"]["p50_us"]) / lat["echo"]["p50_us"]
    lines += [
        f"farm's two round trips beyond Celery's (the session check, the exec claim) alone: "
        f"echo + 2 x Redis = {guarded:.2f}x the echo's p50",
        f"latency: the four alternate in blocks of {RTT_BLOCK} calls; echo payload "
        f"{report['bytes']['echo_payload']} B each way (= farm request + reply bytes)",
        f"throughput: {farm_tp['seconds']:.1f} s farm, {echo_tp['seconds']:.1f} s echo; "
        f"farm calls per worker {spread(farm_tp)}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    plan = QUICK if args.quick else FULL
    info = machine()
    report = summarise(measure(plan))
    table = render(info, args.quick, report)
    return emit(table, {"machine": info, "plan": asdict(plan), **report}, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
