"""The overload suite's mixed workload (``bench/load.py``): its parts, and what each saw.

Each part runs until its level's ``stop`` is set and checks what comes back rather than
counting it: a map's records by id (exactly one each, the value right: ``Ledger``), a
session's variable at every run. Whatever is wrong is tallied by kind, never raised, so a
fault shows in the figures instead of ending the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from benchlib import Latency

from farm.client import Farm, Session
from farm.errors import FarmBusy, SessionLost, StateLost

ITEM_PARTS = ("map", "http_map", "judge")  # goodput in items/s
RUN_PARTS = ("agent", "http_session")  # goodput in runs/s
RUNS = 20  # runs of an agent session after its first (``x = 0``), each using the last
HTTP_RUNS = 5
HTTP_MAP_ITEMS = 20
HTTP_MAP_WINDOW = 1  # an HTTP map client, like every other client, wants one box at a time
HTTP_TIMEOUT_S = 300.0  # a request still unanswered then is an error (``ReadTimeout``)
# The judge's sum problem ("a b" -> a + b) and a submission of each language that is accepted.
SUM_TESTS = [{"stdin": f"{a} {b}\n", "expected": f"{a + b}\n"} for a, b in ((2, 2), (1, 2), (5, 7))]
SUM_AC = {
    "python3": "a, b = map(int, input().split())\nprint(a + b)\n",
    "cpp17": "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}",
}


@dataclass
class Tally:
    """What one part of the mix saw in one level (added to from many threads)."""

    done_at: list[float] = field(default_factory=list)  # when each good run or item ended
    samples: dict[str, list[float]] = field(default_factory=dict)  # latency name -> seconds
    errors: Counter[str] = field(default_factory=Counter)  # by kind
    counts: Counter[str] = field(default_factory=Counter)  # busy, lost, duplicated, ...
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ok(self) -> None:
        with self._lock:
            self.done_at.append(time.monotonic())

    def sample(self, name: str, seconds: float) -> None:
        with self._lock:
            self.samples.setdefault(name, []).append(seconds)

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def summary(self, started: float, ended: float) -> dict[str, Any]:
        """Its figures: what was done between ``started`` and ``ended`` (and after, winding
        down), errors, counts and each latency's p50 and p99."""
        return {
            "done": sum(started <= t <= ended for t in self.done_at),
            "done_after": sum(t > ended for t in self.done_at),
            "errors": dict(self.errors),
            **{k: self.counts[k] for k in COUNTS},
            "latency": {name: _percentiles(s) for name, s in self.samples.items()},
        }


COUNTS = ("busy", "lost", "duplicated", "lost_variables", "unanswered")


def _percentiles(seconds: list[float]) -> dict[str, float | int]:
    lat = Latency("", [int(s * 1e9) for s in seconds])
    return {"n": len(seconds), "p50_ms": lat.p(50) / 1e6, "p99_ms": lat.p(99) / 1e6}


class Ledger:
    """The ids a map was sent with their right values, and the records that came back."""

    def __init__(self, tally: Tally, named: bool = False) -> None:
        self.tally = tally
        self.named = named  # a wrong value is tallied under its own name (a judge's verdict)
        self.expected: dict[Any, str] = {}
        self.seen: Counter[Any] = Counter()

    def sent(self, key: Any, value: str) -> None:
        self.expected[key] = value

    def record(
        self, key: Any, ok: bool, kind: str | None, value: str | None, took_s: float, queue_s: float
    ) -> None:
        self.seen[key] += 1
        if self.seen[key] > 1:
            self.tally.count("duplicated")
        elif key not in self.expected:
            self.tally.error("unknown id")
        elif not ok:
            self.tally.error(kind or "error")
        elif value != self.expected[key]:
            self.tally.error(f"wrong value {value}" if self.named else "wrong value")
        else:
            self.tally.ok()
            self.tally.sample("running", took_s - queue_s)
            self.tally.sample("queue", queue_s)

    def close(self) -> None:
        """The map ended: every id sent and never answered is lost."""
        self.tally.count("lost", sum(1 for key in self.expected if key not in self.seen))


def _cell_text(record: Any) -> str | None:
    value = record.cells[-1].value if record.cells else None
    return value.text if value is not None else None


