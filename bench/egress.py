"""Egress benchmark: what a box's way out through the worker's proxy costs, in one run.

Run with the project venv: ``.venv/bin/python bench/egress.py [--quick] [--json]``.

On ``Farm.local(workers=1)`` with a ceiling naming an HTTP server on this host's loopback
(its range opened), against the same requests made by this process with no sandbox and no
proxy (the baseline, measured in the same run):

1. Opening a session (open + close, through the broker): p50 with egress against without
   (the box's endpoint is made, handed to the worker and registered; no spare process).
2. Small requests: sequential GETs of a short page from a cell, requests/s; through the proxy
   each is a connection of its own (one request per connection).
3. A large download (``BIG_MB``) from a cell, MB/s.

Nothing is asserted; every farm and server started here is stopped on exit.
"""

from __future__ import annotations

import http.server
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from benchlib import Latency, emit, machine, parse_args

from farm.client import Farm
from farm.local.embedded import LocalFarm

BIG_MB = 64


@dataclass(frozen=True)
class Plan:
    opens: int
    requests: int
    downloads: int


FULL = Plan(opens=40, requests=300, downloads=3)
QUICK = Plan(opens=10, requests=60, downloads=1)


class _Handler(http.server.BaseHTTPRequestHandler):
    big = b"z" * (BIG_MB << 20)

    def do_GET(self) -> None:
        body = self.big if self.path == "/big" else b"a short page"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


CLIENT = r"""
import os, time, urllib.request
os.environ['NO_PROXY'] = os.environ['no_proxy'] = ''  # this host's loopback, through the proxy
def many(url, n):
    t0 = time.perf_counter()
    for _ in range(n):
        urllib.request.urlopen(url, timeout=30).read()
    return time.perf_counter() - t0
def download(url):
    t0 = time.perf_counter()
    size = 0
    with urllib.request.urlopen(url, timeout=120) as r:
        while chunk := r.read(1 << 20):
            size += len(chunk)
    return size, time.perf_counter() - t0
"""


def baseline(url: str, plan: Plan) -> dict[str, float]:
    """The same requests from this process: no sandbox, no proxy."""
    scope: dict[str, Any] = {}
    exec(CLIENT, scope)
    took = scope["many"](f"{url}/page", plan.requests)
    rates = [scope["download"](f"{url}/big") for _ in range(plan.downloads)]
    return {
        "requests_per_s": plan.requests / took,
        "download_mb_s": max(size / took_s for size, took_s in rates) / (1 << 20),
    }


def through_proxy(farm: Farm, url: str, plan: Plan) -> dict[str, float]:
    with farm.session(egress=[url.removeprefix("http://")], timeout_s=300) as session:
        session.run(CLIENT).raise_for_error()
        many = session.run(f"many({url + '/page'!r}, {plan.requests})", timeout_s=300)
        took = float(many.value.text) if many.value else float("nan")
        best = 0.0
        for _ in range(plan.downloads):
            got = session.run(f"download({url + '/big'!r})", timeout_s=300)
            size, took_s = eval(got.value.text) if got.value else (0, 1.0)
            best = max(best, size / took_s / (1 << 20))
    return {"requests_per_s": plan.requests / took, "download_mb_s": best}


def opens(farm: Farm, url: str, plan: Plan) -> dict[str, float]:
    """Open + close p50, without and with egress, alternating."""
    plain, egress = Latency("plain"), Latency("egress")
    for _ in range(plan.opens):
        for latency, rules in ((plain, None), (egress, [url.removeprefix("http://")])):
            t0 = time.perf_counter_ns()
            farm.session(egress=rules).close()
            latency.samples_ns.append(time.perf_counter_ns() - t0)
    return {"open_p50_ms": plain.p(50) / 1e6, "open_egress_p50_ms": egress.p(50) / 1e6}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__ or "", argv)
    plan = QUICK if args.quick else FULL
    info = machine()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    env = {
        "FARM_EGRESS_ALLOW": url.removeprefix("http://"),
        "FARM_EGRESS_ALLOW_PRIVATE": "127.0.0.0/8",
        "FARM_EGRESS_MAX_BYTES": str(1 << 34),
    }
    local = LocalFarm(1, env=env).start()
    try:
        with Farm(local.settings(), owned=local) as farm:
            farm.run("1")  # warm: the worker's sandbox is up
            opened = opens(farm, url, plan)
            proxied = through_proxy(farm, url, plan)
        direct = baseline(url, plan)
    finally:
        httpd.shutdown()
        httpd.server_close()
    ratios = {
        "open p50, egress / plain": opened["open_egress_p50_ms"] / opened["open_p50_ms"],
        "requests/s, proxy / direct": proxied["requests_per_s"] / direct["requests_per_s"],
        "download MB/s, proxy / direct": proxied["download_mb_s"] / direct["download_mb_s"],
    }
    data = {"machine": info, "plan": plan.__dict__, "opens": opened, "proxy": proxied}
    data.update(direct=direct, ratios=ratios)
    lines = [f"bench/egress.py ({'quick' if args.quick else 'full'}) on {info}"]
    lines += [f"{k:38} {v:12.2f}" for k, v in opened.items()]
    lines.append(f"{'':38} {'direct':>12} {'proxy':>12}")
    for key in ("requests_per_s", "download_mb_s"):
        lines.append(f"{key:38} {direct[key]:12.2f} {proxied[key]:12.2f}")
    lines += [f"{name:38} {value:12.2f}x" for name, value in ratios.items()]
    return emit("\n".join(lines), data, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
