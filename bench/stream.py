"""Stream benchmark: how long a ``print`` in a sandbox takes to reach the client.

Run with the project venv: ``.venv/bin/python bench/stream.py [--quick] [--json]``.

One ``Farm.local(workers=1)`` (a redis-server and a Celery worker owning a Docker sandbox).
A streamed cell prints ``time.time()`` every ``GAP_S`` seconds; the client, iterating
``session.stream(code)``, takes each ``Stream`` event's arrival time minus the printed time
(the sandbox shares the host's clock). The path is: fd-level capture in the kernel, its batch
flush, the kernel frame to the worker, the worker's ``XADD``, the client's ``XREAD BLOCK``.

Baseline, measured in the same run on the same Redis: a bare ``XADD`` -> ``XREAD BLOCK`` hop
between two threads of this process, with the same gap. The ratio says what the sandbox, the
kernel and the worker add to the one hop that the stream cannot avoid.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis
from benchlib import Latency, emit, machine, parse_args

from farm.client import Farm
from farm.events.run_events import Stream

GAP_S = 0.05
CALL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Plan:
    prints: int
    rounds: int  # the stream and the baseline alternate, this many times each


FULL = Plan(prints=100, rounds=4)
QUICK = Plan(prints=40, rounds=2)


def stream_round(farm: Farm, prints: int, out: Latency) -> None:
    code = (
        "import time\n"
        f"for _ in range({prints}):\n"
        "    print(repr(time.time()), flush=True)\n"
        f"    time.sleep({GAP_S})\n"
    )
    with farm.session(timeout_s=CALL_TIMEOUT_S) as session:
        session.run("1")  # warm
        for event in session.stream(code):
            if isinstance(event, Stream) and event.name == "stdout":
                arrived = time.time()
                first = event.text.splitlines()[0]  # the oldest print of this chunk
                out.samples_ns.append(int((arrived - float(first)) * 1e9))


def redis_round(url: str, count: int, out: Latency) -> None:
    """``XADD`` a timestamp every ``GAP_S``; a reader thread ``XREAD BLOCK``s for it."""
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
    key = f"bench:stream:{time.monotonic_ns()}"
    done = threading.Event()

    def reader() -> None:
        after = "0"
        got = 0
        while got < count and not done.is_set():
            reply: Any = client.xread({key: after}, block=1000)
            arrived = time.time()
            for _name, rows in reply or []:
                for entry_id, fields in rows:
                    after = entry_id
                    got += 1
                    out.samples_ns.append(int((arrived - float(fields["t"])) * 1e9))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(count):
            client.xadd(key, {"t": repr(time.time())})
            time.sleep(GAP_S)  # the gap between prints, as in the streamed cell
    finally:
        thread.join(timeout=10)
        done.set()
        client.delete(key)
        client.close()


def measure(plan: Plan) -> dict[str, Latency]:
    stream, bare = Latency("stream"), Latency("xadd_xread")
    with Farm.local(workers=1) as farm:
        for _ in range(plan.rounds):
            stream_round(farm, plan.prints, stream)
            redis_round(farm.settings.broker_url, plan.prints, bare)
    return {"stream": stream, "xadd_xread": bare}


def summarise(measured: dict[str, Latency]) -> dict[str, Any]:
    lat = {
        name: {"n": len(m.samples_ns), "p50_ms": m.p(50) / 1e6, "p99_ms": m.p(99) / 1e6}
        for name, m in measured.items()
    }
    ratios = {
        f"stream/xadd_xread_{q}": lat["stream"][f"{q}_ms"] / lat["xadd_xread"][f"{q}_ms"]
        for q in ("p50", "p99")
    }
    return {"latency": lat, "ratios": ratios}


def render(info: dict[str, Any], quick: bool, report: dict[str, Any]) -> str:
    lat, ratios = report["latency"], report["ratios"]
    lines = [
        f"farm bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
        + ("  (--quick)" if quick else ""),
        "",
        f"{'print-to-client latency':<40} {'n':>6} {'p50':>10} {'p99':>10}",
    ]
    names = {
        "stream": "farm session.stream (print -> event)",
        "xadd_xread": "bare Redis XADD -> XREAD BLOCK",
    }
    for key, label in names.items():
        s = lat[key]
        lines.append(f"{label:<40} {s['n']:>6} {s['p50_ms']:>8.2f}ms {s['p99_ms']:>8.2f}ms")
    lines.append(
        f"{'ratio stream / bare hop':<40} {'':>6} {ratios['stream/xadd_xread_p50']:>9.1f}x "
        f"{ratios['stream/xadd_xread_p99']:>9.1f}x"
    )
    lines.append("")
    lines.append(f"one print every {GAP_S * 1000:.0f} ms; stream and baseline alternate in rounds")
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