def batch(farm: Farm, items: int, concurrency: int, tally: Tally, tag: str = "") -> None:
    """``Farm.map`` of ``items`` one-line items (``n * 2``), every record checked."""
    ledger = Ledger(tally)
    for n in range(items):
        ledger.sent(f"{tag}{n}", str(n * 2))
    source = ({"id": f"{tag}{n}", "code": f"{n} * 2"} for n in range(items))
    try:
        for rec in farm.map(source, concurrency=concurrency, ordered=False):
            ledger.record(rec.id, rec.ok, rec.kind, _cell_text(rec), rec.duration_s, rec.queue_s)
    except Exception as exc:  # the map itself failed (a broker outage): said, not raised
        tally.error(f"map raised {type(exc).__name__}")
    ledger.close()


def judge(farm: Farm, stop: threading.Event, tally: Tally, concurrency: int, tag: str) -> None:
    """A judge map of accepted submissions (python3 and cpp17 in turn), fed until ``stop``."""
    ledger = Ledger(tally, named=True)

    def items() -> Iterator[dict[str, Any]]:
        n = 0
        while not stop.is_set():
            language = ("python3", "cpp17")[n % 2]
            ledger.sent(f"{tag}{n}", "AC")
            yield {"id": f"{tag}{n}", "language": language, "source": SUM_AC[language]}
            n += 1

    source = ({**item, "tests": SUM_TESTS} for item in items())
    try:
        for rec in farm.map(source, concurrency=concurrency, ordered=False):
            verdict = str(rec.judge.verdict) if rec.judge is not None else None
            if verdict != "AC":  # what the next reader needs: the whole record
                print(f"judge item {rec.id}: {rec.model_dump_json()[:4000]}", file=sys.stderr)
            ledger.record(rec.id, rec.ok, rec.kind, verdict, rec.duration_s, rec.queue_s)
    except Exception as exc:
        tally.error(f"map raised {type(exc).__name__}")
    ledger.close()


def agent(farm: Farm, stop: threading.Event, tally: Tally) -> None:
    """Agent sessions one after another until ``stop``: open, ``x = 0``, then ``RUNS`` times
    ``x += 1; x`` checked, close. A wrong value, ``StateLost`` or ``SessionLost`` is a session
    that lost its variables; a ``FarmBusy`` open is a busy answer."""
    while not stop.is_set():
        started = time.perf_counter()
        try:
            session = farm.session()
        except FarmBusy:
            tally.count("busy")
            continue
        except Exception as exc:
            tally.error(f"open raised {type(exc).__name__}")
            stop.wait(1.0)  # not busy-loop on a broken farm
            continue
        tally.sample("open", time.perf_counter() - started)
        tally.sample("open_queue", session.queue_s)
        try:
            use(session, stop, tally)
        finally:
            try:
                session.close()
            except Exception as exc:
                tally.error(f"close raised {type(exc).__name__}")


def use(session: Session, stop: threading.Event, tally: Tally) -> None:
    for n in range(RUNS + 1):
        if n and stop.is_set():
            return
        started = time.perf_counter()
        try:
            result = session.run("x += 1\nx" if n else "x = 0")
        except (StateLost, SessionLost) as exc:
            tally.count("lost_variables")
            tally.error("state_lost" if isinstance(exc, StateLost) else "sandbox_lost")
            return
        except Exception as exc:
            tally.error(f"run raised {type(exc).__name__}")
            return
        tally.sample("run", time.perf_counter() - started)
        if not result.ok:
            tally.error(str(result.kind))
            return
        if (result.value.text if result.value else None) != (str(n) if n else None):
            tally.count("lost_variables")
            return
        tally.ok()


# --- HTTP clients of `farm serve` -----------------------------------------------------------


async def call(
    http: httpx.AsyncClient, tally: Tally, method: str, path: str, **kwargs: Any
) -> httpx.Response | None:
    """One request; a 2xx response, else ``None`` with what went wrong tallied: a 503 ``busy``
    is a busy answer (after waiting its ``Retry-After``), anything else an error by kind."""
    tally.count("unanswered")  # until it is answered: what a wedged server leaves
    try:
        response = await http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        tally.error(type(exc).__name__)
        return None
    finally:
        tally.count("unanswered", -1)
    if response.is_success:
        return response
    kind = _problem_kind(response)
    if response.status_code == 503 and kind == "busy":
        tally.count("busy")
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
        return None
    tally.error(f"HTTP {response.status_code} {kind}")
    if response.status_code in (409, 410):  # state_lost, sandbox_lost: variables gone
        tally.count("lost_variables")
    return None


def _problem_kind(response: httpx.Response) -> str:
    try:
        return str(response.json().get("kind"))
    except ValueError:
        return "(no problem document)"


