"""The overload suite's goals and table (``bench/load.py``): what its figures mean.

``goals`` turns the figures into what was expected, what was observed and whether it was met,
keyed for ``tests/test_reliability_load.py``; ``render`` prints the levels side by side, the
RSS and PSS of the farm's processes, the burst and the goals as PASS/FAIL lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from load_mix import ITEM_PARTS, RUN_PARTS

RSS_FLAT = 0.10  # end over start, each worker's process tree (PSS) and redis-server
KEPT_SLACK = 256 << 10  # bytes Redis' never-expiring keys may grow by (bounded indexes fill)
GOODPUT_KEPT = 0.9  # at 4x, of the 1x figure
RUN_P99_GROWTH = 2.0  # an agent's run at 4x, over 1x
FARM_FAILURES = ("infra", "sandbox_lost", "SessionLost", "WorkerFailed", "BrokerLost")


def is_farm_failure(kind: str) -> bool:
    """A failure of the farm rather than a verdict on the code: ``infra`` or ``sandbox_lost``
    (a result's kind, a map's last line, an exception) or any HTTP 5xx (a 503 ``busy`` is a
    busy answer, counted apart)."""
    words = kind.replace("problem ", "").split()
    return any(w in FARM_FAILURES for w in words) or kind.startswith("HTTP 5")


def goal(expected: str, observed: str, ok: bool) -> dict[str, Any]:
    return {"expected": expected, "observed": observed, "ok": ok}


def goals(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each goal, by key; those of a level not run are left out."""
    levels = {lv["level"]: lv for lv in out["levels"]}
    found: dict[str, dict[str, Any]] = {}
    if 4 in levels:
        found |= _at_4x(levels[4])
    if 1 in levels and 4 in levels:
        one, four = levels[1], levels[4]
        ratio = four["units_per_s"] / one["units_per_s"] if one["units_per_s"] else float("nan")
        found["goodput"] = goal(
            f"goodput (items and runs done a second) at 4x >= {GOODPUT_KEPT}x 1x: no collapse",
            f"{four['units_per_s']:.1f} vs {one['units_per_s']:.1f}: {ratio:.2f}x (items/s "
            f"{_ratio(four, one, 'items_per_s')}, runs/s {_ratio(four, one, 'runs_per_s')}; "
            f"boxes held by sessions {_held(one, 'open')} -> {_held(four, 'open')}, by map "
            f"items {_held(one, 'item')} -> {_held(four, 'item')})",
            ratio >= GOODPUT_KEPT,
        )
        p99 = [lv["parts"]["agent"]["latency"].get("run", {}).get("p99_ms") for lv in (one, four)]
        ratio = p99[1] / p99[0] if p99[0] and p99[1] else float("nan")
        found["agent_run_p99"] = goal(
            f"p99 of an agent session's run at 4x <= {RUN_P99_GROWTH:g}x 1x",
            f"{p99[1] or 0:.0f} ms vs {p99[0] or 0:.0f} ms: {ratio:.2f}x",
            ratio <= RUN_P99_GROWTH,
        )
    grew = {
        name: r["end"] / r["start"] - 1
        for name, r in out["pss_kb"].items()
        if name != "redis-server"
    }
    redis = out["redis_memory"]
    kept = {k: redis[k]["kept"] for k in ("start", "end")}
    found["rss_flat"] = goal(
        f"memory at the end within {RSS_FLAT:.0%} of the start: each worker's process tree "
        f"(PSS); redis-server's keys that never expire (or within {KEPT_SLACK >> 10} kB: "
        "bounded indexes, such as the journals' 1,000 newest, fill up)",
        ", ".join(f"{name} {g:+.0%}" for name, g in grew.items())
        + f"; redis keys that never expire {kept['start'] >> 10} -> {kept['end'] >> 10} kB; "
        f"redis-server used {redis['start']['used'] >> 20} -> {redis['end']['used'] >> 20} MB, "
        f"of which keys kept for a fixed time {redis['start']['expiring'] >> 20} -> "
        f"{redis['end']['expiring'] >> 20} MB (exec records, journals: they expire); "
        + _roles(out.get("pss_roles")),
        all(g <= RSS_FLAT for g in grew.values())
        and kept["end"] <= max(kept["start"] * (1 + RSS_FLAT), kept["start"] + KEPT_SLACK),
    )
    found["burst"] = _burst(out["plan"], out["burst"])
    return found


def _ratio(top: dict[str, Any], base: dict[str, Any], what: str) -> str:
    return f"{top[what] / base[what]:.2f}x" if base[what] else "-"


