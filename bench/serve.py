"""HTTP API benchmark: what ``farm serve`` adds to a run and to a map, against the Python API.

Run with the project venv: ``.venv/bin/python bench/serve.py [--quick] [--json]``.

One ``Farm.local(workers=2)`` (Docker sandboxes) and the real ``farm serve`` over it, in a
process of its own (as deployed). Measured in the same run, alternating in rounds:
- a cell's round trip: ``Session.run("1")`` in this process against ``POST
  /v1/sessions/{id}/run`` with httpx (keep-alive), each in a session of its own; p50 and p99.
  Goal: HTTP p50 <= 1.2x the Python API's.
- a map's throughput: ``Farm.map`` of N one-line items against ``POST /v1/map`` (NDJSON in,
  records out, ``ordered=false``), items/s from first byte sent to last record read.
  Goal: HTTP >= 0.9x ``Farm.map``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from benchlib import Latency, emit, machine, parse_args

from farm.client import Farm
from farm.local.processes import popen_tied
from farm.local.redis_server import free_port

FARM = str(Path(sys.executable).parent / "farm")
READY_S = 60.0


@dataclass(frozen=True)
class Plan:
    runs: int  # cells per round and per API
    items: int  # map items per round and per API
    rounds: int


FULL = Plan(runs=300, items=2000, rounds=3)
QUICK = Plan(runs=60, items=300, rounds=1)


def start_server(farm: Farm, workdir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    port, token = free_port(), secrets.token_urlsafe(24)
    env = {
        **os.environ,
        "FARM_BROKER_URL": farm.settings.redis_url,
        "FARM_API_TOKEN": token,
        "FARM_SERVE_STATE_FILE": str(workdir / "serve.json"),
    }
    with (workdir / "serve.log").open("wb") as log:  # dies with this process, killed or not
        proc = popen_tied([FARM, "serve", "--port", str(port)], env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_S
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url, token
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"farm serve did not start: {(workdir / 'serve.log').read_text()}")
        time.sleep(0.1)  # poll interval of the deadline-bounded readiness check


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``farm serve``: terminated, killed if it is not gone within 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def python_runs(farm: Farm, count: int, out: Latency) -> None:
    with farm.session() as session:
        session.run("1")  # warm
        for _ in range(count):
            started = time.perf_counter_ns()
            result = session.run("1")
            out.samples_ns.append(time.perf_counter_ns() - started)
            assert result.ok, result.error


def http_runs(http: httpx.Client, count: int, out: Latency) -> None:
    session = http.post("/v1/sessions", json={}).json()["id"]
    try:
        http.post(f"/v1/sessions/{session}/run", json={"code": "1"})  # warm
        for _ in range(count):
            started = time.perf_counter_ns()
            response = http.post(f"/v1/sessions/{session}/run", json={"code": "1"})
            out.samples_ns.append(time.perf_counter_ns() - started)
            assert response.status_code == 200 and response.json()["status"] == "ok"
    finally:
        http.delete(f"/v1/sessions/{session}")


def items(count: int) -> list[str]:
    return [f"{i} * 2" for i in range(count)]


def python_map(farm: Farm, count: int) -> float:
    started = time.perf_counter()
    records = list(farm.map(items(count), ordered=False))
    elapsed = time.perf_counter() - started
    assert len(records) == count and all(r.ok for r in records)
    return count / elapsed


def http_map(http: httpx.Client, count: int) -> float:
    body = "\n".join(json.dumps(item) for item in items(count)).encode()
    started = time.perf_counter()
    with http.stream("POST", "/v1/map", params={"ordered": "false"}, content=body) as response:
        records = [line for line in response.iter_lines() if line]
    elapsed = time.perf_counter() - started
    assert len(records) == count and all(json.loads(r)["status"] == "ok" for r in records)
    return count / elapsed


def measure(plan: Plan) -> dict[str, Any]:
    py, web = Latency("python"), Latency("http")
    rates: dict[str, list[float]] = {"python": [], "http": []}
    with Farm.local(workers=2) as farm, tempfile.TemporaryDirectory() as tmp:
        proc, url, token = start_server(farm, Path(tmp))
        headers = {"Authorization": f"Bearer {token}"}
        try:
            with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
                python_map(farm, min(plan.items, 100))  # warm both paths
                http_map(http, min(plan.items, 100))
                for _ in range(plan.rounds):
                    python_runs(farm, plan.runs, py)
                    http_runs(http, plan.runs, web)
                    rates["python"].append(python_map(farm, plan.items))
                    rates["http"].append(http_map(http, plan.items))
        finally:
            stop_server(proc)
    return {"run": {"python": py, "http": web}, "map": rates}


def summarise(measured: dict[str, Any]) -> dict[str, Any]:
    runs = {
        name: {"n": len(m.samples_ns), "p50_ms": m.p(50) / 1e6, "p99_ms": m.p(99) / 1e6}
        for name, m in measured["run"].items()
    }
    maps = {name: sorted(r)[len(r) // 2] for name, r in measured["map"].items()}  # median
    return {
        "run": runs,
        "map_items_per_s": maps,
        "ratios": {
            "run_p50_http/python": runs["http"]["p50_ms"] / runs["python"]["p50_ms"],
            "map_http/python": maps["http"] / maps["python"],
        },
    }


def render(info: dict[str, Any], quick: bool, report: dict[str, Any]) -> str:
    runs, maps, ratios = report["run"], report["map_items_per_s"], report["ratios"]
    lines = [
        f"farm bench  {info['date']}  host {info['host']}  {info['cpu']}  "
        f"{info['cores']} cores ({info['usable_cores']} usable)  Python {info['python']}"
        + ("  (--quick)" if quick else ""),
        "",
        f"{'a cell round trip (run 1)':<44} {'n':>6} {'p50':>10} {'p99':>10}",
    ]
    for key, label in (("python", "Python API Session.run"), ("http", "HTTP POST .../run")):
        s = runs[key]
        lines.append(f"{label:<44} {s['n']:>6} {s['p50_ms']:>8.2f}ms {s['p99_ms']:>8.2f}ms")
    lines.append(
        f"{'ratio HTTP / Python (goal <= 1.2x)':<44} {'':>6} {ratios['run_p50_http/python']:>9.2f}x"
    )
    lines += [
        "",
        f"{'a map (one-line items, unordered)':<44} {'items/s':>10}",
        f"{'Python API Farm.map':<44} {maps['python']:>10.0f}",
        f"{'HTTP POST /v1/map (NDJSON)':<44} {maps['http']:>10.0f}",
        f"{'ratio HTTP / Python (goal >= 0.9x)':<44} {ratios['map_http/python']:>9.2f}x",
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