async def http_sessions(http: httpx.AsyncClient, stop: threading.Event, tally: Tally) -> None:
    """Sessions over HTTP until ``stop``: open, ``x = 0``, ``HTTP_RUNS`` checked runs, delete."""
    while not stop.is_set():
        started = time.perf_counter()
        opened = await call(http, tally, "POST", "/v1/sessions", json={})
        if opened is None:
            continue
        tally.sample("open", time.perf_counter() - started)
        tally.sample("open_queue", opened.json().get("queue_s") or 0.0)
        session = opened.json()["id"]
        try:
            for n in range(HTTP_RUNS + 1):
                if n and stop.is_set():
                    break
                started = time.perf_counter()
                code = {"code": "x += 1\nx" if n else "x = 0"}
                ran = await call(http, tally, "POST", f"/v1/sessions/{session}/run", json=code)
                if ran is None:
                    break
                tally.sample("run", time.perf_counter() - started)
                result = ran.json()
                if result["status"] != "ok":
                    tally.error(str(result["error"]["kind"]))
                    break
                if (result.get("value") or {}).get("text") != (str(n) if n else None):
                    tally.count("lost_variables")
                    break
                tally.ok()
        finally:
            await call(http, tally, "DELETE", f"/v1/sessions/{session}")


async def http_maps(
    http: httpx.AsyncClient, stop: threading.Event, tally: Tally, client: str
) -> None:
    """Maps of ``HTTP_MAP_ITEMS`` items over HTTP (NDJSON in, records out) until ``stop``."""
    for k in range(1_000_000):
        if stop.is_set():
            return
        ledger = Ledger(tally)
        lines = []
        for i in range(HTTP_MAP_ITEMS):
            key, n = f"{client}-{k}-{i}", k * HTTP_MAP_ITEMS + i
            ledger.sent(key, str(n * 2))
            lines.append(json.dumps({"id": key, "code": f"{n} * 2"}))
        params = {"ordered": "false", "concurrency": str(HTTP_MAP_WINDOW)}
        tally.count("unanswered")  # until its last record came
        try:
            async with http.stream(
                "POST", "/v1/map", params=params, content="\n".join(lines).encode()
            ) as response:
                if not response.is_success:
                    await response.aread()
                    await _refused(response, tally)
                    continue
                async for line in response.aiter_lines():
                    if line.strip():
                        _map_line(json.loads(line), ledger, tally)
        except httpx.HTTPError as exc:  # the map's end is unknown: no loss is counted
            tally.error(type(exc).__name__)
            continue
        finally:
            tally.count("unanswered", -1)
        ledger.close()


async def _refused(response: httpx.Response, tally: Tally) -> None:
    kind = _problem_kind(response)
    if response.status_code == 503 and kind == "busy":
        tally.count("busy")
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
    else:
        tally.error(f"HTTP {response.status_code} {kind}")


def _map_line(record: dict[str, Any], ledger: Ledger, tally: Tally) -> None:
    if "problem" in record:  # the map failed midway (its last line says why)
        tally.error(f"problem {record['problem'].get('kind')}")
        return
    cells = record.get("cells") or []
    value = (cells[-1].get("value") or {}).get("text") if cells else None
    ok = record["status"] == "ok"
    ledger.record(
        record["id"], ok, record.get("kind"), value, record["duration_s"], record["queue_s"]
    )


def http_clients(
    url: str, token: str, clients: int, stop: threading.Event, tallies: dict[str, Tally]
) -> None:
    """``clients`` HTTP clients on one event loop (this thread), half of them sessions."""

    async def main() -> None:
        # A client each, with its own connection, as separate users have: one shared pool of
        # 200 connections costs httpx a scan of them all per request (the generator's CPU).
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        headers = {"Authorization": f"Bearer {token}"}
        async with contextlib.AsyncExitStack() as stack:
            https = [
                await stack.enter_async_context(
                    httpx.AsyncClient(
                        base_url=url, headers=headers, timeout=HTTP_TIMEOUT_S, limits=limits
                    )
                )
                for _ in range(clients)
            ]
            half = clients // 2
            sessions = [http_sessions(h, stop, tallies["http_session"]) for h in https[:half]]
            maps = [
                http_maps(h, stop, tallies["http_map"], f"h{i}") for i, h in enumerate(https[half:])
            ]
            await asyncio.gather(*sessions, *maps)

    asyncio.run(main())