def _held(level: dict[str, Any], kind: str) -> str:
    """The boxes ``kind`` held on average in ``level`` (sampled once a second)."""
    shares = level.get("shares") or {}
    return f"{(shares.get('boxes_held') or {}).get(kind, 0.0):.0f}"


def _at_4x(top: dict[str, Any]) -> dict[str, dict[str, Any]]:
    parts = top["parts"]
    lost = sum(parts[p]["lost"] for p in ITEM_PARTS)
    twice = sum(parts[p]["duplicated"] for p in ITEM_PARTS)
    failures = {
        f"{p}: {kind}": n
        for p, t in parts.items()
        for kind, n in t["errors"].items()
        if is_farm_failure(kind)
    }
    forgot = sum(parts[p]["lost_variables"] for p in RUN_PARTS)
    unanswered = sum(t["unanswered"] for t in parts.values())
    return {
        "records_4x": goal(
            "at 4x no record lost or duplicated",
            f"{lost} lost, {twice} duplicated",
            lost == twice == 0,
        ),
        "farm_failures_4x": goal(
            "at 4x no result of kind infra or sandbox_lost, no HTTP 5xx but 503 busy",
            _kinds(failures),
            not failures,
        ),
        "variables_4x": goal(
            "at 4x no session loses its variables", f"{forgot} lost them", forgot == 0
        ),
        "ends_4x": goal(
            "at 4x every part ends with its level (nothing hangs)",
            f"{top['hung_parts']} parts still running {top['wind_down_s']:.0f}s after the "
            f"map's end, {unanswered} HTTP requests unanswered",
            top["hung_parts"] == 0 and unanswered == 0,
        ),
    }


def _roles(roles: dict[str, Any] | None) -> str:
    """Each worker tree's PSS by role, start -> end (MB, and the count where it is not 1)."""
    if not roles:
        return ""
    parts = []
    for tree, start in roles["start"].items():
        end = roles["end"].get(tree, {})
        each = []
        for role in sorted(set(start) | set(end)):
            (a, m), (b, n) = start.get(role, [0, 0]), end.get(role, [0, 0])
            count = f" ({m} -> {n})" if (m, n) != (1, 1) else ""
            each.append(f"{role} {a >> 10} -> {b >> 10}{count}")
        parts.append(f"{tree}: " + ", ".join(each))
    return "by role, MB: " + "; ".join(parts)


def _burst(plan: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    m, s = b["map"], b["sessions"]
    items, kept = m["done"] + m["done_after"], s["done"] + s["done_after"]
    errors = {f"map {k}": n for k, n in m["errors"].items()}
    errors |= {f"sessions {k}": n for k, n in s["errors"].items()}
    errors |= {f"sessions {k}": s[k] for k in ("busy", "lost_variables") if s[k]}
    return goal(
        f"a map of {plan['burst_items']} items at concurrency {plan['burst_window']} while "
        f"{plan['burst_sessions']} sessions open at once: every item right, every session "
        "keeps its variable, no error",
        f"{items} items right ({m['lost']} lost, {m['duplicated']} duplicated), {kept} "
        f"sessions kept it; errors: {_kinds(errors)}",
        items == plan["burst_items"]
        and not m["duplicated"]
        and kept == plan["burst_sessions"]
        and not errors
        and not b["hung"],
    )


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in counts.items()) or "none"


# --- the table --------------------------------------------------------------------------------

LATENCIES = [  # label, part, latency
    ("agent run", "agent", "run"),
    ("HTTP run", "http_session", "run"),
    ("map item running", "map", "running"),
    ("map item queue_s", "map", "queue"),
    ("HTTP map item running", "http_map", "running"),
    ("HTTP map item queue_s", "http_map", "queue"),
    ("judge item running", "judge", "running"),
    ("judge item queue_s", "judge", "queue"),
    ("agent open", "agent", "open"),
    ("agent open queue_s", "agent", "open_queue"),
    ("HTTP open", "http_session", "open"),
    ("HTTP open queue_s", "http_session", "open_queue"),
]


def _ms(lat: dict[str, Any] | None) -> str:
    return f"{lat['p50_ms']:.0f}/{lat['p99_ms']:.0f}" if lat and lat["n"] else "-"


def _done(part: str) -> Callable[[dict[str, Any]], str]:
    return lambda lv: str(lv["parts"][part]["done"])


def _latency(part: str, name: str) -> Callable[[dict[str, Any]], str]:
    return lambda lv: _ms(lv["parts"][part]["latency"].get(name))


def _sum(lv: dict[str, Any], parts: tuple[str, ...], key: str) -> int:
    return sum(int(lv["parts"][p][key]) for p in parts)


