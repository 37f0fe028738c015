#!/usr/bin/env python3
"""``make reliability``: run the reliability suite and the soak, then write docs/reliability.md.

1. pytest runs the reliability modules (adversarial code, protocol abuse, chaos, co-tenancy,
   egress, and load: ``bench/load.py --quick``, a case per goal) with a junit report; each
   test records what it expected and what it observed as junit properties
   (``record_property``), so the table shows both even when a test fails.
2. ``bench/soak.py`` runs with ``--json`` (skip it with ``--no-soak``).
3. docs/reliability.md gets one row per case (area, case, expected, observed, result, time),
   the co-tenancy cases in a section of their own, the failures, the soak figures, and the
   leftovers check (sandbox containers whose owning process is gone; there must be none).

The exit status is 1 when a test failed, the soak failed to run, or something was left over;
the report is written in every case.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODULES = {
    "tests/test_reliability_adversarial.py": "adversarial code",
    "tests/test_reliability_protocol.py": "protocol abuse",
    "tests/test_reliability_chaos.py": "chaos",
    "tests/test_cotenancy.py": "co-tenancy",
    "tests/test_box_machines.py": "co-tenancy",
    "tests/test_session_forks.py": "co-tenancy",
    "tests/test_checkpoints.py": "checkpoints",
    "tests/test_egress.py": "egress",
    "tests/test_reliability_load.py": "load",
}
COTENANCY = "co-tenancy"  # its cases get a section of their own, not rows of the main table
GENERIC_TESTS = {"test_hostile_code_gets_its_kind_and_harms_no_one_else"}
OUT_DIR = REPO / "out" / "reliability"
DOC = REPO / "docs" / "reliability.md"


@dataclass
class Row:
    area: str
    case: str
    expected: str
    observed: str
    result: str  # pass | FAIL | ERROR | skipped
    seconds: float
    message: str


def case_name(test: str) -> str:
    base, _, param = test.partition("[")
    param = param.rstrip("]")
    if base in GENERIC_TESTS and param:
        return param
    words = base.removeprefix("test_").replace("_", " ")
    return f"{words} ({param})" if param else words


def read_junit(path: Path) -> list[Row]:
    areas = {Path(m).stem: area for m, area in MODULES.items()}
    rows = []
    for tc in ET.parse(path).iter("testcase"):
        module = str(tc.get("classname", "")).rsplit(".", 1)[-1]
        props = {p.get("name"): p.get("value", "") for p in tc.iter("property")}
        result, message = "pass", ""
        for tag, label in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "skipped")):
            found = tc.find(tag)
            if found is not None:
                result = label
                message = found.get("message") or (found.text or "")
                break
        first_line = message.strip().splitlines()[0] if message.strip() else ""
        rows.append(
            Row(
                area=areas.get(module, module),
                case=case_name(str(tc.get("name"))),
                expected=str(props.get("expected") or "(see the test's docstring)"),
                observed=str(props.get("observed") or first_line or "-"),
                result=result,
                seconds=float(tc.get("time") or 0.0),
                message=first_line,
            )
        )
    return rows


def run_suite(junit: Path, extra: list[str]) -> tuple[int, float]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *MODULES,
        "-m",
        "reliability",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
        "-p",
        "no:cacheprovider",
        *extra,
    ]
    print("+", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    code = subprocess.call(cmd, cwd=REPO)
    return code, time.monotonic() - t0


def run_soak(json_path: Path, extra: list[str]) -> tuple[dict[str, Any] | None, float, str]:
    cmd = [sys.executable, "bench/soak.py", "--json", str(json_path), *extra]
    print("+", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    json_path.unlink(missing_ok=True)
    code = subprocess.call(cmd, cwd=REPO)
    took = time.monotonic() - t0
    if code != 0 or not json_path.exists():
        return None, took, f"bench/soak.py exited with {code}"
    return json.loads(json_path.read_text()), took, ""


def leftovers() -> list[str]:
    """Sandbox containers of this host whose owning process is gone (what tests left)."""
    try:
        import docker

        client = docker.from_env()
    except Exception as exc:
        return [f"(could not ask Docker: {exc})"]
    here = socket.gethostname()
    found = []
    for c in client.containers.list(
        ignore_removed=True, all=True, filters={"label": "farm.managed=1"}
    ):
        pid = c.labels.get("farm.pid", "")
        if c.labels.get("farm.host") == here and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                found.append(f"{c.name} (owner {c.labels.get('farm.owner')}, pid {pid} gone)")
            except PermissionError:
                pass
    client.close()
    return found


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def machine_line() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    python = platform.python_version()
    return f"host {socket.gethostname()}, {cpu}, {os.cpu_count()} cores, Python {python}"


def render(
    rows: list[Row],
    suite_s: float,
    soak: dict[str, Any] | None,
    soak_s: float,
    soak_error: str,
    left: list[str],
) -> str:
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    lines = [
        "# Reliability report",
        "",
        f"Generated by `make reliability` (`scripts/reliability_report.py`) on {now}; "
        f"{machine_line()}. Do not edit by hand.",
        "",
        "What each case expects follows the documented failure kinds and rules of docs/guide.md "
        "(`user`, `timeout`, `oom`, `output_limit`, `state_lost`, `sandbox_lost`; `StateLost` "
        "until `restart()`; `SessionLost` within seconds; only infrastructure failures retried).",
        "",
        "## Summary",
        "",
        "| area | cases | pass | fail |",
        "|---|---:|---:|---:|",
    ]
    for area in dict.fromkeys(MODULES.values()):  # each area once, in order
        mine = [r for r in rows if r.area == area]
        passed = sum(r.result == "pass" for r in mine)
        lines.append(f"| {area} | {len(mine)} | {passed} | {len(mine) - passed} |")
    total_pass = sum(r.result == "pass" for r in rows)
    lines += [
        f"| **all** | {len(rows)} | {total_pass} | {len(rows) - total_pass} |",
        "",
        f"Suite runtime {suite_s:.0f} s; soak runtime {soak_s:.0f} s. Leftover sandbox "
        f"containers of dead owners after the run: {len(left)}"
        + (f" ({'; '.join(left)})" if left else "")
        + ".",
        "",
        "## Cases",
        "",
        "| area | case | expected | observed | result | s |",
        "|---|---|---|---|---|---:|",
    ]
    for r in rows:
        if r.area == COTENANCY:
            continue
        lines.append(
            f"| {r.area} | {cell(r.case)} | {cell(r.expected)} | {cell(r.observed)} | "
            f"{mark(r)} | {r.seconds:.1f} |"
        )
    lines += render_cotenancy([r for r in rows if r.area == COTENANCY])
    failed = [r for r in rows if r.result != "pass"]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- **{r.area} / {cell(r.case)}**: {cell(r.message)[:600]}" for r in failed]
    lines += ["", "## Soak (`bench/soak.py`)", ""]
    lines += render_soak(soak) if soak is not None else [f"Not run: {soak_error}."]
    return "\n".join(lines) + "\n"


def mark(row: Row) -> str:
    return "pass" if row.result == "pass" else f"**{row.result}**"


def render_cotenancy(rows: list[Row]) -> list[str]:
    """The co-tenancy section: what one session could do to another on the same sandbox."""
    lines = [
        "",
        "## Co-tenancy",
        "",
        "Sessions that share a worker's sandbox are boxes: a uid and mount, pid, network, "
        "IPC and UTS namespaces with a disk of their own (`tests/test_cotenancy.py`, "
        "`tests/test_box_machines.py`). Each case runs from a real session against another "
        "on the same real Docker worker, or fills one sandbox with a sweep.",
        "",
    ]
    if not rows:
        return [*lines, "Not run: the junit report has no co-tenancy case."]
    lines += ["| case | expected | observed | result | s |", "|---|---|---|---|---:|"]
    for r in rows:
        lines.append(
            f"| {cell(r.case)} | {cell(r.expected)} | {cell(r.observed)} | {mark(r)} "
            f"| {r.seconds:.1f} |"
        )
    return lines


def render_soak(soak: dict[str, Any]) -> list[str]:
    cfg = soak["config"]
    samples = soak["samples"]
    cold, start, end, closed = samples[0], samples[1], samples[-2], samples[-1]
    flat = soak["flat"]
    lines = [
        f"{soak['execs']} execs after {soak['warmup_execs']} warm-up execs, across "
        f"{cfg['workers']} workers and {cfg['sessions']} sessions, {cfg['threads']} client "
        f"threads: {soak['elapsed_s']:.0f} s, {soak['execs_per_s']:.0f} execs/s, latency p50 "
        f"{soak['latency_ms']['p50']:.0f} ms, p99 {soak['latency_ms']['p99']:.0f} ms; "
        f"{soak['failure_count']} unexpected results; "
        f"{len(soak['counter_mismatches'])} session counters off (a lost or doubled exec). "
        f"Goal: flat from start (after warm-up) to end; {sum(flat.values())}/{len(flat)} "
        "metrics are.",
        "",
        "| metric | cold | start | end | end - start | after closing sessions | flat |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for metric in start:
        if metric in ("label", "execs", "at"):
            continue
        verdict = "" if metric not in flat else "yes" if flat[metric] else "**no**"
        lines.append(
            f"| {metric} | {cold[metric]} | {start[metric]} | {end[metric]} | "
            f"{end[metric] - start[metric]:+} | {closed[metric]} | {verdict} |"
        )
    trend = ", ".join(
        f"{s['label']}: {s['worker_rss_kb'] // 1024} MB / {s['worker_fds']} fds" for s in samples
    )
    lines += [
        "",
        f"Workers (RSS / fds) through the run: {trend}.",
        "",
        "Redis keys grow by one exec record per call by design (kept 24 h so a redelivered "
        "message never runs twice); they are not part of the flat goal.",
    ]
    if soak["failures"]:
        lines += ["", "Unexpected results (first few):", ""]
        lines += [f"- {cell(f)[:300]}" for f in soak["failures"][:5]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-soak", action="store_true", help="skip bench/soak.py")
    parser.add_argument("--soak-args", default="", help="extra arguments for bench/soak.py")
    parser.add_argument("--pytest-args", default="", help="extra arguments for pytest")
    parser.add_argument("--output", type=Path, default=DOC)
    args = parser.parse_args(argv)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    junit = OUT_DIR / "junit.xml"
    junit.unlink(missing_ok=True)
    code, suite_s = run_suite(junit, args.pytest_args.split())
    rows = read_junit(junit) if junit.exists() else []
    soak, soak_s, soak_error = None, 0.0, "skipped (--no-soak)"
    if not args.no_soak:
        soak, soak_s, soak_error = run_soak(OUT_DIR / "soak.json", args.soak_args.split())
    left = leftovers()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(rows, suite_s, soak, soak_s, soak_error, left))
    failed = [r for r in rows if r.result != "pass"]
    print(
        f"wrote {args.output}: {len(rows) - len(failed)}/{len(rows)} cases pass, suite "
        f"{suite_s:.0f}s, soak {'ok' if soak else soak_error} ({soak_s:.0f}s), "
        f"{len(left)} leftovers"
    )
    broken = code != 0 or not rows or (soak is None and not args.no_soak) or left
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