def render(out: dict[str, Any]) -> str:
    m, levels = out["machine"], out["levels"]
    base = {lv["level"]: lv for lv in levels}.get(1)
    lines = [
        f"farm load  {m['date']}  host {m['host']}  {m['cpu']}  {m['cores']} cores "
        f"({m['usable_cores']} usable)  Python {m['python']}"
        + ("  (--quick)" if out["quick"] else ""),
        "capacity in boxes: "
        + "; ".join(
            f"{image} {c['boxes']} ({c['workers']} workers, binding {'/'.join(c['binding'])})"
            for image, c in out["capacity"].items()
        )
        + f"; C = {out['c']}",
        "",
        f"{'level':<32}" + "".join(f"{lv['level']}x".rjust(17) for lv in levels),
    ]

    def row(label: str, cell: Callable[[dict[str, Any]], Any]) -> None:
        lines.append(f"{label:<32}" + "".join(f"{cell(lv)}".rjust(17) for lv in levels))

    def rate(what: str) -> Callable[[dict[str, Any]], str]:
        def cell(lv: dict[str, Any]) -> str:
            ratio = f" ({lv[what] / base[what]:.2f}x)" if base and base[what] else ""
            return f"{lv[what]:.1f}{ratio}"

        return cell

    row(
        "offered: default boxes, judge",
        lambda lv: "{default_boxes}, {judge}".format(**lv["offered"]),
    )
    row("map span s (wind-down s)", lambda lv: f"{lv['span_s']:.0f} ({lv['wind_down_s']:.0f})")
    row("goodput items/s (vs 1x)", rate("items_per_s"))
    row("goodput runs/s (vs 1x)", rate("runs_per_s"))
    for part in (*ITEM_PARTS, *RUN_PARTS):
        row(f"  {part} done in span", _done(part))
    lines.append("latency p50/p99 ms")
    for label, part, name in LATENCIES:
        row(f"  {label}", _latency(part, name))
    row(
        "busy answers agent, HTTP",
        lambda lv: (
            f"{lv['parts']['agent']['busy']}, {_sum(lv, ('http_session', 'http_map'), 'busy')}"
        ),
    )
    row(
        "records lost, duplicated",
        lambda lv: f"{_sum(lv, ITEM_PARTS, 'lost')}, {_sum(lv, ITEM_PARTS, 'duplicated')}",
    )
    row("sessions that lost variables", lambda lv: _sum(lv, RUN_PARTS, "lost_variables"))
    row(
        "parts hung, HTTP unanswered",
        lambda lv: f"{lv['hung_parts']}, {_sum(lv, ('http_session', 'http_map'), 'unanswered')}",
    )
    lines.append("errors by kind")
    for lv in levels:
        errors = {f"{p} {k}": n for p, t in lv["parts"].items() for k, n in t["errors"].items()}
        lines.append(f"  {lv['level']}x: {_kinds(errors)}")
    for kind in ("rss", "pss"):
        lines += [
            "",
            f"{kind.upper() + ' MB':<32}{'start':>10}{'end':>10}{'max':>10}{'end/start':>11}",
        ]
        for name, r in out[f"{kind}_kb"].items():
            lines.append(
                f"{name:<32}{r['start'] / 1024:>10.0f}{r['end'] / 1024:>10.0f}"
                f"{r['max'] / 1024:>10.0f}{r['end'] / r['start']:>11.2f}"
            )
    start, end = out["redis_keys"]["start"], out["redis_keys"]["end"]
    lines.append(
        f"redis keys at the start {sum(start.values())}, at the end {sum(end.values())}: "
        + ", ".join(f"{kind} {start.get(kind, 0)} -> {n}" for kind, n in end.items())
    )
    lines += ["", *_render_burst(out), ""]
    for g in out["goals"].values():
        lines.append(f"{'PASS' if g['ok'] else 'FAIL'}  {g['expected']}: {g['observed']}")
    return "\n".join(lines)


def _render_burst(out: dict[str, Any]) -> list[str]:
    plan, b = out["plan"], out["burst"]
    lat = b["map"]["latency"]
    opened = b["sessions"]["latency"]
    refused = ", ".join(f"{image} {c['refused']}" for image, c in out["capacity_end"].items())
    return [
        f"burst: a map of {plan['burst_items']} items at concurrency {plan['burst_window']}, "
        f"{plan['burst_sessions']} sessions opened at once: {b['took_s']:.0f}s; p50/p99 ms: "
        f"item running {_ms(lat.get('running'))}, item queue_s {_ms(lat.get('queue'))}, open "
        f"{_ms(opened.get('open'))}, open queue_s {_ms(opened.get('open_queue'))}",
        f"boxes the kernels refused after waiting (sent again), whole run: {refused}",
    ]
